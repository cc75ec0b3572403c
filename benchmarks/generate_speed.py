"""Decoding tokens/s: kiln with its KV cache, kiln without it, and transformers' generate on the exported model.

The run's checkpoint (default: the demo's) is exported with kiln's own exporter (kiln.evaluate.export)
to a temporary folder and loaded with `AutoModelForCausalLM.from_pretrained`, so both sides hold
the same weights. Prompts are the first `--prompt-tokens` tokens of the run's validation documents
(real text), `--batch` of them decoded together, left-padded; greedy, `--new-tokens` new tokens,
stopping at end of document on both sides (transformers: eos_token_id and pad_token_id from the
exported generation config). Three measurements take turns `--repeats` times on the same prompts;
the best of each counts; tokens/s counts the new tokens each produced (end of document excluded).
The greedy token ids of kiln and transformers are compared: the same ids mean the same work.
Both run fp32 on the CPU with torch's default threads (or the GPU when one is present).

    .venv/bin/python benchmarks/generate_speed.py                 # about 2 min on 2 CPU cores
    .venv/bin/python benchmarks/generate_speed.py --batch 8

Ends with: RESULT kiln_cached_tokens_per_s=.. kiln_uncached_tokens_per_s=.. hf_tokens_per_s=..
cache_speedup=.. ratio_vs_hf=.. (kiln cached over transformers) same_tokens=.. batch=.. new_tokens=..
Goal on a CPU: kiln with its cache at least as fast as transformers (ratio_vs_hf >= 1).
Not measured: sampling (the filters are the same per-step work on both sides), bf16, long contexts.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import transformers

from kiln.core.layout import RunLayout
from kiln.core.tokenshards import TokenShard
from kiln.evaluate.config import GenerateConfig
from kiln.evaluate.export import write_hf_folder
from kiln.evaluate.generate import complete
from kiln.model.hf import architecture
from kiln.model.weights import load_trained_model
from kiln.text.tokenizer import KilnTokenizer

ROOT = Path(__file__).resolve().parent.parent


def prompts_from(run_dir: Path, tokenizer: KilnTokenizer, n: int, tokens: int) -> list[str]:
    """The first `tokens` tokens of n validation documents, as text, from the run's largest source."""
    layout = RunLayout(run_dir)
    prompts: list[str] = []
    for prefix in sorted(layout.token_shards.glob("*/val.idx")):
        shard = TokenShard(prefix.with_suffix(""))
        for doc in range(shard.n_docs):
            ids = shard.document(doc)[:tokens].tolist()
            if len(ids) == tokens:
                prompts.append(tokenizer.decode(ids))
            if len(prompts) == n:
                return prompts
    raise SystemExit(f"{run_dir}: fewer than {n} validation documents of {tokens}+ tokens")


def time_kiln(
    model: torch.nn.Module, tokenizer: KilnTokenizer, prompts: list[str], cfg: GenerateConfig
) -> tuple[float, int, list[list[int]]]:
    t0 = time.perf_counter()
    done = complete(model, tokenizer, prompts, cfg)  # type: ignore[arg-type]
    seconds = time.perf_counter() - t0
    return seconds, sum(c.new_tokens for c in done), [list(c.ids) for c in done]


def time_hf(
    model: transformers.PreTrainedModel,
    hf_tok: transformers.PreTrainedTokenizerBase,
    prompts: list[str],
    new_tokens: int,
    eot: int,
    pad: int,
) -> tuple[float, int, list[list[int]]]:
    batch = hf_tok(prompts, return_tensors="pt", padding=True)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=new_tokens, do_sample=False, eos_token_id=eot, pad_token_id=pad)
    seconds = time.perf_counter() - t0
    new = [[t for t in row if t not in (eot, pad)] for row in out[:, batch["input_ids"].shape[1] :].tolist()]
    return seconds, sum(len(r) for r in new), new


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--run",
        type=Path,
        default=ROOT / "runs" / "demo",
        help="A run with a train checkpoint and token shards (`make demo`).",
    )
    parser.add_argument("--batch", type=int, default=1, help="Prompts decoded together.")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="Tokens per prompt.")
    parser.add_argument("--new-tokens", type=int, default=128, help="New tokens per prompt (at most).")
    parser.add_argument("--repeats", type=int, default=3, help="Turns of the three measurements; the best counts.")
    args = parser.parse_args()

    layout = RunLayout(args.run)
    model = load_trained_model(layout.checkpoint)
    tokenizer = KilnTokenizer.load(layout.tokenizer_json)
    prompts = prompts_from(args.run, tokenizer, args.batch, args.prompt_tokens)
    if args.prompt_tokens + args.new_tokens > model.cfg.max_seq_len:
        raise SystemExit(f"--prompt-tokens + --new-tokens must fit the model's context ({model.cfg.max_seq_len})")
    with tempfile.TemporaryDirectory(prefix="kiln-generate-speed-") as tmp:
        folder = Path(tmp)
        write_hf_folder(folder, model, tokenizer, GenerateConfig(temperature=0), "float32", "benchmark export\n")
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
        hf_tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True, padding_side="left")
    print(
        f"model: {architecture(model.cfg)}, {sum(p.numel() for p in model.parameters()):,} params, context "
        f"{model.cfg.max_seq_len}; "
        f"{args.batch} prompt(s) of {args.prompt_tokens} tokens, up to {args.new_tokens} new tokens, greedy; "
        f"{torch.get_num_threads()} threads; transformers {transformers.__version__}"
    )
    cfg = GenerateConfig(max_new_tokens=args.new_tokens, temperature=0, batch_size=args.batch)
    runs = {
        "kiln_cached": lambda: time_kiln(model, tokenizer, prompts, cfg),
        "kiln_uncached": lambda: time_kiln(model, tokenizer, prompts, cfg.model_copy(update={"use_cache": False})),
        "hf": lambda: time_hf(hf, hf_tok, prompts, args.new_tokens, tokenizer.eot_id, tokenizer.pad_id),
    }
    best: dict[str, float] = {}
    ids: dict[str, list[list[int]]] = {}
    for fn in runs.values():  # untimed warm-up of each
        fn()
    for r in range(args.repeats):
        for name, fn in runs.items():
            seconds, n, ids[name] = fn()
            best[name] = max(best.get(name, 0.0), n / seconds)
            print(
                f"repeat {r + 1}  {name:<14} {n:>5} tokens in {seconds:6.2f} s  {n / seconds:8.1f} tokens/s", flush=True
            )
    same = ids["kiln_cached"] == ids["hf"] == ids["kiln_uncached"]
    print(f"greedy tokens identical (kiln cached, kiln uncached, transformers): {same}")
    print(
        f"kiln with its cache / transformers: {best['kiln_cached'] / best['hf']:.2f} (goal on a CPU: >= 1); cache "
        f"speed-up {best['kiln_cached'] / best['kiln_uncached']:.2f}"
    )
    fields = {
        "kiln_cached_tokens_per_s": f"{best['kiln_cached']:.1f}",
        "kiln_uncached_tokens_per_s": f"{best['kiln_uncached']:.1f}",
        "hf_tokens_per_s": f"{best['hf']:.1f}",
        "cache_speedup": f"{best['kiln_cached'] / best['kiln_uncached']:.2f}",
        "ratio_vs_hf": f"{best['kiln_cached'] / best['hf']:.2f}",
        "same_tokens": str(same).lower(),
        "batch": args.batch,
        "new_tokens": args.new_tokens,
    }
    print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()))


if __name__ == "__main__":
    main()
