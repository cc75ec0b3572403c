"""A synthetic run directory of any size for the report tests: train metrics of `steps` steps over
`sources` sources (with evaluations, mixture windows and two rollbacks) and a curate manifest with
their funnel. Written with string templates: a million steps take a few seconds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kiln.model.config import ModelConfig
from kiln.train.config import TrainConfig

STEP_LINE = (
    '{"step": %d, "loss": %.5f, "loss_by_source": {"%s": %.5f, "%s": %.5f}, "lr": %.6g, "grad_norm": %.5f, '
    '"tokens": 524288, "seq_len": 2048, '
    '"tokens_per_s": %.1f, "mfu": %.4f, "data_wait_s": 0.0012, "peak_memory_mb": 61234.5, "rollbacks": 0, '
    '"elapsed_s": %.3f}\n'
)


def write_run(run_dir: Path, steps: int, sources: int, eval_every: int = 1000, windows: int = 100) -> Path:
    names = [f"source{i:03d}" for i in range(sources)]
    train = run_dir / "train"
    train.mkdir(parents=True)
    spikes = {
        steps // 3: "loss spike: 9.1000 > 2 x 3.2000, the median of the last 50 steps",
        2 * steps // 3: "loss is nan",
    }
    step = np.arange(1, steps + 1)
    loss = 3.0 + 6.0 / np.sqrt(step) + 0.01 * (step % 7)
    columns = zip(
        step.tolist(),
        loss.tolist(),
        [names[i] for i in ((step * 31 + step // 1000) % sources)],
        (loss + 0.1).tolist(),
        [names[i] for i in ((step * 7 + step // 977) % sources)],
        (loss - 0.1).tolist(),
        (3e-4 * np.minimum(1.0, step / 2000)).tolist(),
        (1.0 + 5.0 / np.sqrt(step)).tolist(),
        (400000 + (step % 97) * 100.0).tolist(),
        (0.41 + (step % 13) * 0.001).tolist(),
        (step * 1.31).tolist(),
        strict=True,
    )
    window = max(1, steps // windows)
    share = json.dumps({s: round(1 / sources, 4) for s in names})
    window_tokens = json.dumps({s: 524288 * window // sources for s in names})
    with open(train / "metrics.jsonl", "w", encoding="utf-8") as f:
        lines = []
        for row in columns:
            lines.append(STEP_LINE % row)
            n = row[0]
            if n % eval_every == 0:
                per = ", ".join(
                    f'"{s}": {{"loss": {row[1] + i * 0.001:.5f}, "bpb": 1.1, "tokens": 4096, "bytes": 16000}}'
                    for i, s in enumerate(names)
                )
                lines.append(
                    f'{{"step": {n}, "kind": "periodic", "eval": {{"sources": {{{per}}}, "all": {{"loss": '
                    f'{row[1]:.5f}, "bpb": 1.1, "tokens": 409600, "bytes": 1600000}}}}}}\n'
                )
            if n % window == 0:
                lines.append(
                    f'{{"step": {n}, "mixture": {{"steps": [{n - window + 1}, {n}], "tokens": {window_tokens}, '
                    f'"share": {share}, "intended": {share}}}}}\n'
                )
            if n in spikes:
                lines.append(
                    json.dumps(
                        {
                            "step": n - 10,
                            "kind": "rollback",
                            "rollback": {
                                "at_step": n,
                                "to_step": n - 10,
                                "reason": spikes[n],
                                "rows": [n * 3, n * 3 + 1],
                                "sources": [row[2], row[4]],
                                "rollbacks": 1,
                            },
                        }
                    )
                    + "\n"
                )
            if len(lines) >= 10000:
                f.write("".join(lines))
                lines = []
        f.write("".join(lines))
    (train / "manifest.json").write_text(
        json.dumps(
            {
                "format": "kiln-manifest v1",
                "stage": "train",
                "config": {
                    "train": TrainConfig(seq_len=2048, micro_batch_size=8, global_batch_tokens=524288).model_dump(
                        mode="json"
                    )
                },
                "inputs": [],
                "upstream": {"tokenize": "e" * 64},
                "outputs": [],
                "counts": {
                    "device": "cuda:0",
                    "device_name": "NVIDIA H100 80GB HBM3",
                    "steps": steps,
                    "processes": 8,
                    "flops_per_token": 6 * 10**9,
                    "tokens_trained": 524288 * steps,
                    "train_flops": 6 * 10**9 * 524288 * steps,
                },
                "model": ModelConfig(
                    vocab_size=32768, d_model=2048, n_layers=16, n_heads=16, n_kv_heads=8, max_seq_len=2048
                ).model_dump(mode="json"),
                "fingerprint": "d" * 64,
            }
        )
    )
    curate = run_dir / "curate"
    curate.mkdir()
    per_source = {
        s: {
            "docs_in": 1000 + i,
            "docs_out": 800,
            "bytes_in": 10**7,
            "bytes_out": 8 * 10**6,
            "removed": {"gopher_quality:too_few_words": 150 + i, "exact_dedup:duplicate": 50},
            "removed_bytes": {"gopher_quality:too_few_words": 10**6, "exact_dedup:duplicate": 10**6},
            "quarantined": 0,
            "stats": {"language:en": 700, "language:de": 100},
            "funnel": {
                "read": {"docs": 1000 + i, "bytes": 10**7},
                "gopher_quality": {"docs": 850, "bytes": 9 * 10**6},
                "exact_dedup": {"docs": 800, "bytes": 8 * 10**6},
            },
        }
        for i, s in enumerate(names)
    }
    counts = {
        "docs_in": sum(t["docs_in"] for t in per_source.values()),
        "docs_out": 800 * sources,
        "bytes_in": 10**7 * sources,
        "bytes_out": 8 * 10**6 * sources,
        "removed": {
            "gopher_quality:too_few_words": sum(150 + i for i in range(sources)),
            "exact_dedup:duplicate": 50 * sources,
        },
        "quarantined": 0,
        "stats": {},
        "per_source": per_source,
        "minhash": {},
    }
    (curate / "manifest.json").write_text(
        json.dumps(
            {
                "format": "kiln-manifest v1",
                "stage": "curate",
                "config": {},
                "inputs": [],
                "upstream": {},
                "outputs": [],
                "counts": counts,
                "fingerprint": "f" * 64,
            }
        )
    )
    return run_dir
