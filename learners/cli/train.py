"""The ``train`` verb of the ``angelps`` command line (predict, evaluate, submit: predict.py).

The command line registers every verb at start, so this module stays light: the learner (torch,
Ray) and pyarrow are imported inside the verbs that run them, so that the config-only verbs
(``angelps conf``, ``angelps schedule``) never load them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from angelconf.config import Config, ConfigError
from angelconf.printable import printable
from learners.cli.common import EXIT_OK, Subparsers, add_config_arguments, add_verb, load_job
from learners.cli.predict import check_input, check_out, prediction_file, write_predictions
from learners.job.action import JobAction
from learners.job.paths import absolute_paths, cannot_write, relative_notes
from learners.runs.folders import relative_under_ray_job
from learners.runs.output_file import replace_atomically

__all__ = ["register", "train_job"]


def _conf_args(p: argparse.ArgumentParser, required: bool) -> None:
    add_config_arguments(p, conf_required=required)
    p.add_argument(
        "--address",
        metavar="ADDR",
        default=None,
        help="join this Ray cluster (default: RAY_ADDRESS, else start a local Ray)",
    )


def register(sub: Subparsers) -> None:
    """Add the ``train`` sub-command."""
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
            "angelps train --angel.train.data.path data/a9a/a9a_123d_train.libsvm "
            "--ml.feature.index.range 123   (the job as keys alone, as Angel's submit)",
        ],
    )
    _conf_args(p, required=False)
    p.add_argument("--summary-json", metavar="PATH", help="write the final summary as JSON")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the checkpoint in angel.save.model.path",
    )
    p.set_defaults(func=_train)


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
    why = cannot_write(parent)
    if why is not None:
        raise ConfigError(
            f"--summary-json {name}: cannot write there ({why}); choose a folder you can write to"
        )


def _write_text(path: str, text: str) -> None:
    Path(path).write_text(text)


def _train(args: argparse.Namespace) -> int:
    conf = load_job(args)  # a bad key or value answers before torch and Ray load
    action = JobAction.from_config(conf)
    for note in relative_notes(conf, args.address):
        print(printable(note), file=sys.stderr)
    if action.action in ("predict", "evaluate"):
        raise ConfigError(
            f"action.type={action.action} ({conf.source('action.type')}) does not train: run "
            f"angelps {action.action}, or angelps submit (which follows action.type)"
        )
    return train_job(args, conf, action)


def train_job(args: argparse.Namespace, conf: Config, action: JobAction) -> int:
    """Train the job; with ``action.type=train_predict``, then predict
    ``angel.predict.data.path`` into ``angel.predict.out.path`` with the trained model (both
    paths checked before training)."""
    if args.summary_json:
        _check_summary_json(args.summary_json)  # before training, not after it
        note = relative_under_ray_job({"--summary-json": args.summary_json})
        if note:  # (under ray job submit: written into Ray's copy of the working directory)
            print(printable(note), file=sys.stderr)
    out = None
    if action.action == "train_predict":
        check_input(conf, action, "train_predict")
        out = check_out(conf, action)
    from learners.job.learner import GraphLearner  # torch and Ray: only when training
    from learners.job.loop_options import TrainPlan
    from learners.job.preflight import check_job

    # Checked as written (errors name the paths the user gave), then relative paths made
    # absolute against the command's directory, as every node must read them.
    check_job(conf, TrainPlan.from_config(conf), bool(args.resume))
    conf = absolute_paths(conf)
    action = JobAction.from_config(conf)  # its paths absolute too
    learner = GraphLearner(conf, address=args.address)
    try:
        result = learner.train(resume=bool(args.resume))
        pred = prediction_file(conf, learner, str(action.data_path)) if out is not None else None
    finally:
        learner.shutdown()
    s = result.summary  # the learner printed its last line (learners.runs.run_log.done_line)
    if args.summary_json:
        path = Path(args.summary_json)
        if path.parent != Path(""):
            path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(s, indent=2) + "\n"
        # Replaced whole (a symbolic link there is replaced, never written through).
        replace_atomically(path, lambda tmp: _write_text(tmp, text))
    if pred is not None and out is not None:
        rows = write_predictions(pred, out)
        print(printable(f"wrote {rows} predictions to {out}"), file=sys.stderr)
    return EXIT_OK
