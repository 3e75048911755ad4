# Shared by the launcher scripts: create or reuse .venv and install the project into it.
# Usage: source scripts/_env.sh; ensure_venv [extras]
# Whether an install stamp HAVE ("HASH-EXTRAS") is of requirements HASH with every extra of
# EXTRAS (comma-separated) installed.
_stamp_covers() {
  local have="$1" hash="$2" extras="$3" e
  [ "${have%%-*}" = "$hash" ] || return 1
  local installed=",${have#*-},"
  for e in ${extras//,/ }; do
    case "$installed" in *",$e,"*) ;; *) return 1 ;; esac
  done
  return 0
}

ensure_venv() {
  local extras="${1:-}"
  local py="${PYTHON:-python3}"
  if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    echo "angelps needs Python >= 3.10 (set PYTHON=/path/to/python3.11)" >&2
    return 2
  fi
  if [ ! -x .venv/bin/python ]; then
    echo "creating .venv" >&2
    "$py" -m venv .venv
  fi
  # Reinstall only when the project's requirements changed since the last install, or extras
  # not installed then are asked for now (scripts/test's extras hold quickstart's: running the
  # two in turn reinstalled every time).
  local stamp=".venv/.angelps-installed"
  local hash want have
  hash="$(cat pyproject.toml | sha256sum | cut -c1-16)"
  want="${hash}-${extras}"
  have="$(cat "$stamp" 2>/dev/null || true)"
  if ! _stamp_covers "$have" "$hash" "$extras"; then
    echo "installing angelps${extras:+[$extras]} into .venv (first run takes a few minutes)" >&2
    .venv/bin/python -m pip install -q --upgrade pip >&2
    # A pinned CPU-capable torch first: an unpinned one would pull a multi-GB CUDA build.
    if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
      .venv/bin/python -m pip install -q "torch==${ANGELPS_TORCH_VERSION:-2.13.0}" >&2
    fi
    .venv/bin/python -m pip install -q -e ".${extras:+[$extras]}" >&2
    echo "$want" > "$stamp"
  fi
}
