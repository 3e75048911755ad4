"""The ``angelps export`` verb: a saved model as one torch state_dict (learners/runs/export.py)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from angelconf.config import ConfigError
from learners.cli.common import EXIT_OK, Subparsers, add_verb

__all__ = ["register"]

#: Default of --max-mb: a model larger than this is refused (its tables are Parquet anyway).
DEFAULT_MAX_MB = 2048.0


def register(sub: Subparsers) -> None:
    """Add the ``export`` sub-command."""
    p = add_verb(
        sub,
        "export",
        help="write a saved model as one torch state_dict (PS tables and dense layers)",
        description="Write the saved model of --model as one torch.save'd state_dict: ps.<table> "
        "(rows indexed by feature id), ps.<table>.keys/.weight for tables of unbounded keys, "
        "dense.<name> for the MLP; no optimizer state. Refused above --max-mb.",
        examples=[
            "angelps export --model runs/lr_a9a/model --out lr_a9a.pt",
            "angelps export --model runs/deepfm_census/model --out deepfm.pt --max-mb 100",
        ],
    )
    p.add_argument("--model", metavar="DIR", required=True, help="a saved model directory")
    p.add_argument("--out", metavar="FILE", required=True, help="the .pt file to write")
    p.add_argument(
        "--max-mb",
        type=float,
        default=DEFAULT_MAX_MB,
        metavar="MB",
        help=f"refuse a model larger than this many MiB (default {DEFAULT_MAX_MB:g})",
    )
    p.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    model, out = Path(args.model), Path(args.out)
    if not model.is_dir():
        from angelps.checkpoint.local_dir import older_hint  # (a save's .prev beside it)

        raise ConfigError(
            f"--model {args.model}: no saved model there (no such directory)"
            + older_hint(args.model)
        )
    if out.is_dir():
        raise ConfigError(f"--out {args.out} is a directory: expected a file name")
    parent = out.parent
    if not parent.is_dir():
        raise ConfigError(f"--out {args.out}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {args.out}: the directory {parent} is not writable")
    if not args.max_mb > 0:
        raise ConfigError(f"--max-mb {args.max_mb:g} is not valid: expected a number > 0")
    from learners.runs.export import export_state_dict, write_state_dict  # torch: only here

    state = export_state_dict(str(model), int(args.max_mb * 2**20))
    write_state_dict(state, out)
    for k, v in state.items():
        print(f"{k:<32} {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}", file=sys.stderr)
    print(f"wrote {len(state)} tensors to {out}", file=sys.stderr)
    return EXIT_OK
