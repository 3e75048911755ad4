"""The dense layers on the workers: the all-reduce, finiteness check and clipping of their
gradients, and their checkpoint. Their optimizer is ``angelps.optim.DenseOptimizer`` (the
formulas of the PS optimizers, written once).

Dense (fully connected) layers live on every worker, not on the PS (unless
``angel.dense.placement=ps``). Each worker keeps a full copy; the copies stay equal because
every worker starts from the same seed and steps the same optimizer with the same all-reduced
gradient and the same learning rate, and all of them skip the same (non-finite) updates.
"""

from __future__ import annotations

import io
import json
import math
import socket
from collections.abc import Mapping
from typing import Any

import numpy as np
import ray
import torch
import torch.distributed as dist
from torch import Tensor, nn

from angelps.optim import DenseOptimizer
from learners.models.table_decl import TableDecl

__all__ = ["finish_grads", "load_dense", "read_dense", "save_dense"]


def finish_grads(
    model: nn.Module,
    grads: Mapping[str, tuple[Any, np.ndarray | Tensor]],
    loss_scale: float,
    num_workers: int,
    clip: float,
) -> tuple[bool, float]:
    """All-reduce dense gradients, agree on finiteness, and compute the clip coefficient.

    ``grads`` are this worker's row gradients of the update (id, gradient) by table; the dense
    gradients are those held by ``model``'s trainable parameters, scaled by ``loss_scale``
    (divided out here). Returns (every gradient finite on every worker, clip coefficient); the
    dense gradients are left averaged over the workers and multiplied by the coefficient.

    With W > 1 workers this is one collective per update: the dense gradients and a count
    of workers whose sparse gradients are not finite travel in the same all-reduce (a NaN
    in a dense gradient reaches every worker through the sum). Clipping adds a second one.
    """
    dense = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
    if loss_scale != 1.0:
        for g in dense:
            g.div_(loss_scale)
    w = num_workers
    gs = [g for _, g in grads.values()]
    # Pushed gradients are on the host (numpy); those of held tables, the non-finite flag and
    # the dense norms stay on the device until the one read of this update below.
    host_sq = sum(
        float(np.square(g, dtype=np.float64).sum()) for g in gs if not isinstance(g, Tensor)
    )
    # (the norm accumulated in float64 without a float64 copy of the gradient: 1.7 against
    # 2.6 ms for [115k, 8] on one CPU core; the same sum to ~1e-15)
    held = [
        torch.linalg.vector_norm(g.detach(), dtype=torch.float64).square()
        for g in gs
        if isinstance(g, Tensor)
    ]
    held_sq = torch.stack(held).sum() if held else None
    bad_t: Tensor | None = None
    if w > 1:
        like = dense[0] if dense else torch.zeros(1)
        bad = 0.0 if math.isfinite(host_sq / (w * w)) else 1.0
        flag = torch.tensor([bad], dtype=like.dtype, device=like.device)
        if held_sq is not None:
            flag = flag + (~torch.isfinite(held_sq / (w * w))).to(like.device, like.dtype)
        flat = _all_reduce(torch.cat([*(g.reshape(-1) for g in dense), flag]))
        bad_t = flat[-1]
        flat /= w
        off = 0
        for g in dense:
            n = g.numel()
            g.copy_(flat[off : off + n].view_as(g))
            off += n
    # One fused pass over the dense gradients (as clip_grad_norm_), not a per-tensor float64
    # square-and-sum (docs/benchmarks-train.md). NaN or inf in any gradient makes its norm
    # non-finite. After the all-reduce every worker holds the same dense gradients, so every
    # worker reaches the same verdict.
    dense_t = torch.stack(torch._foreach_norm(dense)).double().pow(2).sum() if dense else None
    # One host read per update: the verdict decides, before anything is applied, whether the
    # update happens at all (the schedule, the loss scale and the skip count are host state).
    on_dev = [t for t in (held_sq, dense_t, bad_t) if t is not None]
    read = _read_scalars(on_dev)
    held_v = read.pop(0) if held_sq is not None else 0.0
    dense_sq = read.pop(0) if dense_t is not None else 0.0
    sparse_sq = (host_sq + held_v) / (w * w)
    bad = read.pop(0) if bad_t is not None else (0.0 if math.isfinite(sparse_sq) else 1.0)
    finite = bad == 0 and math.isfinite(dense_sq)
    coef = 1.0
    if finite and clip > 0:
        # Sparse: this worker's share of the pushed gradient; under W > 1 the norm of the
        # summed sparse gradient is not known on any one worker, so the largest share
        # stands in for it (every worker then applies the same, smallest coefficient).
        if w > 1:
            # NCCL reduces device tensors only; gloo host tensors.
            on = like_device(dense) if dist.get_backend() == "nccl" else torch.device("cpu")
            t = torch.tensor([sparse_sq], dtype=torch.float64, device=on)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            sparse_sq = float(t[0])
        norm = math.sqrt(sparse_sq * w + dense_sq)
        coef = min(1.0, clip / (norm + 1e-6))
    if finite and coef < 1.0:
        for g in dense:
            g.mul_(coef)
    return finite, coef


def _read_scalars(ts: list[Tensor]) -> list[float]:
    """Float64 scalars (on any devices) as Python floats: one transfer per device."""
    if not ts:
        return []
    by_dev: dict[torch.device, list[int]] = {}
    for i, t in enumerate(ts):
        by_dev.setdefault(t.device, []).append(i)
    out = [0.0] * len(ts)
    for idx in by_dev.values():
        vals = torch.stack([ts[i].reshape(()).double() for i in idx]).tolist()
        for i, v in zip(idx, vals, strict=True):
            out[i] = float(v)
    return out


def _all_reduce(t: Tensor) -> Tensor:
    """Sum over workers: in place under NCCL; gloo works on host tensors, so there a CUDA
    tensor makes the round trip."""
    if t.is_cuda and dist.get_backend() != "nccl":
        host = t.cpu()
        dist.all_reduce(host)
        return host.to(t.device)
    dist.all_reduce(t)
    return t


def save_dense(
    model: nn.Module, opt: DenseOptimizer | None, loss_scale: float, good_steps: int
) -> bytes:
    """Dense layers, dense optimizer state, loss scale and RNG state as one safetensors file
    (readable by ``safetensors.torch.load``): tensors ``model/<name>`` (the module's
    state_dict), ``opt/<param>/<state>`` and ``rng/torch``, with a JSON ``meta`` (optimizer
    groups and scalars, loss scale) in the file's metadata."""
    from safetensors.numpy import save  # only when a checkpoint is written

    arrays: dict[str, np.ndarray] = {}
    for k, v in model.state_dict().items():
        arrays[f"model/{k}"] = np.ascontiguousarray(v.detach().cpu().numpy())
    meta: dict[str, Any] = {"param_groups": [], "state_keys": {}}
    if opt is not None:
        sd = opt.state_dict()
        meta["param_groups"] = sd["param_groups"]
        for idx, st in sd["state"].items():
            keys = []
            for name, val in st.items():
                if isinstance(val, Tensor):
                    arrays[f"opt/{idx}/{name}"] = np.ascontiguousarray(val.detach().cpu().numpy())
                    keys.append([name, "tensor"])
                else:
                    meta.setdefault("scalars", {})[f"{idx}/{name}"] = val
                    keys.append([name, "scalar"])
            meta["state_keys"][str(idx)] = keys
    meta["loss_scale"] = loss_scale
    meta["good_steps"] = good_steps
    arrays["rng/torch"] = torch.get_rng_state().numpy()
    return bytes(save(arrays, metadata={"meta": json.dumps(meta)}))


def read_dense(blob: bytes) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and the ``meta`` of a :func:`save_dense` file: safetensors, or the ``.npz``
    of checkpoints written before it (its ``meta`` an array), which are still read."""
    if blob[:2] == b"PK":  # a zip: the older .npz
        with np.load(io.BytesIO(blob), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        return arrays, json.loads(bytes(arrays.pop("meta")).decode())
    from safetensors.numpy import load

    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n].decode())
    meta = json.loads(header.get("__metadata__", {}).get("meta", "{}"))
    return load(blob), meta


def load_dense(
    blob: bytes, model: nn.Module, opt: DenseOptimizer | None, loss_scale: float
) -> tuple[float, int]:
    """Restore what :func:`save_dense` wrote into ``model`` and ``opt`` (and the torch RNG);
    returns the saved (loss scale, good steps), ``loss_scale`` when the blob has none."""
    arrays, meta = read_dense(blob)
    model_sd = {
        k[len("model/") :]: torch.from_numpy(v.copy())
        for k, v in arrays.items()
        if k.startswith("model/")
    }
    model.load_state_dict(model_sd)
    if opt is not None and meta["param_groups"]:
        state: dict[int, dict[str, Any]] = {}
        for idx, keys in meta["state_keys"].items():
            st: dict[str, Any] = {}
            for name, kind in keys:
                if kind == "tensor":
                    st[name] = torch.from_numpy(arrays[f"opt/{idx}/{name}"].copy())
                else:
                    st[name] = meta["scalars"][f"{idx}/{name}"]
            state[int(idx)] = st
        # Hyper-parameters come from the configuration; the checkpoint gives the lr.
        groups = [
            {**cur, "lr": saved["lr"]}
            for cur, saved in zip(
                opt.state_dict()["param_groups"], meta["param_groups"], strict=True
            )
        ]
        opt.load_state_dict({"state": state, "param_groups": groups})
    torch.set_rng_state(torch.from_numpy(arrays["rng/torch"].copy()))
    return float(meta.get("loss_scale", loss_scale)), int(meta.get("good_steps", 0))


def dense_tables_on_ps(
    model: nn.Module, tables: list[TableDecl], frozen: set[str]
) -> list[tuple[str, nn.Parameter]]:
    """angel.dense.placement=ps: every MLP parameter becomes a dense PS table (as Angel), pulled
    whole before each forward and pushed after each backward; no all-reduce, no worker-side
    optimizer. Init U(±1/√fan_in), the scale of torch's nn.Linear default.

    Appends the tables to ``tables`` and the names of frozen parameters to ``frozen``; returns
    (table name, parameter) pairs.
    """
    params = dict(model.named_parameters())
    placed: list[tuple[str, nn.Parameter]] = []
    for pname, p in params.items():
        # A bias takes the fan-in of its layer's weight (as nn.Linear).
        w = params.get(pname[: -len("bias")] + "weight") if pname.endswith("bias") else p
        fan_in = w.shape[1] if w is not None and w.dim() > 1 else p.shape[0]
        name = "dense." + pname
        tables.append(
            TableDecl(
                name,
                int(p.shape[0]),
                int(p[0].numel()) if p.dim() > 1 else 1,
                False,
                "fclayer",
                1.0 / math.sqrt(max(fan_in, 1)),
                "uniform",
                # a JSON graph's layer may name its own optimizer (learners/models/graph_model.py)
                getattr(model, "param_optimizer", lambda _: None)(pname),
            )
        )
        placed.append((name, p))
        if not p.requires_grad:
            frozen.add(name.lower())
    return placed


def join_group(
    master_addr: str, master_port: int, rank: int, world_size: int, backend: str = "gloo"
) -> None:
    """Join the process group the dense all-reduce runs in (as Ray Train sets it up):
    ``backend`` is gloo, or nccl between CUDA workers (:func:`learners.worker.device.collective_backend`)."""
    if world_size <= 1 or dist.is_initialized():
        return
    dist.init_process_group(
        backend, init_method=f"tcp://{master_addr}:{master_port}", rank=rank, world_size=world_size
    )


def like_device(tensors: list[Tensor]) -> torch.device:
    """Where ``tensors`` live (the CPU for none)."""
    return tensors[0].device if tensors else torch.device("cpu")


def free_port() -> tuple[str, int]:
    """An address and a free TCP port on this node, for worker 0 to host the process group."""
    addr = ray.util.get_node_ip_address()
    with socket.socket() as s:
        s.bind(("", 0))
        return addr, int(s.getsockname()[1])
