"""FP8 training (train.precision.dtype=fp8): the blocks' linear layers through torchao's float8 training.

Each converted nn.Linear becomes torchao's Float8Linear: its weight stays an fp32 parameter (the
optimizer, the checkpoints and the export see the same names and values as bf16 training), and
each matmul of the forward and backward casts its operands to float8 with dynamic scales (e4m3
for inputs and weights, e5m2 for gradients; one scale per tensor, or per row with rowwise) and
multiplies them with torch._scaled_mm, which FP8 GPUs run at twice the bf16 rate. Everything
else (embedding, norms, attention, the output layer and loss) runs in bf16 autocast as with
dtype bf16. The swap happens before activation checkpointing, torch.compile and FSDP2 are
applied (kiln.train.parts), so compile fuses the casts into the neighbouring kernels and FSDP2
all-gathers the fp32 weights in bf16 as it does without fp8.
Not handled here: tensor parallelism (refused by kiln.train.mesh.check_layout: its sharded
matmuls need float8 parallel styles of their own), fp8 all-gathers, the device check
(kiln.model.precision.check_fp8).
"""

from __future__ import annotations

import logging
from typing import Literal

from torch import nn

from kiln.core.errors import FatalError

log = logging.getLogger("kiln.train")

# torch._scaled_mm takes matrices whose both dimensions are multiples of 16.
FP8_MULTIPLE = 16


def block_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The blocks' linear layers by name. The output layer is not among them and stays bf16: the fused
    loss multiplies by its weight directly, and its logits are the most sensitive to rounding."""
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.startswith("blocks.")}


def float8_layers(model: nn.Module) -> list[str]:
    """Names of the linear layers fp8 converts: the blocks' projections whose shapes _scaled_mm takes."""
    return [
        name
        for name, layer in block_linears(model).items()
        if layer.in_features % FP8_MULTIPLE == 0 and layer.out_features % FP8_MULTIPLE == 0
    ]


def apply_float8(model: nn.Module, scaling: Literal["tensorwise", "rowwise"]) -> list[str]:
    """Swap float8_layers(model) for torchao's Float8Linear in place; the names swapped."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError:
        raise FatalError(
            "train.precision.dtype=fp8 trains through torchao's float8 layers, and torchao is not installed; "
            "pip install 'kiln[fp8]' (torchao>=0.16), or use train.precision.dtype=bf16"
        ) from None
    names = set(float8_layers(model))
    skipped = [name for name in block_linears(model) if name not in names]
    if skipped:
        log.warning(
            "train: fp8 leaves %d block linear layer(s) in bf16 (a dimension not a multiple of %d), e.g. %s",
            len(skipped),
            FP8_MULTIPLE,
            skipped[0],
        )
    convert_to_float8_training(
        model, config=Float8LinearConfig.from_recipe_name(scaling), module_filter_fn=lambda _, fqn: fqn in names
    )
    return sorted(names)
