"""Shared by the evaluate tests: a model made to predict one token, for answers known in advance."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from kiln.model.transformer import Transformer


def _always_predicts(model: Transformer, token_id: int) -> Transformer:
    """The same model with a head that puts almost all probability on one token at every position."""
    head = nn.Linear(model.cfg.d_model, model.cfg.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[token_id] = 20.0
    model.lm_head = head
    return model


@pytest.fixture
def always_predicts() -> Callable[[Transformer, int], Transformer]:
    return _always_predicts
