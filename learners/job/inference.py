"""GraphLearner's inference part: a saved model started for prediction, ``evaluate``, ``predict``.

:class:`Inference` is one part of :class:`learners.job.learner.GraphLearner`, given the job's
actors (:class:`learners.job.actors.JobActors`): ``GraphLearner.load(path)`` builds a learner and
calls :meth:`Inference.start` (one worker and the PS holding the saved model), or keeps a small
model in this process (:attr:`Inference.local`); ``evaluate`` and ``predict`` run on the workers
of a trained or loaded learner.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

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


class Inference:
    """Prediction and evaluation with the learner's workers; the start of a saved model."""

    def __init__(self, actors: JobActors) -> None:
        self.actors = actors
        #: GraphLearner.load: a LocalModel predicting small inputs in this process
        #: (learners/job/local_predict.py), and the saved model whose actors are not started
        self.local: Any = None
        self.saved: str | None = None

    def start(self, p: str) -> None:
        """Start one worker and the PS from the saved model in ``p`` (a directory or a URL):
        the actors take its options."""
        a = self.actors
        info = saved_model.read_extra(p)["learner"]
        conf = saved_model.inference_conf(a.conf, info, str(p))
        a.conf = conf
        a.options = options = JobOptions.from_config(conf)  # the saved model's job
        a.plan = options.loop.for_inference(str(info.get("dense_placement", "worker")))
        a.start_ray()
        data = replace(options.data, train_path=None)
        # The placement keys hold for a saved model's actors as for training's.
        layout = a.reserve()
        workers = a.workers = WorkerGroup(a.plan, data, read_data=False, layout=layout)
        size = JobSize(
            num_features=int(info["num_features"]),
            num_fields=info["num_fields"],
            batch_size=a.plan.minibatch_size,
            updates_per_epoch=0,
        )
        model = options.model.sized(size.num_features, size.num_fields)
        decls = workers.execute(
            "build", model, size, OptimizerSpec.from_conf(conf, "ml.fclayer.optimizer")
        )[0]
        saved_model.check_tables(table_specs(conf, decls), info, conf, str(p))
        a.model, a.size = model, size
        a.tables = [TableSpec.from_dict(d) for d in info["tables"]]
        a.ps_options = options.resources.ps
        a.ps = a.launch(a.tables, layout)
        a.ps.load(str(p))
        workers.attach_ps(a.ps)
        saved_model.load_dense(info, workers, str(p))

    def _predict_outs(
        self, data: str | os.PathLike[str] | InMemory, labels: Any, verb: str
    ) -> list[dict[str, Any]]:
        """Every worker's predictions of ``data`` (learners/job/predict_inputs.py)."""
        a = self.actors
        if not a.workers and self.saved is not None:
            self.start(self.saved)  # a model loaded in-process: its actors start now
        if not a.workers:
            raise RuntimeError(f"{verb}(): train() or GraphLearner.load(path) first")
        features = a.size.num_features if a.size is not None else 0
        return predict_parts(a.workers, data, labels, a.options.data, features)

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
        return jsonable(validation_metrics(self.actors.model_task(), outs))

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
        local = self.local
        if local is not None and not self.actors.workers and local.takes(data):
            return local.predict(data, labels)  # type: ignore[no-any-return]
        return in_input_order(self._predict_outs(data, labels, "predict"), with_rows=True)
