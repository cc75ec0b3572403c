"""Peak memory of `kiln import-hf` and `kiln export` on a large Hugging Face folder: both stream.

A synthetic Llama of about `--params` parameters (default 1e9: d_model 2048, 32,000 tokens, as many
layers as the count allows) is written in bf16 as a Hugging Face folder (config.json from
kiln.model.hf, safetensors shards of `--shard-mb` with model.safetensors.index.json, random
normal weights, written tensor by tensor so writing it holds one tensor), with a small kiln
tokenizer beside it. Then `kiln import-hf DIR --run NAME` and `kiln export` of that run
(`--export-dtype`, default bf16: the same size out as in) each run in a child process; each
child's peak resident memory is its rusage ru_maxrss (os.wait4), wall time is timed around both;
`kiln --help` gives the memory any kiln process starts with.
The goal: the peak stays within the model's size in its stored dtype plus one shard.
The folder, the run and the export are in a temporary folder, removed at the end (about 3x the
model's size on disk at once).

    .venv/bin/python benchmarks/import_export_memory.py                  # 1B: about 4 GB of disk, a few minutes
    .venv/bin/python benchmarks/import_export_memory.py --params 5e7     # seconds

Ends with: RESULT peak_rss_mb=.. model_mb=.. seconds=.. (MB = 1e6 bytes; peak over import and export).
Not measured: a GPU, remote storage, the page cache (file pages the kernel keeps are not the process's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from kiln.model.config import ModelConfig, count_params
from kiln.model.hf import hf_config, hf_name
from kiln.model.safetensors_stream import SafetensorsWriter, TensorSpec, shard_groups
from kiln.model.weights import parameter_shapes
from kiln.text.specials import special_tokens
from kiln.text.tokenizer import train_bpe

MB = 1e6
VOCAB = 32000
TEXT = "def parse(value):\n    return value.strip().split(',')\n\nThe quick brown fox jumps over the lazy dog.\n"


def model_config(params: float) -> ModelConfig:
    """A Llama of about `params` parameters: 2048 wide at 1e9 (width as the square root of the count),
    64-wide heads, 4 query heads per key/value head, a SwiGLU of 2.75 times the width."""
    d = max(256, round(2048 * (params / 1e9) ** 0.5 / 256) * 256)
    base = ModelConfig(
        vocab_size=VOCAB,
        d_model=d,
        n_layers=1,
        n_heads=d // 64,
        n_kv_heads=d // 256,
        ffn_hidden=round(2.75 * d / 256) * 256,
    )
    per_layer = count_params(base.model_copy(update={"n_layers": 2})) - count_params(base)
    layers = max(1, round((params - count_params(base) + per_layer) / per_layer))
    return base.model_copy(update={"n_layers": layers, "max_seq_len": 2048})


def write_folder(folder: Path, cfg: ModelConfig, shard_mb: float) -> int:
    """The Hugging Face folder of `cfg` in bf16, tensor by tensor; returns the weights' bytes."""
    tok = train_bpe([TEXT] * 30, vocab_size=400, min_frequency=2, specials=special_tokens(1, 0))
    tok.save(folder / "tokenizer.json")
    config = hf_config(cfg, tok.eot_id, tok.pad_id) | {"torch_dtype": "bfloat16"}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    specs = [TensorSpec(hf_name(k), torch.bfloat16, shape) for k, shape in parameter_shapes(cfg).items()]
    groups = shard_groups(specs, int(shard_mb * MB))
    names = [f"model-{i:05d}-of-{len(groups):05d}.safetensors" for i in range(1, len(groups) + 1)]
    for name, group in zip(names, groups, strict=True):
        with SafetensorsWriter(folder / name, group, {"format": "pt"}) as out:
            for spec in group:
                norm = spec.name.endswith("norm.weight")
                tensor = torch.ones(spec.shape, dtype=spec.dtype) if norm else torch.empty(spec.shape, dtype=spec.dtype)
                out.write(spec.name, tensor if norm else tensor.normal_(0.0, 0.02))
    total = sum(s.nbytes for s in specs)
    weight_map = {s.name: name for name, group in zip(names, groups, strict=True) for s in group}
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return total


def peak_rss_mb(args: list[str]) -> tuple[float, float]:
    """Run `kiln ARGS` in a child; its peak resident memory (MB) and wall seconds. Stops on failure."""
    t0 = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "kiln", *args], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage, not every child's maximum
    seconds = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"kiln {' '.join(args)} failed with exit code {os.waitstatus_to_exitcode(status)}")
    return usage.ru_maxrss * 1024 / MB, seconds  # ru_maxrss is in KiB on Linux


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", type=float, default=1e9, help="Parameters of the synthetic model (about).")
    p.add_argument("--shard-mb", type=float, default=500, help="Shard size of the synthetic folder, MB.")
    p.add_argument("--export-dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--dir", default=None, help="Where the temporary folder goes (default: the system's).")
    args = p.parse_args()
    cfg = model_config(args.params)
    root = Path(tempfile.mkdtemp(prefix="kiln-import-export-", dir=args.dir))
    try:
        folder = root / "hf"
        folder.mkdir()
        t0 = time.perf_counter()
        model_bytes = write_folder(folder, cfg, args.shard_mb)
        shards = len(list(folder.glob("model-*.safetensors")))
        print(
            f"synthetic Llama: {count_params(cfg):,} params ({cfg.n_layers} layers of {cfg.d_model}), "
            f"{model_bytes / MB:,.0f} MB bf16 in {shards} shards, written in {time.perf_counter() - t0:.1f} s"
        )
        idle_mb, _ = peak_rss_mb(["--help"])  # the interpreter, torch and kiln imported: in every figure below
        print(f"a kiln process that does nothing: peak RSS {idle_mb:,.0f} MB")
        where = ["--set", f"runs_dir={root / 'runs'}"]
        import_mb, import_s = peak_rss_mb(["-q", "import-hf", str(folder), "--run", "big", *where])
        print(f"import-hf: peak RSS {import_mb:,.0f} MB, {import_s:.1f} s")
        export_args = ["-q", "export", *where, "--set", "name=big", "--set", f"export.dtype={args.export_dtype}"]
        export_mb, export_s = peak_rss_mb(export_args)
        print(f"export ({args.export_dtype}): peak RSS {export_mb:,.0f} MB, {export_s:.1f} s")
        bound = (model_bytes + args.shard_mb * MB) / MB
        met = "met" if max(import_mb, export_mb) <= bound else "not met"
        print(f"goal: at most the model plus one shard, {bound:,.0f} MB: {met}")
        fields = {
            "peak_rss_mb": round(max(import_mb, export_mb)),
            "model_mb": round(model_bytes / MB),
            "seconds": round(import_s + export_s, 1),
        }
        print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
