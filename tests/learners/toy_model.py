"""A toy model added from outside the package, as a user would: its tables and its class.

Registered by tests/learners/test_registries.py only (the driver); the workers build it from the
entry their ModelConfig carries, importing this module by its path from the job's directory.
"""

from __future__ import annotations

from torch import Tensor

from learners.models.config import ModelConfig
from learners.models.sparse_input import SparseInput
from learners.models.table_decl import TableDecl
from learners.models.zoo import BaseModel


def toy_tables(cfg: ModelConfig) -> list[TableDecl]:
    """A weight column and a bias, under names no built-in model uses."""
    return [
        TableDecl("toy_weight", cfg.num_features, 1, True, "inputlayer", cfg.input_std),
        TableDecl("toy_bias", 1, 1, False, "inputlayer"),
    ]


class ToyLinear(BaseModel):
    """Logistic regression over the toy tables."""

    angel_name = "ToyLinear"

    def forward(self, x: SparseInput) -> Tensor:
        return x.linear("toy_weight", "toy_bias").squeeze(1)
