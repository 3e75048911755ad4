"""Drive a torch optimizer with any StepSizeScheduler (the one decay module that imports torch).

>>> import torch, decay
>>> from decay.torch import DecayLR
>>> p = torch.nn.Parameter(torch.zeros(1))
>>> opt = torch.optim.SGD([p], lr=0.1)
>>> sched = DecayLR(opt, decay.StepLR(0.1, step_size=2, gamma=0.5))
>>> lrs = []
>>> for _ in range(4):
...     lrs.append(opt.param_groups[0]["lr"])
...     opt.step()
...     sched.step()
>>> lrs
[0.1, 0.1, 0.05, 0.05]
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from decay.base import StepSizeScheduler

__all__ = ["DecayLR"]


class DecayLR(LRScheduler):
    """A ``torch.optim.lr_scheduler.LRScheduler`` whose lr after ``k`` calls of ``step()`` is
    ``schedule.lr_at(k)``.

    ``relative=False`` (default) writes ``lr_at(k)`` into every parameter group, as Angel's
    ``setLR`` does; ``relative=True`` scales each group's initial lr by ``lr_at(k)/schedule.lr``
    (per-group learning rates keep their ratios). Schedules that drive momentum (CyclicLR,
    OneCycleLR) also write ``momentum``, or ``betas[0]`` for Adam-like optimizers.

    Unlike torch's schedulers, ``state_dict()`` is JSON-safe (the schedule's count) and
    ``load_state_dict()`` also writes the restored lr (and momentum) back into the optimizer's
    groups, so resuming is exact whatever the order of loading the optimizer and the scheduler.
    When an update is skipped (AMP found inf/NaN), do not call ``step()``: the schedule counts
    applied updates.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        schedule: StepSizeScheduler,
        relative: bool = False,
        last_epoch: int = -1,
    ) -> None:
        if not isinstance(schedule, StepSizeScheduler):
            raise TypeError(
                f"DecayLR: schedule must be a StepSizeScheduler, got {type(schedule).__name__}"
            )
        if schedule.metric_driven:
            raise ValueError(
                f"DecayLR: {type(schedule).__name__} is metric-driven; torch's ReduceLROnPlateau "
                "or calling schedule.step(metric) and writing schedule.peek() fits it better"
            )
        if relative and schedule.lr <= 0:
            raise ValueError(f"DecayLR: relative=True needs schedule.lr > 0, got {schedule.lr!r}")
        self.schedule = schedule
        self.relative = relative
        self._momentum_key: str | None = None
        if schedule.momentum_at(0) is not None:
            if "betas" in optimizer.defaults:
                self._momentum_key = "betas"
            elif "momentum" in optimizer.defaults:
                self._momentum_key = "momentum"
            else:
                raise ValueError(
                    f"DecayLR: {type(schedule).__name__} cycles the momentum but "
                    f"{type(optimizer).__name__} has neither momentum nor betas "
                    "(set ml.opt.decay.cycle.momentum=false)"
                )
        super().__init__(optimizer, last_epoch)

    def _values(self, k: int) -> list[float]:
        lr = self.schedule.lr_at(k)
        self.schedule._count = k + 1  # the schedule has given update k's step size
        m = self.schedule.momentum_at(k)
        if m is not None and self._momentum_key is not None:
            for group in self.optimizer.param_groups:
                if self._momentum_key == "betas":
                    group["betas"] = (m, *group["betas"][1:])
                else:
                    group["momentum"] = m
        if self.relative:
            return [float(b) * lr / self.schedule.lr for b in self.base_lrs]
        return [lr for _ in self.optimizer.param_groups]

    def get_lr(self) -> list[float | torch.Tensor]:  # type: ignore[override]
        """The lrs for ``last_epoch`` (no chaining: the schedule is absolute)."""
        return list(self._values(self.last_epoch))

    def _get_closed_form_lr(self) -> list[float]:
        return self._values(self.last_epoch)

    def state_dict(self) -> dict[str, Any]:
        """JSON-safe: the update count (torch's ``last_epoch``) and the schedule's state."""
        return {
            "last_epoch": self.last_epoch,
            "step_count": self._step_count,
            "relative": self.relative,
            "schedule": self.schedule.state_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the count and write the restored lr (and momentum) into the optimizer."""
        try:
            last_epoch = int(state_dict["last_epoch"])
            step_count = int(state_dict["step_count"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                "DecayLR.load_state_dict: expected the mapping written by DecayLR.state_dict()"
            ) from None
        self.schedule.load_state_dict(state_dict.get("schedule", {"count": last_epoch + 1}))
        self.last_epoch = last_epoch
        self._step_count = step_count
        for group, lr in zip(self.optimizer.param_groups, self._values(last_epoch), strict=True):
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]
