"""kiln.model.precision: the one device and precision policy of train, eval and generate."""

from __future__ import annotations

import pytest
import torch

from kiln.core.errors import FatalError
from kiln.model.config import PrecisionConfig
from kiln.model.precision import Precision, autocast, resolve_precision

CPU = torch.device("cpu")


def test_auto_is_fp32_on_the_cpu_and_bf16_autocast_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_precision(PrecisionConfig(), "eval") == Precision(CPU, None)
    assert resolve_precision(PrecisionConfig(dtype="bf16"), "eval") == Precision(CPU, torch.bfloat16)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_precision(PrecisionConfig(), "eval") == Precision(torch.device("cuda"), torch.bfloat16)
    assert resolve_precision(PrecisionConfig(dtype="fp32"), "eval") == Precision(torch.device("cuda"), None)
    assert resolve_precision(PrecisionConfig(device="cpu"), "eval") == Precision(CPU, None)


def test_cuda_without_a_device_names_the_section(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(
        FatalError,
        match=(
            r"generate\.precision\.device is cuda but no CUDA device is visible; use generate\.precision\.device=auto "
            r"or cpu"
        ),
    ):
        resolve_precision(PrecisionConfig(device="cuda"), "generate")


def test_autocast_runs_matmuls_in_the_dtype_or_leaves_fp32() -> None:
    a = torch.randn(4, 4)
    with autocast(CPU, torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16
    with autocast(CPU, None):
        assert (a @ a).dtype == torch.float32
    with Precision(CPU, torch.bfloat16).autocast():
        assert (a @ a).dtype == torch.bfloat16
