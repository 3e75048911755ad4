"""GraphLearner's inference face: a saved model started for prediction, ``evaluate``, ``predict``.

:class:`Inference` is a base class of :class:`learners.job.learner.GraphLearner`:
``GraphLearner.load(path)`` builds a learner and calls :meth:`Inference._load` (one worker and the
PS holding the saved model); ``evaluate`` and ``predict`` run on the workers of a trained or loaded
learner. Its actors (Ray, the placement, the workers and the shards) are
:class:`learners.job.actors.JobActors`.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np

from angelconf.config import ConfigError
from angelps import OptimizerSpec, TableSpec
from learners.job import saved_model
from learners.job.actors import JobActors
from learners.job.job_options import JobOptions
from learners.job.job_size import JobSize
from learners.job.predict_inputs import InMemory, in_input_order, is_path, predict_parts
from learners.models.table_decl import table_specs
from learners.runs.metrics import validation_metrics
from learners.runs.run_log import jsonable
from learners.worker.group import WorkerGroup

__all__ = ["Inference"]

_L = TypeVar("_L", bound="Inference")


class Inference(JobActors):
    """Prediction and evaluation with the learner's workers; the start of a saved model."""

    def _load(self: _L, p: str) -> _L:
        """Start one worker and the PS from the saved model in ``p`` (a directory or a URL)."""
        info = saved_model.read_extra(p)["learner"]
        conf = saved_model.inference_conf(self.conf, info, str(p))
        self.conf = conf
        self.options = options = JobOptions.from_config(conf)  # the saved model's job
        self.plan = options.loop.for_inference(str(info.get("dense_placement", "worker")))
        self._start_ray()
        data = replace(options.data, train_path=None)
        # The placement keys hold for a saved model's actors as for training's.
        layout = self._reserve()
        workers = self._workers = WorkerGroup(self.plan, data, read_data=False, layout=layout)
        size = JobSize(
            num_features=int(info["num_features"]),
            num_fields=info["num_fields"],
            batch_size=self.plan.minibatch_size,
            updates_per_epoch=0,
        )
        model = options.model.sized(size.num_features, size.num_fields)
        decls = workers.execute(
            "build", model, size, OptimizerSpec.from_conf(conf, "ml.fclayer.optimizer")
        )[0]
        saved_model.check_tables(table_specs(conf, decls), info, conf, str(p))
        self._model, self._size = model, size
        self._tables = [TableSpec.from_dict(d) for d in info["tables"]]
        self.ps_options = options.resources.ps
        self._ps = self._launch(self._tables, layout)
        self._ps.load(str(p))
        workers.attach_ps(self._ps)
        saved_model.load_dense(info, workers, str(p))
        return self

    def _predict_outs(
        self, data: str | os.PathLike[str] | InMemory, labels: Any, verb: str
    ) -> list[dict[str, Any]]:
        """Every worker's predictions of ``data`` (learners/job/predict_inputs.py)."""
        saved = getattr(self, "_saved", None)
        if not self._workers and saved is not None:
            self._load(saved)  # a model loaded in-process: its actors start now
        if not self._workers:
            raise RuntimeError(f"{verb}(): train() or GraphLearner.load(path) first")
        features = self._size.num_features if self._size is not None else 0
        return predict_parts(self._workers, data, labels, self.options.data, features)

    def evaluate(
        self, data: str | os.PathLike[str] | InMemory, labels: Any = None
    ) -> dict[str, Any]:
        """Metrics of the current model on labelled data (a path, a pyarrow Table, a pandas
        DataFrame, or a numpy array with ``labels``; see learners/job/predict_inputs.py), named as the
        training's validation metrics: ``valid_auc``, ``valid_logloss``, ..."""
        outs = [o for o in self._predict_outs(data, labels, "evaluate") if o["rows"]]
        if not outs or any(o["labels"] is None or np.isnan(o["labels"]).all() for o in outs):
            what = data if is_path(data) else type(data).__name__
            raise ConfigError(f"{what}: evaluation needs labels (ml.data.has.label=true)")
        return jsonable(validation_metrics(self._model_task(), outs))

    def predict(self, data: str | os.PathLike[str] | InMemory, labels: Any = None) -> Any:
        """One prediction per input row, in input order: a numpy array ``[N]`` (P(y=1) for
        binary models, the class for multi-class, the value for regression); a pandas
        DataFrame with a ``pred`` column and the input's index when ``data`` is a DataFrame.
        ``data``: a path, a pyarrow Table, a pandas DataFrame or a numpy array
        (learners/job/predict_inputs.py says which columns); :meth:`predict_rows` also gives the labels.
        A model of ``GraphLearner.load`` predicts in-memory inputs of at most
        ``angel.predict.local.max.rows`` rows in this process (torch alone, no Ray:
        learners/job/local_predict.py)."""
        pred = self.predict_rows(data, labels)["pred"]
        if type(data).__module__.startswith("pandas"):
            import pandas as pd  # the caller's own: it gave a DataFrame

            return pd.DataFrame({"pred": pred}, index=getattr(data, "index", None))
        return pred

    def predict_rows(
        self, data: str | os.PathLike[str] | InMemory, labels: Any = None
    ) -> dict[str, np.ndarray]:
        """The predictions of :meth:`predict` as columns: ``pred``, ``label`` (as the input
        wrote it, when the rows have labels), each row's line position in the input
        (``row_index``) and, for multi-class models, the predicted class's probability
        (``proba``): what a prediction file is written from (learners/runs/predict_output.py)."""
        local = getattr(self, "_local", None)
        if local is not None and not self._workers and local.takes(data):
            return local.predict(data, labels)  # type: ignore[no-any-return]
        return in_input_order(self._predict_outs(data, labels, "predict"), with_rows=True)
