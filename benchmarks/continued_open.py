"""Continued pretraining of an open model, end to end: recipes/open-replay.yaml, then recipes/continued-open.yaml.

kiln downloads nothing, so the open model is built here as the tests build one: a random
`LlamaForCausalLM` from transformers' own class and config (SmolLM2's shape scaled down: d_model
256, 4 layers, 4 query and 2 key/value heads, SwiGLU 704, tied embeddings, RoPE base 100,000),
stored in bf16 as sharded safetensors with an index, beside its own byte-level BPE tokenizer
(GPT-2's pre-split, `--vocab` tokens, trained with `tokenizers` on the standard library's code
and saved by transformers' save_pretrained). In a fresh folder, with the kiln command line:
`kiln import-hf FOLDER --run open-base`; open-replay's curate, train-tokenizer and tokenize (the
replayed general text); `kiln demo --recipe continued-open` (`--steps`, default the recipe's).
Prints the train summary's table of each source's validation loss before and after, and ends with:
RESULT domain_change=.. replay_change=.. replay_share=.. seconds=..
(domain: the mean change over this run's sources; replay: over the replayed ones; nats per token).

    .venv/bin/python benchmarks/continued_open.py              # about 6 minutes on 2 cores
    .venv/bin/python benchmarks/continued_open.py --steps 30 --mb 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

KILN = Path(sys.executable).with_name("kiln")
EOS = "<|endoftext|>"


def code_text(mb: float) -> list[str]:
    """About `mb` MB of the standard library's modules, in path order."""
    texts, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        texts.append(path.read_text(encoding="utf-8", errors="replace"))
        size += len(texts[-1])
        if size > mb * 1e6:
            break
    return texts


def open_model(folder: Path, vocab: int) -> None:
    """The tokenizer and the random bf16 model, saved as a Hugging Face folder."""
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(code_text(8), trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS).save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder, max_shard_size="5MB")


def kiln(work: Path, *args: str) -> None:
    done = subprocess.run([str(KILN), *args], cwd=work, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"kiln {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=None, help="train.steps (default: the recipe's 150)")
    parser.add_argument("--mb", type=float, default=None, help="curate.max_total_mb of both runs (default: 20)")
    parser.add_argument("--vocab", type=int, default=8192, help="the open model's vocabulary")
    args = parser.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kiln-continued-open-") as tmp:
        work = Path(tmp)
        open_model(work / "open-model", args.vocab)
        kiln(work, "import-hf", str(work / "open-model"), "--run", "open-base")
        cap = ["--set", f"curate.max_total_mb={args.mb}"] if args.mb else []
        for verb in ("curate", "train-tokenizer", "tokenize"):
            kiln(work, verb, "--recipe", "open-replay", *cap)
        steps = ["--set", f"train.steps={args.steps}"] if args.steps else []
        kiln(work, "demo", "--recipe", "continued-open", *cap, *steps)
        counts = json.loads((work / "runs" / "continued-open" / "train" / "manifest.json").read_text())["counts"]
    change = counts["val_change"]
    read = counts["tokens_by_source"]
    replay_share = sum(n for s, n in read.items() if "/" in s) / sum(read.values())
    print("| source | before | after | change |\n| --- | --- | --- | --- |")
    for source, c in change.items():
        kind = "replayed" if "/" in source else "domain"
        print(f"| {source} ({kind}) | {c['before']:.3f} | {c['after']:.3f} | {c['change']:+.3f} |")
    domain = [c["change"] for s, c in change.items() if "/" not in s]
    replay = [c["change"] for s, c in change.items() if "/" in s]
    print(
        f"RESULT domain_change={sum(domain) / len(domain):.3f} replay_change={sum(replay) / len(replay):.3f} "
        f"replay_share={replay_share:.3f} seconds={time.perf_counter() - t0:.0f}"
    )


if __name__ == "__main__":
    main()
