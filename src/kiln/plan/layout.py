"""Proposing a parallel layout (tp, pp, dp, ZeRO stage, recompute, micro-batching) that fits memory.

Every candidate is checked with kiln.plan.memory against the GPU's memory less `headroom`;
among those that fit, the first in this order wins, each step a rule of thumb with its source:
  1. no full recompute if avoidable: it repeats the forward pass, about 33% more compute
     (Korthikanti et al. 2022, Section 5); selective recompute costs a few percent and counts as free;
  2. no context parallelism if avoidable: it gathers every layer's keys and values over cp GPUs;
     where sequences are too long to fit otherwise it is preferred to full recompute (it costs
     communication, not compute), with pp = 1 as kiln runs it, and only down to MIN_CP_POSITIONS
     positions per GPU unless asked for (kiln's rule of thumb: below that the gathers outweigh the
     attention they feed);
  3. no extra data-parallel traffic if avoidable. Per step, DDP all-reduces the gradients once
     (a reduce-scatter and an all-gather, 2 x the gradients' size); ZeRO-1 moves the same (ZeRO
     paper, Section 7). With m micro-batches per step ZeRO-2 must reduce-scatter after each one
     to keep its gradient shard ((m + 1) / 2 x DDP), and ZeRO-3 gathers the weights for forward
     and backward and reduce-scatters the gradients for each (1.5 m x DDP; 1.5x at m = 1, the
     paper's figure);
  4. the smallest model-parallel size tp * pp * cp, leaving the most data parallelism;
  5. tensor parallelism before pipeline or context parallelism, tp kept inside a node on the fast
     links (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
     Using Megatron-LM", Takeaways 1 and 2);
  6. the least data-parallel traffic, the lowest ZeRO stage, then no recompute over selective.
With pp > 1 only ZeRO-1 (or 0) is considered: kiln shards each pipeline stage with FSDP2, and
torch.distributed.pipelining keeps an FSDP stage's weights and gradients whole from the step's
first micro-batch to its last, reduce-scattering once: ZeRO-1's memory and traffic.
The result also says how to run the layout with kiln (`recipe`: the `--set` keys of the
`parallel` and `train` sections): ZeRO-3 is FSDP2 resharding after forward, ZeRO-2 FSDP2 keeping
the gathered weights until backward (`parallel.reshard_after_forward: false`), ZeRO-1 with
pipeline stages FSDP2 over each stage's data ranks, ZeRO-0 replicas (DDP). Without a pipeline kiln
has no ZeRO-1: the keys run replicas, and a warning gives their memory (full optimizer states on
every GPU) and whether it fits.
With flash attention (kiln's SDPA; the default) selective recompute stores what no recompute
does, so it is not proposed; with eager attention it is.
The pipeline bubble, the share of a step each stage idles with 1F1B or GPipe scheduling, is
(pp - 1) / (m + pp - 1) for m micro-batches per step (Narayanan et al. 2021, Section 2.2.1;
Huang et al. 2019). Without a global batch, m = 4 * pp keeps it near 20% or below; a warning
says when a given global batch leaves more.
Not handled here: interleaved pipeline schedules, expert parallelism, and speed (the layout
that fits is proposed; its throughput is not modelled).
"""

from __future__ import annotations

from typing import Any

from kiln.core.errors import ConfigError
from kiln.plan.checks import require_at_least
from kiln.plan.memory import (
    CHECKPOINTING,
    DEFAULT_HEADROOM,
    Shape,
    check_checkpointing,
    check_context,
    check_layout,
    check_shape,
    divisors,
    plan_memory,
)
from kiln.plan.report import count, fixed, table

MAX_BUBBLE = 0.2  # above this share of a step idle, the layout warns
MIN_CP_POSITIONS = 4096  # context parallelism is proposed only where each GPU keeps at least this many positions


def dp_traffic(zero: int, micro_batches: int) -> float:
    """Data-parallel bytes moved per optimizer step, relative to DDP's one gradient all-reduce."""
    if zero <= 1:
        return 1.0
    if zero == 2:
        return (micro_batches + 1) / 2  # a reduce-scatter per micro-batch, one all-gather of weights per step
    return 1.5 * micro_batches  # all-gather (forward), all-gather (backward), reduce-scatter, per micro-batch


def _rank(c: dict[str, Any]) -> tuple:
    traffic = dp_traffic(c["zero"], c["micro_batches"]) if c["dp"] * c["cp"] > 1 else 1.0
    return (
        c["activation_checkpointing"] == "full",
        c["cp"] > 1,
        traffic > 1,
        c["tp"] * c["pp"] * c["cp"],
        c["pp"],
        c["cp"],
        traffic,
        c["zero"],
        c["activation_checkpointing"] == "selective",
    )


def bubble_fraction(pp: int, micro_batches: int) -> float:
    return (pp - 1) / (micro_batches + pp - 1)


def _summary(c: dict[str, Any]) -> str:
    context = f" cp={c['cp']}" if c["cp"] > 1 else ""
    return (
        f"tp={c['tp']} pp={c['pp']}{context} dp={c['dp']} ZeRO-{c['zero']}, recompute {c['activation_checkpointing']}"
    )


def propose_layout(
    shape: Shape,
    gpus: int,
    gpus_per_node: int = 8,
    gpu_memory_gb: float = 80.0,
    seq_len: int = 2048,
    micro_batch: int = 1,
    global_batch: int | None = None,
    precision: str = "bf16",
    tp: int | None = None,
    pp: int | None = None,
    zero: int | None = None,
    checkpointing: str | None = None,
    attention: str = "flash",
    headroom: float = DEFAULT_HEADROOM,
    cp: int | None = None,
) -> dict[str, Any]:
    """The preferred fitting layout with the reason for each degree, or a ConfigError saying why none fits."""
    check_shape(shape)
    if not shape.known:
        raise ConfigError(
            "a layout needs the model's shape: give preset (--preset NAME) or n_layers, d_model and n_heads "
            "(--layers, --hidden, --heads)"
        )
    assert shape.n_layers is not None and shape.n_heads is not None
    if gpus < 1 or gpus_per_node < 1:
        raise ConfigError(f"gpus = {gpus} and gpus_per_node = {gpus_per_node} must both be at least 1")
    if gpus > gpus_per_node and gpus % gpus_per_node:
        lo = gpus // gpus_per_node * gpus_per_node
        raise ConfigError(
            f"gpus = {gpus} is not a multiple of gpus_per_node = {gpus_per_node}: a layout fills whole nodes; use "
            f"{lo} or {lo + gpus_per_node}"
        )
    node = min(gpus, gpus_per_node)
    require_at_least("micro_batch", micro_batch, 1, "sequences per forward pass")
    if global_batch is not None:
        require_at_least("global_batch", global_batch, 1, "sequences per optimizer step")
    if checkpointing is not None:
        check_checkpointing(checkpointing)
    if tp is not None:
        if gpus % tp:
            raise ConfigError(
                f"tp = {tp} does not divide gpus = {gpus}; valid tp: "
                f"{', '.join(str(k) for k in divisors(node) if gpus % k == 0 and shape.n_heads % k == 0)}"
            )
        if tp > node:
            raise ConfigError(
                f"tp = {tp} exceeds gpus_per_node = {node}: tensor parallelism needs the fast links inside a "
                f"node; use tp <= {node} and pp across nodes"
            )
    if pp is not None and (gpus % pp or (tp is not None and gpus % (tp * pp))):
        raise ConfigError(
            f"pp = {pp} (with tp = {tp or 1}) does not divide gpus = {gpus}: tp * pp * dp must equal gpus; valid "
            f"pp: {', '.join(str(k) for k in divisors(shape.n_layers) if gpus % (k * (tp or 1)) == 0)}"
        )
    check_layout(shape, 1, tp or 1, pp or 1, zero if zero is not None else 0)
    if zero is not None and zero >= 2 and pp is not None and pp > 1:
        raise ConfigError(
            f"zero = {zero} with pp = {pp}: kiln's FSDP2 keeps a pipeline stage's weights and gradients whole "
            "until the step's last micro-batch, which is ZeRO-1; use zero 1 (--zero 1) or pp 1 (--pp 1)"
        )
    if cp is not None:
        if gpus % cp:
            raise ConfigError(
                f"cp = {cp} does not divide gpus = {gpus}; valid cp: "
                f"{', '.join(str(k) for k in divisors(gpus) if seq_len % (2 * k) == 0)}"
            )
        check_context(seq_len, cp, pp or 1, zero if zero is not None else 3)

    tps = [tp] if tp is not None else [k for k in divisors(node) if shape.n_heads % k == 0 and gpus % k == 0]
    pps = [pp] if pp is not None else ([1] if zero is not None and zero >= 2 else divisors(shape.n_layers))
    # With flash attention selective recompute stores exactly what none does: never propose it.
    recomputes = (
        [checkpointing]
        if checkpointing
        else [c for c in CHECKPOINTING if not (attention == "flash" and c == "selective")]
    )
    fits, tried = [], []
    batch_mismatch = []
    for t in tps:
        for p in pps:
            # Context parallelism (kiln runs it without a pipeline) over GPUs left after tp and pp.
            cps = (
                [cp]
                if cp is not None
                else [1]
                if p > 1 or gpus % (t * p)
                else [
                    k
                    for k in divisors(gpus // (t * p))
                    if k == 1 or (seq_len % (2 * k) == 0 and seq_len // k >= MIN_CP_POSITIONS)
                ]
            )
            for c in cps:
                if gpus % (t * p * c) or (c > 1 and p > 1):
                    continue
                dp = gpus // (t * p * c)
                if global_batch is None:
                    m = 4 * p if p > 1 else 1
                elif global_batch % (dp * micro_batch):
                    batch_mismatch.append(dp)
                    continue
                else:
                    m = global_batch // (dp * micro_batch)
                # kiln shards a context-parallel group with FSDP2 (ZeRO 2 or 3 over dp x cp).
                zeros = (
                    [zero]
                    if zero is not None
                    else ([2, 3] if c > 1 else [0] if dp == 1 else [1] if p > 1 else [1, 2, 3])
                )
                for z in zeros:
                    if dp * c == 1 and z > 0 or (c > 1 and z < 2):
                        # nothing to shard, or a group kiln shards anyway (a ZeRO stage asked for rules these out)
                        continue
                    for ck in recomputes:
                        mem = plan_memory(
                            shape,
                            dp,
                            t,
                            p,
                            z,
                            micro_batch,
                            seq_len,
                            precision,
                            ck,
                            True,
                            gpu_memory_gb,
                            micro_batches=m,
                            attention=attention,
                            headroom=headroom,
                            cp=c,
                        )
                        cand = {
                            "tp": t,
                            "pp": p,
                            "cp": c,
                            "dp": dp,
                            "zero": z,
                            "activation_checkpointing": ck,
                            "micro_batches": m,
                            "memory": mem,
                        }
                        (fits if mem["fits"] else tried).append(cand)
    if not fits:
        if not tried and zero:
            raise ConfigError(
                f"zero = {zero} shards over data-parallel ranks, but every layout of {gpus} "
                f"GPU{'s' if gpus != 1 else ''} with these degrees leaves dp = 1 (nothing to shard); use zero 0 "
                "(--zero 0), more GPUs, or a smaller tp or pp"
            )
        if not tried and batch_mismatch:
            raise ConfigError(
                f"global_batch = {global_batch} is not divisible by dp * micro_batch for any layout (dp would be "
                f"one of {sorted(set(batch_mismatch))}, micro_batch {micro_batch}); choose a global batch that is "
                f"a multiple of {min(batch_mismatch) * micro_batch}"
            )
        best = min(tried, key=lambda c: c["memory"]["total_gb"])
        usable = best["memory"]["usable_gb"]
        raise ConfigError(
            f"no layout of {gpus} GPU{'s' if gpus != 1 else ''} with {gpu_memory_gb:g} GB each fits "
            f"{shape.params:.3g} parameters at micro_batch {micro_batch} x seq_len {seq_len}: "
            f"the smallest needs {best['memory']['total_gb']:.1f} GB per GPU ({_summary(best)}), above the "
            f"{usable:.1f} GB usable ({headroom:.0%} headroom); "
            "use more GPUs, GPUs with more memory, or a shorter seq_len or micro_batch"
        )
    choice = min(fits, key=_rank)
    ahead = sorted((c for c in tried if _rank(c) < _rank(choice)), key=_rank)
    asked = {
        k
        for k, v in (("tp", tp), ("pp", pp), ("cp", cp), ("zero", zero), ("activation_checkpointing", checkpointing))
        if v is not None
    }
    result = describe(
        choice,
        ahead,
        shape,
        gpus,
        node,
        micro_batch,
        len(fits) + len(tried),
        global_batch,
        sorted(set(batch_mismatch), reverse=True),
        asked,
    )
    result["recipe"] = recipe_keys(result, seq_len)
    if choice["zero"] == 1 and choice["pp"] == 1 and choice["cp"] == 1:  # what kiln's replicas need instead
        ddp = plan_memory(
            shape,
            choice["dp"],
            choice["tp"],
            choice["pp"],
            0,
            micro_batch,
            seq_len,
            precision,
            choice["activation_checkpointing"],
            True,
            gpu_memory_gb,
            micro_batches=choice["micro_batches"],
            attention=attention,
            headroom=headroom,
        )
        result["warnings"].append(
            "kiln has no ZeRO-1: the recipe keys run replicas (DDP) with full optimizer states, "
            f"{ddp['total_gb']:.1f} GB per GPU, which {'fits' if ddp['fits'] else 'does not fit'} in "
            f"{ddp['usable_gb']:.1f} GB; --zero 2 or 3 shards them with FSDP2"
        )
    return result


def planner_layout(degrees: dict[str, int], reshard_after_forward: bool) -> dict[str, int]:
    """The planner's dp, tp, pp, cp and ZeRO stage for a kiln layout (kiln.train.mesh's degrees),
    the inverse of recipe_keys: FSDP2 is ZeRO-1 over a pipeline stage's data ranks, else ZeRO-3
    resharding after forward and ZeRO-2 without; replicas alone are ZeRO-0. Under HSDP the states
    are sharded over dp_shard only, so that is the dp the memory sees (the planner shards over
    dp x cp with context parallelism, as FSDP2 does over dp_shard x cp)."""
    pp, shard, cp = degrees.get("pp", 1), degrees["dp_shard"], degrees.get("cp", 1)
    zero = 0 if shard * cp == 1 else 1 if pp > 1 else 3 if reshard_after_forward else 2
    return {
        "dp": shard if zero else degrees["dp_replicate"],
        "tp": degrees.get("tp", 1),
        "pp": pp,
        "cp": cp,
        "zero": zero,
    }


def recipe_keys(r: dict[str, Any], seq_len: int) -> dict[str, Any]:
    """How kiln runs a layout: the `parallel` and `train` keys (`kiln train --set KEY=VALUE`)."""
    sharded = r["zero"] >= 2 or (r["zero"] == 1 and r["pp"] > 1)  # FSDP2 over a stage's data ranks is ZeRO-1
    keys: dict[str, Any] = {
        "parallel.pp": r["pp"],
        "parallel.dp_replicate": 1 if sharded else r["dp"],
        "parallel.dp_shard": r["dp"] if sharded else 1,
        "parallel.cp": r["cp"],
        "parallel.tp": r["tp"],
    }
    if r["zero"] >= 2:
        keys["parallel.reshard_after_forward"] = r["zero"] == 3
    if r["tp"] > 1:
        keys["parallel.sequence_parallel"] = r["pp"] == 1  # kiln's stages pass whole hidden states
    keys |= {
        "train.activation_checkpointing": r["activation_checkpointing"],
        "train.micro_batch_size": r["micro_batch"],
        "train.seq_len": seq_len,
        "train.global_batch_tokens": r["global_batch"] * seq_len,
    }
    return keys


def describe(
    c: dict[str, Any],
    ahead: list[dict[str, Any]],
    shape: Shape,
    gpus: int,
    node: int,
    micro_batch: int,
    checked: int,
    global_batch: int | None = None,
    ruled_out_dp: list[int] | None = None,
    asked: set[str] | frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """The layout's result dict: degrees, memory, reasons (why each choice) and warnings."""
    t, p, cp, dp, z, ck, m = (
        c["tp"],
        c["pp"],
        c["cp"],
        c["dp"],
        c["zero"],
        c["activation_checkpointing"],
        c["micro_batches"],
    )
    mem = c["memory"]
    traffic = dp_traffic(z, m) if dp * cp > 1 else None
    bubble = bubble_fraction(p, m)
    reasons = []
    if ruled_out_dp:
        reasons.append(
            f"global_batch = {global_batch} rules out dp = {', '.join(map(str, ruled_out_dp))} (not divisible by "
            f"dp x micro_batch {micro_batch})"
        )
    if ahead:
        s = ahead[-1]  # the layout ranked just ahead of the choice
        reasons.append(
            f"{len(ahead)} preferred layout{'s do' if len(ahead) > 1 else ' does'} not fit; the closest ahead of "
            f"this one, {_summary(s)}, needs {s['memory']['total_gb']:.1f} GB > {mem['usable_gb']:.1f} GB usable"
        )
    if t > 1:
        reasons.append(
            f"tp={t}: each layer's matmuls split over {t} GPUs inside one {node}-GPU node (tp divides the "
            f"{shape.n_heads} heads); sequence parallelism on"
        )
    elif p == 1:
        reasons.append("tp=1: every GPU holds whole layers; no tensor splitting needed")
    else:
        reasons.append(
            "tp=1: no tensor parallelism"
            + (" (as asked)" if "tp" in asked else "")
            + "; the pipeline splits the model by layers instead"
        )
    if p == 1:
        reasons.append("pp=1: no pipeline, so no bubble")
    else:
        reasons.append(
            f"pp={p}: {shape.n_layers // p} layers per stage{' across nodes' if t * p > node else ''}; {m} "
            f"micro-batch{'es' if m != 1 else ''} per step leave a {bubble:.1%} bubble"
        )  # type: ignore[operator]
    if cp > 1:
        reasons.append(
            (
                f"cp={cp}: each sequence's {mem['seq_len']} positions split over {cp} GPUs ({mem['seq_len'] // cp} "
                "each), which gather every layer's keys and values"
            )
            + (" (as asked)" if "cp" in asked else "; cheaper than full recompute where whole sequences do not fit")
        )
    reasons.append(
        f"dp={dp}: the remaining GPUs each train on their own micro-batches"
        if dp > 1
        else f"dp=1: no data parallelism; tp x pp{' x cp' if cp > 1 else ''} uses every GPU"
    )
    why = " (as asked)" if "zero" in asked else ", needed to fit"
    if z == 0:
        reasons.append(
            "ZeRO-0: a single data-parallel replica, nothing to shard"
            if dp == 1
            else "ZeRO-0 (plain DDP): every replica keeps full optimizer states; one gradient all-reduce per step"
            + (" (as asked)" if "zero" in asked else "")
        )
    elif z == 1:
        reasons.append(
            f"ZeRO-1: optimizer states sharded over dp={dp}; a reduce-scatter of gradients and an all-gather of "
            "weights per step move the same bytes as DDP's all-reduce"
        )
    elif z == 2 and m == 1:
        reasons.append(f"ZeRO-2: gradients sharded too; with one micro-batch per step, the same traffic as DDP{why}")
    elif z == 2:
        reasons.append(
            f"ZeRO-2: gradients sharded too; with {m} micro-batches per step they are reduce-scattered after "
            "every micro-batch "
            f"({traffic:.1f}x DDP's data-parallel traffic; keeping full gradients until the step would lose the "
            f"memory saved){why}"
        )
    else:
        reasons.append(
            "ZeRO-3 (FSDP full shard): weights sharded too; all-gathered for forward and backward and gradients "
            f"reduce-scattered for each of the {m} micro-batch{'es' if m != 1 else ''} "
            f"({traffic:.1f}x DDP's data-parallel traffic){why}"
        )
    reasons.append(
        {
            "none": "no activation recompute: activations fit"
            + (" (flash attention never stores the s x s scores)" if mem["attention"] == "flash" else ""),
            "selective": "selective recompute of attention scores (a few percent of compute)"
            + (": with flash attention it stores the same as none" if mem["attention"] == "flash" else ""),
            "full": "full recompute (about 33% more compute)"
            + (" (as asked)" if "activation_checkpointing" in asked else ", needed to fit"),
        }[ck]
    )
    warnings = list(mem["warnings"])
    if bubble > MAX_BUBBLE:
        target = 4 * p * dp * micro_batch
        warnings.append(
            f"pipeline bubble {bubble:.0%}: {m} micro-batch{'es' if m != 1 else ''} per step for {p} stages; a "
            f"global batch of {target} sequences (4 x pp micro-batches per data-parallel rank) brings it to "
            f"{bubble_fraction(p, 4 * p):.0%}"
        )
    return {
        "params": shape.params,
        "gpus": gpus,
        "gpus_per_node": node,
        "nodes": max(1, gpus // node),
        "tp": t,
        "pp": p,
        "cp": cp,
        "dp": dp,
        "zero": z,
        "activation_checkpointing": ck,
        "attention": mem["attention"],
        "micro_batch": micro_batch,
        "micro_batches": m,
        "global_batch": m * dp * micro_batch,
        "bubble_fraction": bubble,
        "dp_traffic_vs_ddp": traffic,
        "total_gb": mem["total_gb"],
        "gpu_memory_gb": mem["gpu_memory_gb"],
        "headroom": mem["headroom"],
        "usable_gb": mem["usable_gb"],
        "fits": True,
        "memory": mem,
        "reasons": reasons,
        "warnings": warnings,
        "layouts_checked": checked,
    }


def format_layout(r: dict[str, Any]) -> str:
    mem = r["memory"]
    rows = [
        ("parameters", count(r["params"])),
        ("GPUs", f"{r['gpus']} ({r['nodes']} node{'s' if r['nodes'] != 1 else ''} of {r['gpus_per_node']})"),
        ("tensor parallel (tp)", str(r["tp"])),
        ("pipeline parallel (pp)", str(r["pp"])),
        ("context parallel (cp)", str(r["cp"])),
        ("data parallel (dp)", str(r["dp"])),
        ("ZeRO stage", str(r["zero"])),
        ("activation recompute", f"{r['activation_checkpointing']} ({r['attention']} attention)"),
        ("micro-batch (sequences)", str(r["micro_batch"])),
        ("micro-batches per step", str(r["micro_batches"])),
        ("global batch (sequences)", str(r["global_batch"])),
        ("pipeline bubble (share of step)", f"{r['bubble_fraction']:.1%}"),
        (
            "data-parallel traffic (x DDP)",
            "n/a (dp=1)" if r["dp_traffic_vs_ddp"] is None else f"{r['dp_traffic_vs_ddp']:.1f}",
        ),
        (
            "memory per GPU (GB)",
            (
                f"{fixed(mem['total_gb'])} of {fixed(r['usable_gb'])} usable ({r['gpu_memory_gb']:g} less "
                f"{r['headroom']:.0%} headroom; states {fixed(mem['model_states_gb'])}, activations "
                f"{fixed(mem['activations_gb'])})"
            ),
        ),
        (
            "kiln train",
            " ".join(f"--set {k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in r["recipe"].items()),
        ),
    ]
    return table(rows, r["reasons"], label="why", warnings=r["warnings"])
