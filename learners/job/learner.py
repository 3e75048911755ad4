"""GraphLearner: train, evaluate and predict one model on the parameter server.

A learner is three parts, each with its own state:

* :class:`~learners.job.actors.JobActors` (``learner.actors``): the job's options and its
  actors: Ray, the placement, the workers and the shards (learners/job/actors.py);
* :class:`~learners.job.train_loop.TrainingLoop` (``learner.loop``): the epochs, the rate plan,
  validation, checkpoints, restarts and early stopping (learners/job/train_loop.py);
* :class:`~learners.job.inference.Inference` (``learner.inference``): a saved model started
  for prediction, ``evaluate`` and ``predict`` (learners/job/inference.py).

The loop and inference run on the same actors: a trained learner predicts with the workers it
trained, a loaded one with those its saved model starts.

Invariant: the job configuration is read once, here, into typed options (:class:`TrainPlan`,
``ModelConfig``, the data options, the PS's own); the workers and the loop read those.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from angelconf.config import Config, load_config
from angelconf.printable import printable
from angelps import PSOptions
from decay import StepSizeScheduler
from learners.angel_keys import angel_notes
from learners.angel_keys import resolve as resolve_angel_keys
from learners.job.actors import JobActors
from learners.job.inference import Inference
from learners.job.job_options import JobOptions
from learners.job.loop_options import TrainPlan
from learners.job.predict_inputs import InMemory
from learners.job.rate_plan import RatePlan
from learners.job.train_loop import TrainingLoop, TrainResult
from learners.keys import all_keys
from learners.models.angel_json import apply_angel_json
from learners.runs.progress import TrainProgress

__all__ = ["GraphLearner", "TrainResult"]


class GraphLearner:
    """Train, evaluate and predict one model on the parameter server.

    ``GraphLearner(conf)`` takes a loaded :class:`~angelconf.config.Config`, a mapping of keys
    to values, or the path of a ``.properties`` job file; :meth:`from_properties` loads one
    from a file plus overrides.
    """

    def __init__(
        self,
        conf: Config | Mapping[str, Any] | str | os.PathLike[str],
        address: str | None = None,
        quiet: bool = False,
    ) -> None:
        if isinstance(conf, (str, os.PathLike)):
            conf = load_config(conf, (), all_keys())
            _say_notes(conf, quiet)
        elif not isinstance(conf, Config):
            if not isinstance(conf, Mapping):
                raise TypeError(
                    f"GraphLearner: expected a Config, a mapping of keys to values or the path "
                    f"of a .properties file, got {type(conf).__name__}"
                )
            conf = load_config(None, dict(conf), all_keys())
            _say_notes(conf, quiet)
        # Angel's own keys applied (idempotent), then Angel's JSON (angel.ml.conf), when named
        conf = apply_angel_json(resolve_angel_keys(conf))
        self.quiet = quiet
        #: the type of the error that ended the last train(), None after one that succeeded
        self._train_failed: str | None = None
        self.actors = JobActors(conf, address, quiet)
        self.loop = TrainingLoop(self.actors, quiet)
        self.inference = Inference(self.actors)

    @classmethod
    def from_properties(
        cls,
        path: str | os.PathLike[str] | None,
        overrides: Mapping[str, Any] | Sequence[str] = (),
        **kw: Any,
    ) -> GraphLearner:
        """Load ``path`` (a .properties file, or None for defaults) with overrides and build a learner."""
        conf = load_config(path, overrides, all_keys())
        _say_notes(conf, bool(kw.get("quiet", False)))
        return cls(conf, **kw)

    # --- the job's options and where training stands (the parts' own) --------------------------

    @property
    def conf(self) -> Config:
        """The job's configuration (a loaded model's: with its saved ``ml.*`` settings)."""
        return self.actors.conf

    @property
    def options(self) -> JobOptions:
        """The job's options by section (learners/job/job_options.py; a loaded model's)."""
        return self.actors.options

    @property
    def plan(self) -> TrainPlan:
        return self.actors.plan

    @property
    def ps_options(self) -> PSOptions:
        return self.actors.ps_options

    @property
    def address(self) -> str | None:
        return self.actors.address

    @property
    def rates(self) -> RatePlan | None:
        """The rate plan of the job (None before ``train`` builds it)."""
        return self.loop.rates

    @property
    def sched(self) -> StepSizeScheduler | None:
        """The job's step-size schedule (the rate plan's main one)."""
        return self.loop.sched

    @property
    def epoch(self) -> int:
        return self.loop.epoch

    # --- training (learners/job/train_loop.py) --------------------------------------------------

    def train(self, resume: bool = False) -> TrainResult:
        """Train ``ml.epoch.num`` epochs (continuing from ``angel.save.model.path`` if ``resume``).

        Once per learner while its job's actors run: a second ``train()`` is refused before
        anything starts (its shards would take the same names), the model held stays usable."""
        if self.actors.ps is not None or self.actors.workers is not None:
            if self._train_failed is not None:
                raise RuntimeError(
                    f"train(): the last train() failed ({self._train_failed}) and its job's "
                    "actors still run; call shutdown() first, then train again"
                )
            raise RuntimeError(
                "train(): this learner already holds a trained or loaded model (predict, "
                "evaluate and save use it); to train again from the start call shutdown() "
                "first; to train on from it, save() it and train a learner with "
                "angel.load.model.path set to that path"
            )
        try:
            result = self.loop.train(resume)
        except BaseException as e:
            self._train_failed = type(e).__name__  # (what save() says after it)
            raise
        self._train_failed = None
        return result

    def validate(self) -> dict[str, Any]:
        """Validation metrics over every worker's validation part ({} when there is none)."""
        return self.loop.validate()

    # --- prediction (learners/job/inference.py) -------------------------------------------------

    def evaluate(
        self, data: str | os.PathLike[str] | InMemory, labels: Any = None
    ) -> dict[str, Any]:
        """Metrics of the current model on labelled data (:meth:`Inference.evaluate`)."""
        return self.inference.evaluate(data, labels)

    def predict(self, data: str | os.PathLike[str] | InMemory, labels: Any = None) -> Any:
        """One prediction per input row, in input order (:meth:`Inference.predict`)."""
        return self.inference.predict(data, labels)

    def predict_rows(
        self, data: str | os.PathLike[str] | InMemory, labels: Any = None
    ) -> dict[str, np.ndarray]:
        """The predictions as columns: ``pred``, ``label``, ``row_index``, ``proba``
        (:meth:`Inference.predict_rows`)."""
        return self.inference.predict_rows(data, labels)

    # --- saved models ---------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Save the trained model (PS tables, worker-side layers, scheduler) to ``path``."""
        if self._train_failed is not None and (
            self.actors.ps is None or self.actors.workers is None
        ):
            raise RuntimeError(
                f"save(): the last train() failed ({self._train_failed}); nothing to save: fix "
                "its cause and train again, or load a checkpoint"
            )
        if self.actors.ps is None:
            raise RuntimeError("save(): nothing trained or loaded yet")
        if self.actors.workers is None:  # (a failed train() stopped them; its error said why)
            raise RuntimeError(
                "save(): the job's workers were stopped by the failure of the last train(); "
                "nothing to save: train again, or load a checkpoint"
            )
        self.loop.checkpoint(str(path), self.loop.epoch, TrainProgress())

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        conf: Config | Mapping[str, Any] | None = None,
        *,
        address: str | None = None,
        quiet: bool = True,
    ) -> GraphLearner:
        """A learner holding the saved model of ``path``, ready to ``predict``/``evaluate``
        (small in-memory inputs in this process; otherwise Ray, one worker and the PS, started
        at the first call that needs them). ``conf`` (a Config or a mapping of keys) is the
        job: the model's own ``ml.*`` settings apply where it does not set them; a job whose
        model does not match the saved tables is a ConfigError naming the path."""
        learner = cls({} if conf is None else conf, address=address, quiet=quiet)
        try:
            # Small in-memory inputs predict in this process (learners/job/local_predict.py:
            # torch, so imported here, never by a training driver); anything else starts the
            # actors then.
            from learners.job.local_predict import LocalModel

            local = LocalModel.maybe(learner.conf, str(path))
            if local is not None:
                learner.inference.local, learner.inference.saved = local, str(path)
                return learner
            learner.inference.start(str(path))  # not a Path: it would mangle s3://
            return learner
        except BaseException:
            learner.shutdown()
            raise

    def shutdown(self) -> None:
        """Stop the workers and the PS; stop Ray only if this learner started it."""
        self.actors.shutdown()

    def __enter__(self) -> GraphLearner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _say_notes(conf: Config, quiet: bool) -> None:
    """What each Angel key of a job built in Python does here (learners.angel_keys)."""
    if not quiet:
        for note in angel_notes(conf):
            print(printable(f"angelps: {note}"), file=sys.stderr)
