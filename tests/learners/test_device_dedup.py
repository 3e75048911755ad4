"""learners/worker/device_step.py: a batch's ids deduplicated on the worker's device
(angel.worker.dedup=device) and a chunk's loss kept there, for tables the worker holds.

The device path is the same torch code on the CPU and on CUDA: here it runs on the CPU and must
train exactly as the host (numpy) path, FM and DeepFM with Momentum and Adam, on a real local
Ray; the ``gpu`` twins run it on a CUDA worker (skipped without one)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from angelconf.config import ConfigError, validate
from angelps.dedup import Dedup
from learners.keys import all_keys
from learners.models.sparse_input import SparseInput
from learners.worker.device_step import (
    LossSum,
    SideStream,
    dedup_on_device,
    host_copy,
    unique_slots,
)
from learners.worker.feed import DEDUP, FeedOptions
from tests.learners.test_worker_tables import _train

ROOT = Path(__file__).resolve().parents[2]
CUDA = torch.cuda.is_available()

pytestmark = pytest.mark.usefixtures("ray_local_gpu")


@pytest.fixture(scope="module")
def census(tmp_path_factory) -> str:
    dst = tmp_path_factory.mktemp("data") / "census.dummy"
    with open(ROOT / "data/census/census_148d_train.dummy") as f, open(dst, "w") as g:
        for _ in range(1200):
            g.write(f.readline())
    return str(dst)


def test_unique_slots_are_the_host_dedup() -> None:
    rng = np.random.default_rng(5)
    for bound, n in [(1000, 4096), (10**6, 300), (50, 7)]:
        ids = rng.integers(0, bound, n).astype(np.int64)
        uniq, slots = Dedup(bound)(ids)
        u_t, s_t = unique_slots(torch.from_numpy(ids))
        np.testing.assert_array_equal(u_t.numpy(), uniq)
        np.testing.assert_array_equal(s_t.numpy(), slots)
        assert s_t.dtype == torch.int64


def test_the_loss_sum_is_the_host_sum() -> None:
    losses = [torch.tensor(0.6931472, dtype=torch.float32), torch.tensor(0.1234567)]
    acc = LossSum()
    for t, n in zip(losses, [256, 37], strict=True):
        acc.add(t, n)
    assert acc.take() == float(losses[0]) * 256 + float(losses[1]) * 37
    assert acc.take() == 0.0  # read once, then it starts over


def test_when_ids_are_deduplicated_on_the_device() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    both = frozenset({"wide", "embedding"})
    sparse = {"wide", "embedding"}
    assert not dedup_on_device("auto", cpu, 1, sparse, both)  # numpy is faster on the CPU
    assert dedup_on_device("auto", cuda, 1, sparse, both)
    assert dedup_on_device("device", cpu, 1, sparse, both)
    assert not dedup_on_device("host", cuda, 1, sparse, both)
    # several workers route host ids; a table on the shards pulls host ids
    assert not dedup_on_device("device", cuda, 2, sparse, both)
    assert not dedup_on_device("device", cuda, 1, sparse, frozenset({"wide"}))
    assert not dedup_on_device("device", cuda, 1, sparse, frozenset())


def test_the_dedup_key_is_checked() -> None:
    keys = {k.name: k for k in all_keys()}
    assert keys["angel.worker.dedup"].default == "auto"
    with pytest.raises(
        ConfigError,
        match=re.escape("angel.worker.dedup=gpu is not valid: expected one of auto, host, device"),
    ):
        validate(DEDUP, "gpu")
    assert FeedOptions.from_config({"angel.worker.dedup": "device"}).dedup == "device"


def _side_batch(device: torch.device) -> tuple[SideStream, SparseInput, dict]:
    """A batch built on the side stream: its ids deduplicated and its input copied up there."""
    side = SideStream(device)
    ids = np.array([7, 3, 7, 9, 3, 3], dtype=np.int64)
    with side.scope():
        uniq, slots = unique_slots(torch.from_numpy(ids).to(device))
        x = SparseInput.from_csr(
            np.array([0, 3, 6]), slots, np.ones(6, np.float32), {}, 3, device=device
        )
    return side, x, {"wide": uniq}


def test_a_batch_built_beside_the_compute_is_the_same_batch() -> None:
    side, x, req = _side_batch(torch.device("cpu"))
    assert side.stream is None  # the CPU has no side stream: the same code, nothing to wait on
    side.hand_over(x, None, req)
    assert x.slot.tolist() == [1, 0, 1, 2, 0, 0] and req["wide"].tolist() == [3, 7, 9]


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs CUDA")]
        ),
    ],
)
def test_a_device_tiers_ids_come_down_once_from_the_side_stream(device: str) -> None:
    side, _, req = _side_batch(torch.device(device))
    with side.scope():
        host = host_copy(req["wide"])
    assert isinstance(host, np.ndarray) and host.tolist() == [3, 7, 9]


def test_a_request_deduplicated_on_the_device_gives_a_tiers_tables_host_ids() -> None:
    """The tables in a device tier get the unique ids as a host array (their index is on the
    host); the other held tables keep them on the device."""
    from learners.data.batch import Batch
    from learners.models.table_decl import TableDecl
    from learners.worker.batch_rows import BatchInput

    tables = [
        TableDecl("wide", 10, 1, True, "inputlayer"),
        TableDecl("embedding", 10, 4, True, "embedding"),
        TableDecl("bias", 1, 1, False, "inputlayer"),
    ]
    inputs = BatchInput(None, tables, set(), torch.device("cpu"), None, [], Dedup())  # type: ignore[arg-type]
    inputs.on_device = True
    inputs.host_ids = frozenset({"embedding"})
    ids = np.array([7, 3, 7, 9, 3, 3], dtype=np.int64)
    batch = Batch(
        np.zeros(2, np.float32), np.array([0, 3, 6]), ids, np.ones(6, np.float32), np.arange(2)
    )
    slots, req = inputs.request(batch)
    assert isinstance(req["embedding"], np.ndarray) and req["embedding"].tolist() == [3, 7, 9]
    assert isinstance(req["wide"], torch.Tensor) and req["wide"].tolist() == [3, 7, 9]
    assert slots.tolist() == [1, 0, 1, 2, 0, 0] and req["bias"].tolist() == [0]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_batch_built_on_the_side_stream_is_handed_to_the_compute_stream() -> None:
    side, x, req = _side_batch(torch.device("cuda"))
    assert side.stream is not None and x.slot.is_cuda
    side.hand_over(x, None, req)
    rows = torch.arange(3, dtype=torch.float32, device="cuda").unsqueeze(1)
    assert x.slot.tolist() == [1, 0, 1, 2, 0, 0] and req["wide"].tolist() == [3, 7, 9]
    assert rows.index_select(0, x.slot).flatten().tolist() == [1, 0, 1, 2, 0, 0]


CASES = [
    ("fm_census.properties", "Momentum"),
    ("fm_census.properties", "Adam"),
    ("deepfm_census.properties", "Momentum"),
    ("deepfm_census.properties", "Adam"),
]


def _held_pair(tmp: Path, census: str, conf: str, opt: str, **sets: object) -> None:
    """Train with the ids deduplicated on the host and on the device: the same run."""
    base = {
        "ml.inputlayer.optimizer": opt,
        "ml.embedding.optimizer": opt,
        "angel.sparse.placement": "worker",
        **sets,
    }
    host, host_w = _train(conf, tmp / "host", census, **base, **{"angel.worker.dedup": "host"})
    dev, dev_w = _train(conf, tmp / "dev", census, **base, **{"angel.worker.dedup": "device"})
    assert host_w.keys() == dev_w.keys()
    for name in host_w:
        np.testing.assert_array_equal(host_w[name][0], dev_w[name][0], err_msg=name)
        np.testing.assert_allclose(host_w[name][1], dev_w[name][1], rtol=1e-6, atol=1e-7)
        for slot in host_w[name][2]:
            np.testing.assert_allclose(
                host_w[name][2][slot], dev_w[name][2][slot], rtol=1e-6, atol=1e-7
            )
    assert dev["valid_auc"] == pytest.approx(host["valid_auc"], abs=1e-6)
    assert dev["train_loss"] == pytest.approx(host["train_loss"], rel=1e-6)
    np.testing.assert_allclose(dev["pred"], host["pred"], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("conf", "opt"),
    # (each model and optimizer once in the default suite; the other two with -m slow)
    [c if c in (CASES[1], CASES[2]) else pytest.param(*c, marks=pytest.mark.slow) for c in CASES],
)
def test_ids_deduplicated_on_the_device_train_as_on_the_host(tmp_path, census, conf, opt):
    _held_pair(tmp_path, census, conf, opt)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize(("conf", "opt"), CASES)
def test_cuda_worker_dedup_on_the_device_trains_as_on_the_host(tmp_path, census, conf, opt):
    _held_pair(tmp_path, census, conf, opt, **{"angel.worker.device": "cuda"})
