"""The ``predict`` and ``evaluate`` verbs: Angel's flow from a job file's keys.

``angelps predict --conf job.properties`` needs nothing else: the saved model is
``angel.load.model.path``, the input ``angel.predict.data.path`` and the output
``angel.predict.out.path``; ``--model``, ``--input`` and ``--out`` override them (they are set
as those keys, after the file) (``angelps submit``: learners/cli/submit.py). Every path is checked before Ray or torch starts, and the predictions are written
to a temporary file renamed into place, so a failed job overwrites nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from angelconf.config import Config, ConfigError
from angelconf.printable import printable
from angelps.file_store import files_for
from learners.angel_keys import check_output_policy
from learners.cli.common import EXIT_OK, Subparsers, add_config_arguments, add_verb, load_job
from learners.job.action import PREDICT_OUT_FORMAT, JobAction
from learners.job.paths import absolute_paths, check_out_folder, check_url, relative_notes
from learners.runs.output_file import replace_atomically

if TYPE_CHECKING:
    import numpy as np

    from learners.job.learner import GraphLearner

__all__ = [
    "check_input",
    "check_out",
    "evaluate_job",
    "job_from_args",
    "predict_job",
    "register",
    "write_predictions",
]

_LOAD, _DATA, _OUT = "angel.load.model.path", "angel.predict.data.path", "angel.predict.out.path"
_SAVE = "angel.save.model.path"
#: The file written into an angel.predict.out.path that is a directory (Angel's layout).
PREDICTIONS_FILE = "predictions.csv"


def _common(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument(
        "--address",
        metavar="ADDR",
        default=None,
        help="join this Ray cluster (default: RAY_ADDRESS, else start a local Ray)",
    )
    p.add_argument("--model", metavar="DIR", help=f"a saved model directory (sets {_LOAD})")
    p.add_argument("--input", metavar="PATH", help=f"input file or directory (sets {_DATA})")


def register(sub: Subparsers) -> None:
    """Add the ``predict`` and ``evaluate`` sub-commands."""
    p = add_verb(
        sub,
        "predict",
        help="write one prediction per input row with a saved model",
        description=f"Load the saved model of {_LOAD} (or --model) and write one prediction "
        f"per row of {_DATA} (or --input), in input order, to {_OUT} (or --out): a .csv or "
        f".parquet file by its suffix, or a directory that gets {PREDICTIONS_FILE}. Columns: "
        "pred (P(y=1) for binary models, the class for multi-class, the value for "
        "regression) and label when the input has labels.",
        examples=[
            "angelps predict --conf conf/lr_a9a.properties "
            "--angel.load.model.path runs/lr_a9a/model "
            "--angel.predict.data.path data/a9a/a9a_123d_train.libsvm "
            "--angel.predict.out.path pred.csv",
            "angelps predict --model runs/lr_a9a/model "
            "--input data/a9a/a9a_123d_train.libsvm --out pred.parquet",
        ],
    )
    _common(p)
    p.add_argument(
        "--out", metavar="PATH", help=f"output .csv, .parquet or directory (sets {_OUT})"
    )
    p.set_defaults(func=_predict)

    p = add_verb(
        sub,
        "evaluate",
        help="print the metrics of a saved model on a labelled input",
        description=f"Load the saved model of {_LOAD} (or --model) and print its metrics on the "
        f"labelled {_DATA} (or --input), named as training's validation metrics (valid_auc, ...).",
        examples=[
            "angelps evaluate --model runs/lr_a9a/model --input data/a9a/a9a_123d_train.libsvm",
            "angelps evaluate --conf conf/fm_census.properties --angel.load.model.path runs/fm "
            "--angel.predict.data.path data/census/census_148d_train.dummy --json",
        ],
    )
    _common(p)
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    p.set_defaults(func=_evaluate)


# --- the job's paths, checked before anything starts ------------------------------------------


def job_from_args(args: argparse.Namespace) -> tuple[Config, JobAction]:
    """The job with --model/--input/--out set as the keys they stand for (after the file)."""
    flags = {_LOAD: args.model, _DATA: args.input, _OUT: getattr(args, "out", None)}
    # Relative paths mean the command's directory, also for actors on other nodes.
    conf = load_job(args, [f"{k}={v}" for k, v in flags.items() if v is not None])
    # (an error then names the option typed: "angel.predict.out.path=/x.csv (--out)")
    for key, flag in ((_LOAD, "--model"), (_DATA, "--input"), (_OUT, "--out")):
        if flags[key] is not None:
            conf = conf.with_overrides({key: conf[key]}, flag)
    for note in relative_notes(conf, args.address):
        print(printable(note), file=sys.stderr)
    conf = absolute_paths(conf)
    return conf, JobAction.from_config(conf)


def _shown(conf: Config, key: str) -> str:
    """``key=value (where it was set)`` for an error line."""
    return f"{key}={conf[key]} ({conf.source(key)})"


def check_model(conf: Config, action: JobAction, verb: str) -> str:
    """The saved model's directory: set and present, else a ConfigError naming the key."""
    if action.model_path is None:
        raise ConfigError(
            f"{_LOAD} is not set: {verb} needs a saved model "
            f"(--{_LOAD} DIR, --model DIR or {_LOAD} in the job file)"
        )
    if check_url(conf, _LOAD):
        return action.model_path
    if not Path(action.model_path).is_dir():
        from angelps.checkpoint.local_dir import older_hint  # (a save's .prev beside it)

        raise ConfigError(
            f"{_shown(conf, _LOAD)}: no saved model there (no such directory)"
            + older_hint(action.model_path)
        )
    return action.model_path


def check_input(conf: Config, action: JobAction, verb: str) -> str:
    """The input of prediction or evaluation: set and present."""
    if action.data_path is None:
        raise ConfigError(
            f"{_DATA} is not set: {verb} needs an input "
            f"(--{_DATA} PATH, --input PATH or {_DATA} in the job file)"
        )
    if check_url(conf, _DATA):
        return action.data_path
    if not Path(action.data_path).exists():
        raise ConfigError(f"{_shown(conf, _DATA)}: no such file or directory")
    return action.data_path


def check_out(conf: Config, action: JobAction) -> Path | str:
    """The file the predictions go to: a .csv/.parquet name whose directory exists and is
    writable, or a directory (created when its parent exists) that gets predictions.csv; on
    object storage, a URL in a bucket that answers (one object, written whole)."""
    if action.out_path is None:
        raise ConfigError(
            f"{_OUT} is not set: prediction needs an output "
            f"(--{_OUT} FILE.csv, --out FILE.csv or {_OUT} in the job file)"
        )
    _check_apart(conf, action)
    check_output_policy(conf, _OUT)
    if check_url(conf, _OUT):
        url = action.out_path.rstrip("/")
        return url if url.lower().endswith((".csv", ".parquet")) else f"{url}/{PREDICTIONS_FILE}"
    out = Path(action.out_path)
    is_file = out.suffix.lower() in (".csv", ".parquet")
    if is_file and out.is_dir():
        raise ConfigError(f"{_shown(conf, _OUT)} is a directory: expected a .csv or .parquet name")
    if not is_file and out.exists() and not out.is_dir():
        raise ConfigError(
            f"{_shown(conf, _OUT)} is a file without a .csv or .parquet suffix: name a .csv or "
            ".parquet file, or a directory"
        )
    check_out_folder(_shown(conf, _OUT), out.parent if is_file or not out.is_dir() else out)
    if not is_file and out.suffix and not out.exists():
        # (pred.txt, pred.json: most likely meant as a file, and taken as Angel's folder)
        print(
            printable(
                f"angelps: note: {_shown(conf, _OUT)} has no .csv or .parquet suffix: it is "
                f"made a folder (Angel's layout) and the predictions go to "
                f"{out / PREDICTIONS_FILE}"
            ),
            file=sys.stderr,
        )
    return out if is_file else out / PREDICTIONS_FILE


def _remote(path: str) -> bool:
    """Whether ``path`` is on object storage (no path on this machine's disk)."""
    return files_for(path).disk_path(path) is None


def _target(out: str) -> str:
    """The file that angel.predict.out.path ``out`` writes (as :func:`check_out` returns it): a
    .csv/.parquet name itself, another name's predictions.csv; a URL without its trailing /."""
    if _remote(out):
        url = out.rstrip("/")
        return url if url.lower().endswith((".csv", ".parquet")) else f"{url}/{PREDICTIONS_FILE}"
    path = files_for(out).disk_path(out) or Path(out)
    is_file = path.suffix.lower() in (".csv", ".parquet") or path.is_file()
    return os.path.realpath(path if is_file else path / PREDICTIONS_FILE)


def _same(target: str, other: str) -> bool:
    """Whether the file ``target`` (:func:`_target`) is the file ``other`` names: the same
    resolved path or the same file on the disk (a hard link, a link); URLs as strings."""
    if _remote(target) or _remote(other):
        return _remote(target) and _remote(other) and target == other.rstrip("/")
    path = os.path.realpath(files_for(other).disk_path(other) or other)
    if path == target:
        return True
    try:
        return os.path.samefile(target, path)
    except OSError:  # (one of them does not exist)
        return False


def _inside(target: str, folder: str) -> bool:
    """Whether the file ``target`` (:func:`_target`) lies under the directory ``folder`` (at
    any depth; resolved, or the same directory on the disk as one of its parents); URLs as
    strings."""
    if _remote(target) or _remote(folder):
        return _remote(target) and _remote(folder) and target.startswith(folder.rstrip("/") + "/")
    top = os.path.realpath(files_for(folder).disk_path(folder) or folder)
    if os.path.commonpath([target, top]) == top and target != top:
        return True
    if not os.path.isdir(top):
        return False
    for parent in Path(target).parents:
        try:
            if os.path.samefile(parent, top):
                return True
        except OSError:  # (not there)
            continue
    return False


def _check_apart(conf: Config, action: JobAction) -> None:
    """ConfigError when angel.predict.out.path would write over the input (the same file, or
    a file inside an input directory, read as data next time), into the saved model that
    predicts, or (train_predict) into the checkpoint that training writes."""
    assert action.out_path is not None
    target = _target(action.out_path)
    data = action.data_path
    if data and _same(target, data):
        raise ConfigError(
            f"{_shown(conf, _OUT)} is the input {_shown(conf, _DATA)}: predictions would "
            "replace the data; choose another file"
        )
    if data and _inside(target, data):
        raise ConfigError(
            f"{_shown(conf, _OUT)} writes into the input directory {_shown(conf, _DATA)}: the "
            "predictions would be read as data next time; choose a path outside it"
        )
    models = [(_LOAD, action.model_path, "the model directory")]
    if action.action == "train_predict":
        save = conf[_SAVE] if _SAVE in conf else None
        models.append((_SAVE, save, "the model directory that training saves to"))
    for key, model, what in models:
        if model and (_same(target, model) or _inside(target, model)):
            raise ConfigError(
                f"{_shown(conf, _OUT)} writes into {what} {_shown(conf, key)}: predictions "
                "do not belong in a checkpoint; choose a path outside it"
            )


def prediction_file(conf: Config, learner: GraphLearner, data: str) -> dict[str, np.ndarray]:
    """The columns of the prediction file of ``data`` (learners/runs/predict_output.py): the
    layout of angel.predict.out.format, the sample ids of ml.data.sid=true."""
    from learners.runs.predict_output import prediction_columns, read_sids

    pred = learner.predict_rows(data)
    sids = read_sids(data) if learner.options.data.sid else None
    task = learner.options.model.entry.task
    return prediction_columns(pred, task, str(PREDICT_OUT_FORMAT.read(conf)), sids)


def write_predictions(pred: Mapping[str, np.ndarray], out: Path | str) -> int:
    """The columns of ``pred`` (:func:`prediction_file`; a plain prediction: pred, label) as
    CSV or Parquet by ``out``'s suffix, written to a temporary file renamed into place (a URL:
    one object, written whole); the number of rows."""
    from learners.runs.predict_output import as_table  # pyarrow: only when predicting

    if isinstance(out, str):
        return _write_url(as_table(pred), out)
    out.parent.mkdir(exist_ok=True)  # a directory output whose parent exists (checked)
    table = as_table(pred)

    def write(tmp: str) -> None:
        if out.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, tmp)
        else:
            import pyarrow.csv as pacsv

            pacsv.write_csv(table, tmp)

    replace_atomically(out, write)
    return int(table.num_rows)


def _write_url(table: Any, url: str) -> int:
    """``table`` as one object at ``url`` (object storage has no rename: a PUT is atomic)."""
    import pyarrow as pa

    from angelps import fs

    sink = pa.BufferOutputStream()
    if url.lower().endswith(".parquet"):
        import pyarrow.parquet as pq

        pq.write_table(table, sink)
    else:
        import pyarrow.csv as pacsv

        pacsv.write_csv(table, sink)
    fs.write_bytes(url, sink.getvalue())
    return int(table.num_rows)


# --- the verbs ------------------------------------------------------------------------------


def _loaded(conf: Config, model: str, address: str | None) -> GraphLearner:
    from learners.job.learner import GraphLearner  # torch and Ray: only when predicting

    return GraphLearner.load(model, conf, address=address, quiet=True)


def predict_job(conf: Config, action: JobAction, address: str | None) -> int:
    """Predict ``angel.predict.data.path`` with the model of ``angel.load.model.path``."""
    model, data = check_model(conf, action, "predict"), check_input(conf, action, "predict")
    out = check_out(conf, action)
    learner = _loaded(conf, model, address)
    try:
        pred = prediction_file(conf, learner, data)
    finally:
        learner.shutdown()
    rows = write_predictions(pred, out)
    print(printable(f"wrote {rows} predictions to {out}"), file=sys.stderr)
    return EXIT_OK


def evaluate_job(conf: Config, action: JobAction, address: str | None, as_json: bool) -> int:
    """Print the metrics of the model of ``angel.load.model.path`` on the labelled input."""
    model, data = check_model(conf, action, "evaluate"), check_input(conf, action, "evaluate")
    learner = _loaded(conf, model, address)
    try:
        metrics = learner.evaluate(data)
    finally:
        learner.shutdown()
    if as_json:
        print(json.dumps(metrics))
        return EXIT_OK
    for k, v in metrics.items():
        shown = f"{v:.6g}" if isinstance(v, float) and math.isfinite(v) else str(v)
        print(f"{k:<20} {shown}")
    return EXIT_OK


def _predict(args: argparse.Namespace) -> int:
    conf, action = job_from_args(args)
    return predict_job(conf, action, args.address)


def _evaluate(args: argparse.Namespace) -> int:
    conf, action = job_from_args(args)
    return evaluate_job(conf, action, args.address, bool(args.json))
