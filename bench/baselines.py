"""What a user would pick instead of angelps, each training the same FM / DeepFM on the same rows.

- ``torch``: plain PyTorch in one process: ``nn.Embedding`` tables and ``torch.optim.SGD``
  (momentum) over the whole model, every step.
- ``torch_sparse``: plain PyTorch in one process doing the parameter server's math without Ray:
  dedup the batch's ids, gather those rows, update only them (lazy momentum, as a PS shard does).
  This is the model angelps trains, so it is the ceiling for angelps's samples/s.
- ``ray_train``: Ray Train's ``TorchTrainer``, 2 workers, DDP over gloo, each worker half of the
  global batch.
- ``ray_ps``: a port of the parameter-server example in Ray's docs (one actor holds the whole
  model; each step every worker pulls all weights, computes gradients on its half batch, and the
  actor applies their mean and returns the new weights).

All of them: rows ``[n, fields]`` of 0-based ids, labels in {0, 1}, log loss (mean over the global
batch), SGD with momentum 0.9, embeddings ``N(0, 0.01²)``, linear weights and bias 0; validation
AUC after every epoch, its time not counted as training time.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from synthetic import auc
from torch import nn

__all__ = ["Data", "EpochRecord", "load_dummy", "run_baseline"]


@dataclass
class Data:
    """Training and validation rows of fixed-field data."""

    train_ids: np.ndarray
    train_y: np.ndarray
    valid_ids: np.ndarray
    valid_y: np.ndarray
    num_ids: int

    @property
    def fields(self) -> int:
        return int(self.train_ids.shape[1])


def split(ids: np.ndarray, y: np.ndarray, ratio: float, num_ids: int) -> Data:
    """angelps's split: row i is validation iff ``i % ceil(1/ratio) == 0``."""
    every = math.ceil(1.0 / ratio)
    valid = np.arange(len(y)) % every == 0
    return Data(ids[~valid], y[~valid], ids[valid], y[valid], num_ids)


def load_dummy(path: str | Path, ratio: float = 0.1) -> Data:
    """Angel's dummy format (``label id id ...``, 0-based ids, label -1/+1 or 0/1)."""
    rows = [line.split() for line in Path(path).read_text().splitlines() if line.strip()]
    y = (np.array([float(r[0]) for r in rows]) > 0).astype(np.float32)
    ids = np.array([[int(t) for t in r[1:]] for r in rows], dtype=np.int64)
    return split(ids, y, ratio, int(ids.max()) + 1)


# --- the model ---------------------------------------------------------------------------------


class FMNet(nn.Module):
    """FM (``b + Σ w + Σ_{f<g} <v_f, v_g>``) plus, for DeepFM, an MLP over the concatenated v_f.

    ``forward`` takes the looked-up rows, so the same module serves dense tables and gathered rows.
    """

    def __init__(self, fields: int, rank: int, hidden: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(1))
        layers: list[nn.Module] = []
        width = fields * rank
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.mlp = nn.Sequential(*layers, nn.Linear(width, 1)) if hidden else None

    def forward(self, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # w: [B, F], v: [B, F, k]
        s = v.sum(dim=1)
        inter = 0.5 * (s.pow(2).sum(dim=1) - v.pow(2).sum(dim=(1, 2)))
        out = self.bias + w.sum(dim=1) + inter
        if self.mlp is not None:
            out = out + self.mlp(v.flatten(1)).squeeze(1)
        return out


class DenseFM(nn.Module):
    """FMNet with its tables as ``nn.Embedding`` (the plain-PyTorch way)."""

    def __init__(self, num_ids: int, fields: int, rank: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.w = nn.Embedding(num_ids, 1)
        self.v = nn.Embedding(num_ids, rank)
        nn.init.zeros_(self.w.weight)
        nn.init.normal_(self.v.weight, std=0.01)
        self.net = FMNet(fields, rank, hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.net(self.w(ids).squeeze(-1), self.v(ids))


@dataclass
class EpochRecord:
    epoch: int
    train_s: float
    samples: int
    valid_auc: float
    wall_s: float  # since the start of the run (start-up included)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _predict(
    model: DenseFM, ids: np.ndarray, chunk: int = 65536, device: str = "cpu"
) -> np.ndarray:
    with torch.no_grad():
        return np.concatenate(
            [
                model(torch.from_numpy(ids[i : i + chunk]).to(device)).cpu().numpy()
                for i in range(0, len(ids), chunk)
            ]
        )


def _batches(n: int, batch: int) -> list[tuple[int, int]]:
    # Every batch full-sized: one compiled shape, and no tiny last step skewing samples/s.
    return [(i, i + batch) for i in range(0, n - batch + 1, batch)]


# --- plain PyTorch -----------------------------------------------------------------------------


def train_torch(data: Data, cfg: dict[str, Any]) -> dict[str, Any]:
    torch.manual_seed(cfg.get("seed", 0))
    t0 = time.perf_counter()
    # device "cuda": the whole table and the batches in GPU memory (the GPU baseline).
    device = cfg.get("device", "cpu")
    model = DenseFM(data.num_ids, data.fields, cfg["rank"], tuple(cfg["hidden"])).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9)
    loss_fn = nn.BCEWithLogitsLoss()
    ids_t = torch.from_numpy(data.train_ids).to(device)
    y_t = torch.from_numpy(data.train_y).to(device)
    records = []
    for epoch in range(cfg["epochs"]):
        t = time.perf_counter()
        n = 0
        for lo, hi in _batches(len(y_t), cfg["batch"]):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(ids_t[lo:hi]), y_t[lo:hi])
            loss.backward()
            opt.step()
            n += hi - lo
        if device != "cpu":
            torch.cuda.synchronize()  # the epoch's kernels are done before the clock stops
        train_s = time.perf_counter() - t
        a = auc(data.valid_y, _predict(model, data.valid_ids, device=device))
        records.append(EpochRecord(epoch, train_s, n, a, time.perf_counter() - t0))
    return {"epochs": [r.to_dict() for r in records], "startup_s": 0.0}


def train_torch_sparse(data: Data, cfg: dict[str, Any]) -> dict[str, Any]:
    """The PS math in one process: dedup, gather rows, update only those rows."""
    torch.manual_seed(cfg.get("seed", 0))
    t0 = time.perf_counter()
    rank, lr, mu = cfg["rank"], cfg["lr"], 0.9
    gen = np.random.default_rng(cfg.get("seed", 0))
    w_tab = np.zeros((data.num_ids, 1), dtype=np.float32)
    v_tab = (gen.standard_normal((data.num_ids, rank), dtype=np.float32) * 0.01).astype(np.float32)
    w_mom = np.zeros_like(w_tab)
    v_mom = np.zeros_like(v_tab)
    net = FMNet(data.fields, rank, tuple(cfg["hidden"]))
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=mu)
    loss_fn = nn.BCEWithLogitsLoss()
    mask = np.zeros(data.num_ids, dtype=bool)
    remap = np.zeros(data.num_ids, dtype=np.int64)
    records = []

    def dedup(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # O(n) presence mask + remap over the bounded id space (faster than np.unique's sort).
        flat = ids.ravel()
        mask[flat] = True
        uniq = np.flatnonzero(mask)
        mask[uniq] = False
        remap[uniq] = np.arange(len(uniq))
        return uniq, remap[flat].reshape(ids.shape)

    for epoch in range(cfg["epochs"]):
        t = time.perf_counter()
        n = 0
        for lo, hi in _batches(len(data.train_y), cfg["batch"]):
            uniq, inv = dedup(data.train_ids[lo:hi])
            w_rows = torch.from_numpy(w_tab[uniq]).requires_grad_()
            v_rows = torch.from_numpy(v_tab[uniq]).requires_grad_()
            inv_t = torch.from_numpy(inv)
            opt.zero_grad(set_to_none=True)
            logits = net(w_rows[inv_t].squeeze(-1), v_rows[inv_t])
            loss = loss_fn(logits, torch.from_numpy(data.train_y[lo:hi]))
            loss.backward()
            opt.step()
            for tab, mom, g in ((w_tab, w_mom, w_rows.grad), (v_tab, v_mom, v_rows.grad)):
                m = mom[uniq] * mu + g.numpy()
                mom[uniq] = m
                tab[uniq] -= lr * m
            n += hi - lo
        train_s = time.perf_counter() - t
        with torch.no_grad():
            vi = torch.from_numpy(data.valid_ids)
            scores = net(
                torch.from_numpy(w_tab)[vi].squeeze(-1), torch.from_numpy(v_tab)[vi]
            ).numpy()
        records.append(
            EpochRecord(epoch, train_s, n, auc(data.valid_y, scores), time.perf_counter() - t0)
        )
    return {"epochs": [r.to_dict() for r in records], "startup_s": 0.0}


# --- Ray Train ---------------------------------------------------------------------------------


def _ray_train_loop(config: dict[str, Any]) -> None:
    import ray.train
    import torch.distributed as dist
    from ray.train.torch import prepare_model

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(config["threads"])
    torch.manual_seed(config.get("seed", 0))
    data: Data = ray.get(config["data_ref"])[0]
    ids = torch.from_numpy(data.train_ids[rank::world].copy())
    y = torch.from_numpy(data.train_y[rank::world].copy())
    model = prepare_model(
        DenseFM(data.num_ids, data.fields, config["rank"], tuple(config["hidden"]))
    )
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    loss_fn = nn.BCEWithLogitsLoss()
    local = config["batch"] // world
    records = []
    first_step = None
    for epoch in range(config["epochs"]):
        dist.barrier()
        t = time.perf_counter()
        n = 0
        for lo, hi in _batches(len(y), local):
            opt.zero_grad(set_to_none=True)
            # DDP averages gradients over workers: the mean over the global batch.
            loss = loss_fn(model(ids[lo:hi]), y[lo:hi])
            loss.backward()
            opt.step()
            if first_step is None:
                first_step = time.time()
            n += (hi - lo) * world
        dist.barrier()
        train_s = time.perf_counter() - t
        if rank == 0:
            inner = model.module if hasattr(model, "module") else model
            a = auc(data.valid_y, _predict(inner, data.valid_ids))
            records.append(
                {
                    "epoch": epoch,
                    "train_s": train_s,
                    "samples": n,
                    "valid_auc": a,
                    "wall_time": time.time(),
                }
            )
    if rank == 0:
        Path(config["out"]).write_text(json.dumps({"epochs": records, "first_step": first_step}))


def train_ray_train(data: Data, cfg: dict[str, Any]) -> dict[str, Any]:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    tmp = tempfile.mkdtemp(prefix="bench-rt-")
    t_init = time.time()
    ray.init(num_cpus=2, include_dashboard=False, namespace="bench", log_to_driver=False)
    try:
        out = os.path.join(tmp, "records.json")
        data_ref = ray.put(data)
        config = {**cfg, "data_ref": [data_ref], "out": out}
        trainer = TorchTrainer(
            _ray_train_loop,
            train_loop_config=config,
            scaling_config=ScalingConfig(
                num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}
            ),
            torch_config=TorchConfig(backend="gloo"),
            run_config=RunConfig(storage_path=tmp, name="bench"),
        )
        t_fit = time.time()
        trainer.fit()
        res = json.loads(Path(out).read_text())
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    start = res["first_step"]
    epochs = []
    for r in res["epochs"]:
        epochs.append(
            {
                **{k: r[k] for k in ("epoch", "train_s", "samples", "valid_auc")},
                "wall_s": r["wall_time"] - t_init,
            }
        )
    return {"epochs": epochs, "startup_s": start - t_fit, "ray_init_s": t_fit - t_init}


# --- Ray's docs parameter-server example -------------------------------------------------------


def _weights(model: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def train_ray_ps(data: Data, cfg: dict[str, Any]) -> dict[str, Any]:
    import ray

    t_init = time.time()
    ray.init(num_cpus=2, include_dashboard=False, namespace="bench", log_to_driver=False)
    try:
        build = (data.num_ids, data.fields, cfg["rank"], tuple(cfg["hidden"]))

        @ray.remote(num_cpus=0)
        class ParameterServer:
            def __init__(self) -> None:
                torch.set_num_threads(1)
                torch.manual_seed(cfg.get("seed", 0))
                self.model = DenseFM(*build)
                self.opt = torch.optim.SGD(self.model.parameters(), lr=cfg["lr"], momentum=0.9)

            def apply_gradients(self, *gradients: list[np.ndarray]) -> dict[str, np.ndarray]:
                # The docs' example sums the workers' gradients; each is a half-batch mean, so
                # the mean of them is the global-batch gradient (the same model as the others).
                mean = [np.mean(np.stack(g), axis=0) for g in zip(*gradients, strict=True)]
                self.opt.zero_grad()
                for p, g in zip(self.model.parameters(), mean, strict=True):
                    p.grad = torch.from_numpy(g)
                self.opt.step()
                return _weights(self.model)

            def get_weights(self) -> dict[str, np.ndarray]:
                return _weights(self.model)

        @ray.remote(num_cpus=1)
        class DataWorker:
            def __init__(self, rank: int, world: int, data: Data) -> None:
                torch.set_num_threads(cfg["threads"])
                self.model = DenseFM(*build)
                self.ids = torch.from_numpy(data.train_ids[rank::world].copy())
                self.y = torch.from_numpy(data.train_y[rank::world].copy())
                self.local = cfg["batch"] // world
                self.loss_fn = nn.BCEWithLogitsLoss()
                self.pos = 0

            def steps_per_epoch(self) -> int:
                return len(_batches(len(self.y), self.local))

            def compute_gradients(self, weights: dict[str, np.ndarray]) -> list[np.ndarray]:
                self.model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
                if self.pos + self.local > len(self.y):
                    self.pos = 0
                lo, hi = self.pos, self.pos + self.local
                self.pos = hi
                self.model.zero_grad()
                self.loss_fn(self.model(self.ids[lo:hi]), self.y[lo:hi]).backward()
                return [p.grad.numpy() for p in self.model.parameters()]

        data_ref = ray.put(data)
        ps = ParameterServer.remote()
        workers = [DataWorker.remote(r, 2, data_ref) for r in range(2)]
        steps = min(ray.get([w.steps_per_epoch.remote() for w in workers]))
        current = ps.get_weights.remote()
        ray.get(current)
        startup = time.time() - t_init
        probe = DenseFM(*build)
        records = []
        for epoch in range(cfg["epochs"]):
            t = time.perf_counter()
            for _ in range(steps):
                grads = [w.compute_gradients.remote(current) for w in workers]
                current = ps.apply_gradients.remote(*grads)
            weights = ray.get(current)
            train_s = time.perf_counter() - t
            probe.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
            a = auc(data.valid_y, _predict(probe, data.valid_ids))
            records.append(
                {
                    "epoch": epoch,
                    "train_s": train_s,
                    "samples": steps * 2 * (cfg["batch"] // 2),
                    "valid_auc": a,
                    "wall_s": time.time() - t_init,
                }
            )
    finally:
        ray.shutdown()
    return {"epochs": records, "startup_s": startup}


BASELINES = {
    "torch": train_torch,
    "torch_sparse": train_torch_sparse,
    "ray_train": train_ray_train,
    "ray_ps": train_ray_ps,
}


def run_baseline(name: str, data: Data, cfg: dict[str, Any]) -> dict[str, Any]:
    """Train with one baseline; returns per-epoch records and the start-up time."""
    torch.set_num_threads(cfg["threads"])
    return BASELINES[name](data, cfg)
