"""The ``submit`` verb: run what ``action.type`` says (train, predict, evaluate, train_predict),
as Angel's submit does, with every key as ``--KEY VALUE`` or in ``--conf``."""

from __future__ import annotations

import argparse

from angelconf.config import Config
from learners.cli.common import Subparsers, add_config_arguments, add_verb
from learners.cli.predict import evaluate_job, job_from_args, predict_job
from learners.cli.train import train_job
from learners.job.action import JobAction

__all__ = ["register", "run_action"]

_LOAD, _DATA, _OUT = "angel.load.model.path", "angel.predict.data.path", "angel.predict.out.path"


def register(sub: Subparsers) -> None:
    """Add the ``submit`` sub-command."""
    p = add_verb(
        sub,
        "submit",
        help="run what action.type says (train, predict, evaluate, train_predict), as Angel's submit",
        description="Angel's submit: every key as --KEY VALUE (or in --conf); action.type "
        "chooses train, predict, evaluate or train_predict (train, then predict "
        f"{_DATA} into {_OUT} with the trained model).",
        examples=[
            "angelps submit --conf conf/lr_a9a.properties --action.type train",
            "angelps submit --action.type predict "
            "--ml.model.class.name com.tencent.angel.ml.classification.LogisticRegression "
            "--angel.load.model.path runs/lr_a9a/model "
            "--angel.predict.data.path data/a9a/a9a_123d_train.libsvm "
            "--angel.predict.out.path pred.csv",
        ],
    )
    add_config_arguments(p)
    p.add_argument("--address", metavar="ADDR", default=None, help="join this Ray cluster")
    p.add_argument("--summary-json", metavar="PATH", help="training: write the summary as JSON")
    p.add_argument("--json", action="store_true", help="evaluate: print one JSON object")
    p.set_defaults(func=_submit, model=None, input=None, out=None, resume=False)


def run_action(args: argparse.Namespace, conf: Config, action: JobAction) -> int:
    """Run ``action.type``: train and train_predict in learners/cli/train.py, the others in learners/cli/predict.py."""
    if action.action == "predict":
        return predict_job(conf, action, args.address)
    if action.action == "evaluate":
        return evaluate_job(conf, action, args.address, bool(getattr(args, "json", False)))
    return train_job(args, conf, action)


def _submit(args: argparse.Namespace) -> int:
    conf, action = job_from_args(args)
    return run_action(args, conf, action)
