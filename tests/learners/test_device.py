"""learners/worker/device.py: a step's arrays to the worker's device and its gradients back, and the
dense all-reduce's backend. The CUDA paths run on a CUDA machine (``-m gpu``); here the CPU
path is checked, which is the same code with the device "cpu"."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from angelconf.config import load_config
from learners.job.loop_options import TrainPlan
from learners.keys import all_keys
from learners.worker.device import to_device, to_host

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")


def test_rows_are_copied_so_the_pulled_block_is_never_written() -> None:
    block = np.arange(12, dtype=np.float32).reshape(4, 3)
    block.flags.writeable = False  # as a block read from Ray's object store
    t = to_device(block, torch.device("cpu"))
    assert t.dtype == torch.float32 and t.shape == (4, 3)
    t.add_(1.0)  # the leaf may be written; the block must not change
    np.testing.assert_array_equal(block, np.arange(12, dtype=np.float32).reshape(4, 3))


def test_gradients_come_back_as_float32_copies_the_caller_owns() -> None:
    g16 = torch.ones(2, 3, dtype=torch.float16)
    g = torch.full((5, 2), 0.5)
    host = to_host([g16, g])
    assert [a.dtype for a in host] == [np.float32, np.float32]
    host[1][:] = 9.0
    assert float(g[0, 0]) == 0.5  # a copy, not a view of the gradient
    assert to_host([]) == []


def test_nccl_only_between_cuda_workers_that_own_a_whole_gpu() -> None:
    def plan(**sets: object) -> TrainPlan:
        return TrainPlan.from_config(load_config(None, sets, all_keys()))

    assert plan().collective == "gloo"
    cuda = plan(**{"angel.worker.device": "cuda"})
    assert (cuda.worker_gpus, cuda.collective) == (1.0, "nccl")
    # Two ranks on one GPU: NCCL refuses them, so gloo (through the host).
    assert replace(cuda, worker_gpus=0.5).collective == "gloo"


@needs_cuda
@pytest.mark.gpu
def test_cuda_round_trip_through_pinned_buffers() -> None:
    a = np.random.default_rng(0).standard_normal((1000, 8)).astype(np.float32)
    t = to_device(a, torch.device("cuda"))
    assert t.is_cuda
    back = to_host([t * 2, torch.ones(3)])
    np.testing.assert_array_equal(back[0], a * 2)
    np.testing.assert_array_equal(back[1], np.ones(3, dtype=np.float32))
    ids = to_device(np.arange(5, dtype=np.int64), torch.device("cuda"))
    assert ids.dtype == torch.int64 and ids.tolist() == [0, 1, 2, 3, 4]


@needs_cuda
@pytest.mark.gpu
def test_a_cuda_worker_trains_as_the_cpu_worker(tmp_path, local_ps_class) -> None:
    """DeepFM steps on the GPU (pinned uploads, one download per update) give the CPU's
    weights up to float rounding."""
    from decay.angel import StandardDecay
    from tests.learners.test_worker import DEEPFM, ROOT, _head, _worker

    path = _head(ROOT / "data/census/census_148d_train.dummy", tmp_path / "c.dummy", 256)
    out = {}
    for device in ("cpu", "cuda"):
        w, ps = _worker(path, DEEPFM, {"device": device}, local_ps_class, fields=13)
        w.begin_epoch(0, StandardDecay(0.1))
        w.run_steps(4, None)
        out[device] = {k: np.array(v) for k, v in ps.w.items()}
    for name, v in out["cpu"].items():
        np.testing.assert_allclose(out["cuda"][name], v, rtol=1e-4, atol=1e-6)
