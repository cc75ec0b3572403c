"""One rank of the FP8 + FSDP2 test (tests/train/test_fp8.py), started by torchrun on the CPU (gloo):
kiln's float8 layers, then kiln's FSDP2 wrapping over 2 shards; forward and backward of this rank's
half of the batch; rank 0 saves the whole gradients (gathered from the shards) to argv[1]."""

from __future__ import annotations

import sys

import torch
from test_fp8 import CFG, batch, loss_of  # torchrun runs this file with tests/train first on sys.path

from kiln.model.init import build_model
from kiln.train.distributed import parallelize
from kiln.train.float8 import apply_float8
from kiln.train.mesh import init_ranks
from kiln.train.parallel import ParallelConfig

ranks = init_ranks(ParallelConfig(dp_shard=2), torch.device("cpu"))
model = build_model(CFG, seed=0, device="cpu")
apply_float8(model, "tensorwise")
model = parallelize(model, ranks, ParallelConfig(dp_shard=2), torch.bfloat16)
ids_BT = batch()[ranks.rank :: 2]  # this rank's rows; FSDP2 averages the two halves' gradients
loss_of(model, ids_BT).backward()
grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}  # a collective: every rank takes part
if ranks.rank == 0:
    torch.save(grads, sys.argv[1])
torch.distributed.destroy_process_group()
