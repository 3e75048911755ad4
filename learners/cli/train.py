"""The ``train``, ``predict`` and ``evaluate`` verbs of the ``angelps`` command line.

The command line registers every verb at start, so this module stays light: the learner (torch,
Ray) and pyarrow are imported inside the verbs that run them, so that the config-only verbs
(``angelps conf``, ``angelps schedule``) never load them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from angelps.config import ConfigError
from learners.cli.common import EXIT_OK, Subparsers, add_config_arguments, add_verb, load_job

if TYPE_CHECKING:
    from learners.learner import GraphLearner

__all__ = ["register"]


def _conf_args(p: argparse.ArgumentParser, required: bool) -> None:
    add_config_arguments(p, conf_required=required)
    p.add_argument(
        "--address",
        metavar="ADDR",
        default=None,
        help="join this Ray cluster (default: RAY_ADDRESS, else start a local Ray)",
    )


def register(sub: Subparsers) -> None:
    """Add the ``train``, ``predict`` and ``evaluate`` sub-commands."""
    p = add_verb(
        sub,
        "train",
        help="train a model described by a .properties file",
        description="Train the model of a .properties job on the parameter server: validation "
        "metrics every epoch, metrics.jsonl under angel.log.path, a checkpoint after every "
        "epoch when angel.save.model.path is set.",
        examples=[
            "angelps train --conf conf/lr_a9a.properties",
            "angelps train --conf conf/deepfm_census.properties --set ml.epoch.num=3 "
            "--summary-json out.json",
            "angelps train --conf conf/lr_a9a.properties --set angel.save.model.path=runs/lr "
            "--resume",
        ],
    )
    _conf_args(p, required=True)
    p.add_argument("--summary-json", metavar="PATH", help="write the final summary as JSON")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the checkpoint in angel.save.model.path",
    )
    p.set_defaults(func=_train)

    p = add_verb(
        sub,
        "predict",
        help="write one prediction per input row with a saved model",
        description="Load a saved model and write one prediction per input row, in input order, "
        "as CSV or Parquet (by the --out suffix): column pred (P(y=1) for binary models, the "
        "class for multi-class, the value for regression) and label when the input has labels.",
        examples=[
            "angelps predict --model runs/lr_a9a/model --input data/a9a/a9a_123d_train.libsvm "
            "--out pred.csv",
            "angelps predict --conf conf/lr_a9a.properties --model runs/lr_a9a/model "
            "--input data/a9a/a9a_123d_train.libsvm --out pred.parquet",
        ],
    )
    _conf_args(p, required=False)
    p.add_argument("--model", metavar="DIR", required=True, help="a saved model directory")
    p.add_argument("--input", metavar="PATH", required=True, help="input file or directory")
    p.add_argument("--out", metavar="PATH", required=True, help="output .csv or .parquet")
    p.set_defaults(func=_predict)

    p = add_verb(
        sub,
        "evaluate",
        help="print the metrics of a saved model on a labelled file",
        description="Load a saved model and print its metrics on a labelled input.",
        examples=[
            "angelps evaluate --model runs/lr_a9a/model --input data/a9a/a9a_123d_train.libsvm",
            "angelps evaluate --conf conf/fm_census.properties --model runs/fm/model "
            "--input data/census/census_148d_train.dummy",
        ],
    )
    _conf_args(p, required=False)
    p.add_argument("--model", metavar="DIR", required=True, help="a saved model directory")
    p.add_argument(
        "--input", metavar="PATH", required=True, help="labelled input file or directory"
    )
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    p.set_defaults(func=_evaluate)


def _check_summary_json(name: str) -> None:
    """--summary-json must name a file that can be written after training, checked before it."""
    path = Path(name)
    if path.is_dir():
        raise ConfigError(f"--summary-json {name} is a directory: expected a file name")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"--summary-json {name}: {parent} is a file, not a directory")


def _train(args: argparse.Namespace) -> int:
    if args.summary_json:
        _check_summary_json(args.summary_json)  # before training, not after it
    conf = load_job(args)  # a bad key or value answers before torch and Ray load
    from learners.learner import GraphLearner  # torch and Ray: only when training

    learner = GraphLearner(conf, address=args.address)
    try:
        result = learner.train(resume=bool(args.resume))
    finally:
        learner.shutdown()
    s = result.summary  # the learner printed its last line (learners.run_log.done_line)
    if args.summary_json:
        path = Path(args.summary_json)
        if path.parent != Path(""):
            path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(s, indent=2) + "\n")
    return EXIT_OK


def _check_paths(args: argparse.Namespace) -> None:
    if not Path(args.model).is_dir():
        raise ConfigError(f"--model {args.model}: no such model directory")
    if not Path(args.input).exists():
        raise ConfigError(f"--input {args.input}: no such file or directory")


def _loaded(args: argparse.Namespace) -> GraphLearner:
    _check_paths(args)
    conf = load_job(args)  # a bad key or value answers before torch and Ray load
    from learners.learner import GraphLearner  # torch and Ray: only when predicting

    return GraphLearner(conf, address=args.address, quiet=True).load(args.model)


def _predict(args: argparse.Namespace) -> int:
    import pyarrow as pa  # only when predicting

    out = Path(args.out)
    if out.suffix.lower() not in (".csv", ".parquet"):
        raise ConfigError(f"--out {args.out}: expected a .csv or .parquet file name")
    learner = _loaded(args)
    try:
        pred = learner.predict(args.input)
    finally:
        learner.shutdown()
    table = pa.table({k: pred[k] for k in ("pred", "label") if k in pred})
    if out.parent != Path(""):
        out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".csv":
        import pyarrow.csv as pacsv

        pacsv.write_csv(table, out)
    else:
        import pyarrow.parquet as pq

        pq.write_table(table, out)
    print(f"wrote {table.num_rows} predictions to {out}", file=sys.stderr)
    return EXIT_OK


def _evaluate(args: argparse.Namespace) -> int:
    learner = _loaded(args)
    try:
        metrics = learner.evaluate(args.input)
    finally:
        learner.shutdown()
    if args.json:
        print(json.dumps(metrics))
        return EXIT_OK
    for k, v in metrics.items():
        shown = f"{v:.6g}" if isinstance(v, float) and math.isfinite(v) else str(v)
        print(f"{k:<20} {shown}")
    return EXIT_OK
