"""The ``angelps export`` verb: a saved model as a torch state_dict, safetensors, a TorchScript
module or ONNX (learners/runs/export_formats.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from angelconf.config import ConfigError
from angelconf.printable import printable
from learners.cli.common import EXIT_OK, Subparsers, add_verb
from learners.job.paths import check_out_folder

__all__ = ["register"]

#: Default of --max-mb: a model larger than this is refused (its tables are Parquet anyway).
DEFAULT_MAX_MB = 2048.0


def register(sub: Subparsers) -> None:
    """Add the ``export`` sub-command."""
    p = add_verb(
        sub,
        "export",
        help="write a saved model as torch, safetensors, TorchScript or ONNX",
        description="Write the saved model of --model in one format (--format, else the "
        "extension of --out): torch (torch.save'd state_dict: ps.<table> rows by feature id, "
        "ps.<table>.keys/.weight for tables of unbounded keys, dense.<name> for the MLP), "
        "safetensors (weights only, named as the checkpoint names them), torchscript (a "
        "module predicting with torch alone: forward(ids [N,K] int64 padded with -1, values "
        "[N,K]) -> [N]) or onnx (the same module, needs the onnx package). No optimizer "
        "state. A model over --max-mb is refused.",
        examples=[
            "angelps export --model runs/lr_a9a/model --out lr_a9a.pt",
            "angelps export --model runs/lr_a9a/model --out lr_a9a.safetensors",
            "angelps export --model runs/deepfm_census/model --format torchscript --out deepfm.pt",
        ],
    )
    p.add_argument("--model", metavar="DIR", required=True, help="a saved model directory")
    p.add_argument("--out", metavar="FILE", required=True, help="the file to write")
    p.add_argument(
        "--format",
        metavar="FORMAT",
        default=None,
        help="torch, safetensors, torchscript or onnx, in any case (default: by the extension "
        "of --out: .pt/.pth torch, .safetensors, .onnx, .ts/.torchscript torchscript)",
    )
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
    if out.resolve().is_relative_to(model.resolve()):
        raise ConfigError(
            f"--out {args.out} is inside the model directory --model {args.model}: an export "
            "does not belong in a checkpoint; choose a path outside it"
        )
    check_out_folder(f"--out {args.out}", out.parent)
    if not args.max_mb > 0:
        raise ConfigError(f"--max-mb {args.max_mb:g} is not valid: expected a number > 0")
    from learners.runs.export_formats import export_model, format_of  # torch: only when writing

    fmt = format_of(out, args.format)  # a name that disagrees with the format: refused

    written = export_model(str(model), out, fmt, int(args.max_mb * 2**20))
    for name, shape, dtype in written:
        print(printable(f"{name:<32} {shape} {dtype}"), file=sys.stderr)
    print(printable(f"wrote {len(written)} tensors to {out} ({fmt})"), file=sys.stderr)
    return EXIT_OK
