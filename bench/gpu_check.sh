#!/usr/bin/env bash
# The GPU check of angelps, on a machine with one CUDA GPU, from the repo root (Ray, torch with
# CUDA and pytest installed; a few minutes):
#
#   bash bench/gpu_check.sh [OUT_DIR]          # default runs/gpu-check
#
# 1. the gpu-marked tests (tests/**: `pytest -m gpu`);
# 2. the whole suite but the slow tier (the default suite and the e2e tier), in parallel where
#    pytest-xdist is installed (-n 6), else the test files whose code paths change on a CUDA
#    machine;
# 3. the feed suite's FM on the GPU (bench/train_throughput.py --device cuda): plain PyTorch
#    with its table on the GPU, every row on a shard, the tables on the GPU, a device tier at
#    10%; where py-spy is on the PATH, profiles of the worker and shard (every thread, idle
#    included) of the tier and of the tables held whole while they train (PROFILE_SYSTEMS);
# 4. a device tier's host work a step on this node's CPU, and the shard's (bench/tier_host.py);
# 5. a device tier's pipeline under a GPU's step without Ray (bench/tier_pipeline.py --device
#    cuda): one swap in flight against two, alternated; then eviction by frequency.
#
# Logs, the results' JSON and the profiles go to OUT_DIR; the last lines of each are printed.
# Set GPU_CHECK_SKIP to a comma list of gpu,suite,feed,host,pipeline to skip parts; FEED_BASE to a copy of
# the code before a change to measure it against this tree on the same GPU (feed_ab.json);
# PROFILE_GIL to profile the worker's thread holding the GIL as well; TORCH_PROFILE to run
# torch's profiler over 40 updates of held and tier10 (feed_torch_profile.json: operators and
# CUDA runtime calls per update); GPU_CHECK_TAR to a path to pack OUT_DIR into one .tgz there.
set -u
out=${1:-runs/gpu-check}
mkdir -p "$out"
skip=",${GPU_CHECK_SKIP:-},"
export PYTHONUNBUFFERED=1 RAY_DEDUP_LOGS=0 RAY_USAGE_STATS_ENABLED=0
t0=$(date +%s)
since() { echo "$(($(date +%s) - t0)) s"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || exit 1
python3 -c "import torch, ray; print('torch', torch.__version__, 'ray', ray.__version__, 'cuda', torch.cuda.is_available())"

if [[ $skip != *,gpu,* ]]; then
  timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=long -rfE tests \
    > "$out/gpu_tests.txt" 2>&1
  echo "gpu tests: rc=$? at $(since)"
  grep -E "^(FAILED|ERROR)|passed|failed" "$out/gpu_tests.txt" | tail -20
fi

if [[ $skip != *,suite,* ]]; then
  # (the job-submission and multi-node tests start Ray's CLI from beside the interpreter:
  # where Ray was installed as a bare package, without it, a `ray` script is put there)
  py=python3
  py_exe=$(python3 -c 'import sys; print(sys.executable)')
  py_dir=$(dirname "$py_exe")
  if [[ ! -x $py_dir/ray ]]; then
    if [[ -w $py_dir ]] && python3 -c "import ray.scripts.scripts" 2>/dev/null; then
      printf '#!%s\nfrom ray.scripts.scripts import main\nmain()\n' "$py_exe" \
        > "$py_dir/ray" && chmod +x "$py_dir/ray" && echo "wrote $py_dir/ray (Ray's CLI)"
    fi
    [[ -x $py_dir/ray ]] || echo "warning: no ray CLI in $py_dir: the tests that start a Ray" \
      "head (tests/ops/test_job_submit.py, tests/learners/test_multinode.py, a test of" \
      "tests/faults/test_hangs.py) will error; install Ray into this interpreter's environment"
  fi
  ignore=()
  if ! "$py" -c "import moto, gcp_storage_emulator" 2>/dev/null; then
    # (the S3 and GCS emulators of the test extra: where they are not installed, the test
    # files that start them are left out, said here, rather than failing by the dozen)
    for f in $(grep -rl "from tests.object_store import" tests); do ignore+=(--ignore "$f"); done
    echo "no moto or gcp-storage-emulator: leaving out $((${#ignore[@]} / 2)) object-storage test files"
  fi
  if "$py" -c "import xdist" 2>/dev/null; then
    # (each test module starts its own Ray: 14 at once on 16 cores ended in errors and
    # failures, 7 passed (304 s on an H200 machine); 2 on 2 cores pass, 372 s against 602 s
    # one after another)
    args=(-m "not slow and not gpu" -n 6 --dist loadfile "${ignore[@]}" tests)
  else
    args=(tests/learners/test_device_tier.py tests/learners/test_sparse_placement.py
      tests/learners/test_device.py tests/learners/test_device_dedup.py tests/angelps/test_gpu.py
      tests/learners/test_device_tier_job.py tests/test_cli.py)
  fi
  # -v: each test's outcome is written as it ends (the summary's tracebacks come only at the
  # end, and a run cut off by a time limit loses them); -rfE: the reasons, at the end
  timeout 900 "$py" -m pytest -v -p no:cacheprovider --tb=short -rfE "${args[@]}" \
    > "$out/suite.txt" 2>&1
  echo "suite: rc=$? at $(since)"
  grep -E "(FAILED|ERROR) tests/|^(FAILED|ERROR)|passed|failed" "$out/suite.txt" | tail -40
fi

if [[ $skip != *,feed,* ]]; then
  # (-held-saveinline: the checkpoint after each epoch written before training goes on, the
  # default's background write's counterpart: the job's elapsed_s and checkpoint_wait_s)
  # (-tier10t1: the tier with its swaps' row work at the shard on one thread, against tier10's
  # default, a quarter of the node's cores: angel.ps.swap.threads; -tier10lfu: eviction by
  # frequency, 17% fewer rows swapped a step than tier10's recency, where the shard's swap
  # work bounds the step)
  systems=${FEED_SYSTEMS:-torch,angelps-bsp-w1s1,angelps-bsp-w1s1-held,angelps-bsp-w1s1-held-saveinline,angelps-bsp-w1s1-tier10,angelps-bsp-w1s1-tier10t1,angelps-bsp-w1s1-tier10lfu}
  python3 bench/train_throughput.py --suite feed --models FM --device cuda --threads 4 \
    --timeout 120 --systems "$systems" --out "$out/feed_cuda.json" > "$out/feed_cuda.txt" 2>&1
  echo "feed: rc=$? at $(since)"
  grep -E '^\[|\|' "$out/feed_cuda.txt" | tail -12
  if [[ -n ${FEED_BASE:-} ]]; then
    # The code before a change against this tree, interleaved (FEED_ROUNDS rounds of
    # FEED_AB_SYSTEMS, base first), into one JSON: FEED_BASE is a copy of that code, e.g.
    # `mkdir -p runs/base && git archive REV angelconf decay angelps learners 'bench/*.py' |
    # tar x -C runs/base` (about 2 MB; the bench imports the code beside the script it runs,
    # and the feed suite's data is generated there the first time).
    ab_systems=${FEED_AB_SYSTEMS:-angelps-bsp-w1s1-held,angelps-bsp-w1s1-tier10}
    for round in $(seq "${FEED_ROUNDS:-2}"); do
      for side in base this; do
        tree=.; [[ $side == base ]] && tree=$FEED_BASE
        python3 "$tree/bench/train_throughput.py" --suite feed --models FM --device cuda \
          --threads 4 --timeout 120 --systems "$ab_systems" \
          --out "$out/ab_${side}_$round.json" > /dev/null 2>&1
        echo "feed $side, round $round: rc=$? at $(since)"
      done
    done
    python3 - "$out" <<'PY' || true
import glob, json, os, sys
runs = []
for f in sorted(glob.glob(os.path.join(sys.argv[1], "ab_*.json"))):
    side, n = os.path.basename(f)[3:-5].split("_")
    for r in json.load(open(f)).get("results", []):
        runs.append({"side": side, "round": int(n), **r})
        print(side, n, r["case"]["system"], round(r.get("steady_samples_per_s") or 0),
              {k: round(v, 2) for k, v in (r.get("phase_ms") or {}).items()},
              {k: round(r[k], 2) for k in r if k.startswith(("tier_wait", "tier_ahead", "shard_"))})
    os.remove(f)
json.dump({"runs": runs}, open(os.path.join(sys.argv[1], "feed_ab.json"), "w"), indent=1)
PY
  fi
  if [[ -n ${TORCH_PROFILE:-} ]]; then
    # torch's profiler over 40 updates of the worker's training thread of each system
    # (angel.worker.profile.updates): its operators and CUDA runtime calls per update
    prof_systems=${TORCH_PROFILE_SYSTEMS:-angelps-bsp-w1s1-held-prof,angelps-bsp-w1s1-tier10-prof}
    python3 bench/train_throughput.py --suite feed --models FM --device cuda --threads 4 \
      --timeout 120 --systems "$prof_systems" --out "$out/feed_torch_profile.json" \
      > "$out/feed_torch_profile.txt" 2>&1
    echo "torch profile: rc=$? at $(since)"
    python3 - "$out/feed_torch_profile.json" <<'PY' || true
import json, sys
for r in json.load(open(sys.argv[1])).get("results", []):
    p = r.get("worker_profile") or {}
    print(r["case"]["system"], "ops/update", round(p.get("ops_per_update", 0)),
          "self CPU us/update", round(p.get("self_cpu_us_per_update", 0)),
          "CUDA runtime", {k: round(v, 1) for k, v in p.get("cuda_runtime_calls_per_update", {}).items()})
    print("\n".join(p.get("table", [])[:25]))
PY
  fi
  # (each system's ms a step by phase and, for a tier, what its training thread waited for)
  python3 - "$out/feed_cuda.json" <<'PY' || true
import json, sys
for r in json.load(open(sys.argv[1])).get("results", []):
    ph, n = r.get("phase_ms") or {}, r["case"]["system"]
    if not ph:
        continue
    parts = " ".join(f"{k[:-2]} {v:.2f}" for k, v in ph.items())
    wait = r.get("tier_wait_ms")
    # (of the tier's wait, the shards' answers waited for by the training thread itself; the
    # update thread's own waits for them beside it)
    parts += "" if wait is None else (f"; tier_wait {wait:.2f} (shards {r.get('tier_wait_shards_ms', 0):.2f}),"
                                      f" update thread's wait for the shards {r.get('tier_ahead_wait_ms', 0):.2f},"
                                      f" wait for the update thread's queue {r.get('tier_wait_update_ms', 0):.2f}")
    if r.get("shard_swap_ms"):  # (the shards' own work for the tier's swaps, an update)
        parts += f"; the shards' swap work {r['shard_swap_ms']:.2f}"
    print(f"{n}: ms a step {parts}")
    s = r.get("summary") or {}
    print(f"{n}: job {s.get('elapsed_s', 0):.2f} s, waited for checkpoints "
          f"{s.get('checkpoint_wait_s', 0):.2f} s")
PY
  if command -v py-spy > /dev/null; then
    # Longer runs of one system each (SYSTEM:EPOCHS), its worker and shard profiled 6 s into
    # training (the actors of this run, not those of the last one still shutting down).
    for run in ${PROFILE_SYSTEMS:-angelps-bsp-w1s1-tier10:30 angelps-bsp-w1s1-held:60}; do
      system=${run%%:*} tag=${run%%:*}
      tag=${tag##*-}
      old=" $(pgrep -d ' ' -f 'ray::(WorkerActor|ShardServer)') "
      python3 bench/train_throughput.py --suite feed --models FM --device cuda --threads 4 \
        --timeout 120 --epochs "${run##*:}" --systems "$system" \
        --out "$out/profiled_$tag.json" > "$out/profiled_$tag.txt" 2>&1 &
      newest() { for p in $(pgrep -f "$1"); do [[ $old == *" $p "* ]] || { echo "$p"; return; }; done; }
      w= s=
      for _ in $(seq 120); do
        w=$(newest 'ray::WorkerActor') s=$(newest 'ray::ShardServer')
        [[ -n $w && -n $s ]] && break
        sleep 0.5
      done
      sleep 14 # (the job's start: its first steps come about 13 s after the actors)
      for p in "worker:$w" "shard:$s"; do
        py-spy record -p "${p#*:}" -d 6 -r 250 -f raw --threads --idle \
          -o "$out/profile_${tag}_${p%%:*}.txt" > /dev/null 2>&1 &
      done
      if [[ -n ${PROFILE_GIL:-} ]]; then
        # (the same 6 s of the worker, only the thread holding the GIL: the profile above
        # counts a thread waiting for the GIL as busy on its line)
        py-spy record -p "$w" -d 6 -r 250 -f raw --threads --gil \
          -o "$out/profile_${tag}_worker_gil.txt" > /dev/null 2>&1 &
      fi
      wait
      echo "profile $system: at $(since)"
    done
  fi
fi

if [[ $skip != *,host,* ]]; then
  # The device tier's host work a step on this node's CPU (bench/tier_host.py: the update
  # thread's ask, room and placement, the shard's own swap work on 1 and 4 threads, the staged
  # read): how much of the tier's chain between two swaps is the worker's host work here.
  for t in 1 4; do
    python3 bench/tier_host.py --threads "$t" \
      --json "$out/tier_host_t$t.json" > /dev/null 2>&1
    echo "tier host work, $t swap threads: rc=$? at $(since)"
    # (the update thread's phases, then the shard's swaps replayed in parts: checks, split,
    # the write-backs before the answer, the reads, those after)
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: round(v, 2) for k, v in d['ms'].items()}); print('shard parts', {k: round(v, 2) for k, v in d.get('shard_parts_ms', {}).items()})" \
      "$out/tier_host_t$t.json" || true
  done
fi

if [[ $skip != *,pipeline,* ]]; then
  # The tier's rows on this GPU, the shard on a thread beside, the training thread's forward
  # and backward a wait of 6 ms (2.5 of it host work): how long a step takes with one swap in
  # flight and with two (learners/worker/held_tables.py), and what the training thread waits for.
  for t in 1 4; do
    python3 bench/tier_pipeline.py --device cuda --threads "$t" --host-ms 2.5 --rounds 2 \
      --json "$out/tier_pipeline_t$t.json" > "$out/tier_pipeline_t$t.txt" 2>&1
    echo "tier pipeline, $t swap threads: rc=$? at $(since)"
    tail -4 "$out/tier_pipeline_t$t.txt"
  done
  # (eviction by frequency: fewer misses, so less of the shard's work a step, for the count
  # of each read in the update thread: whether lfu should be a GPU node's default)
  python3 bench/tier_pipeline.py --device cuda --threads 4 --host-ms 2.5 --rounds 1 \
    --eviction lfu --json "$out/tier_pipeline_t4_lfu.json" > "$out/tier_pipeline_t4_lfu.txt" 2>&1
  echo "tier pipeline, lfu, 4 swap threads: rc=$? at $(since)"
  tail -2 "$out/tier_pipeline_t4_lfu.txt"
fi

# Everything above in one archive, where only a few files can be taken off the machine.
if [[ -n ${GPU_CHECK_TAR:-} ]]; then
  tar czf "$GPU_CHECK_TAR" -C "$out" . && echo "packed $out into $GPU_CHECK_TAR"
fi
