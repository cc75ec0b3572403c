"""kiln's multiple-choice scoring against lm-evaluation-harness on the same exported model and task.

The task is built from the run's validation code (default: the demo's): "which line comes next",
the previous `--context-lines` lines as the context, the true next line and three lines drawn
from other validation documents as the choices (the label's position drawn too), `--items` items,
seeded. It is written in kiln's task layout (context, choices, label) and scored twice:
  kiln      kiln.evaluate.choices.score_task on the run's checkpoint (delimiter "" between context
            and choice);
  lm_eval   the lm-evaluation-harness CLI (`--lm-eval`, installed separately: `pip install lm-eval`)
            on the folder `kiln export` writes, through a local task YAML (dataset_path json,
            doc_to_text {{context}}, doc_to_choice {{choices}}, doc_to_target {{label}},
            target_delimiter ""), fp32 on the CPU, per-item log-likelihoods logged.
Printed: both accuracies (lm_eval's acc and acc_norm, kiln's acc, acc_norm_char and acc_norm_token),
and the largest difference between the two tools' log-likelihoods of the same choice.

    .venv/bin/python benchmarks/choices_vs_lm_eval.py --lm-eval /path/to/venv/bin/lm_eval    # about 1 min

Ends with: RESULT items=.. kiln_acc=.. lm_eval_acc=.. kiln_acc_norm_char=.. lm_eval_acc_norm=..
kiln_acc_norm_token=.. max_loglik_diff=.. (nats)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import tempfile
from pathlib import Path

from kiln.core.layout import RunLayout
from kiln.core.tokenshards import open_split
from kiln.evaluate.choices import Item, encode_pair, loglikelihoods, score_task
from kiln.evaluate.config import GenerateConfig
from kiln.evaluate.export import write_hf_folder
from kiln.model.weights import load_trained_model
from kiln.text.tokenizer import KilnTokenizer

ROOT = Path(__file__).resolve().parent.parent
TASK_YAML = """task: kiln_next_line
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def next_line_task(run_dir: Path, tokenizer: KilnTokenizer, n_items: int, context_lines: int, seed: int) -> list[Item]:
    shards = open_split(RunLayout(run_dir).token_shards, "val")
    docs = [
        tokenizer.decode(shards["code"].document(i)[:-1].tolist()).split("\n") for i in range(shards["code"].n_docs)
    ]
    pool = [(d, line) for d, lines in enumerate(docs) for line in lines if len(line.strip()) >= 20]
    rng = random.Random(seed)
    candidates = [
        (d, i) for d, lines in enumerate(docs) for i in range(context_lines, len(lines)) if len(lines[i].strip()) >= 20
    ]
    items = []
    for d, i in rng.sample(candidates, min(n_items, len(candidates))):
        others = [line for doc, line in rng.sample(pool, 12) if doc != d and line != docs[d][i]][:3]
        choices = [docs[d][i], *others]
        rng.shuffle(choices)
        items.append(Item("\n".join(docs[d][i - context_lines : i]) + "\n", tuple(choices), choices.index(docs[d][i])))
    return items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--run",
        type=Path,
        default=ROOT / "runs" / "demo",
        help="A run with a train checkpoint and token shards holding a `code` source (`make demo`).",
    )
    parser.add_argument("--lm-eval", default="lm_eval", help="The lm-evaluation-harness command.")
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--context-lines", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    layout = RunLayout(args.run)
    model = load_trained_model(layout.checkpoint)
    tokenizer = KilnTokenizer.load(layout.tokenizer_json)
    items = next_line_task(args.run, tokenizer, args.items, args.context_lines, args.seed)
    kiln = score_task(model, tokenizer, items, delimiter="")
    ours = loglikelihoods(
        model, [encode_pair(tokenizer, it.context, c) for it in items for c in it.choices], batch_size=16
    )
    with tempfile.TemporaryDirectory(prefix="kiln-lm-eval-") as tmp:
        tmp_path = Path(tmp)
        data = tmp_path / "kiln_next_line.jsonl"
        data.write_text(
            "".join(
                json.dumps({"context": it.context, "choices": list(it.choices), "label": it.label}) + "\n"
                for it in items
            )
        )
        (tmp_path / "tasks").mkdir()
        (tmp_path / "tasks" / "kiln_next_line.yaml").write_text(TASK_YAML.format(data=data))
        folder = tmp_path / "model"
        folder.mkdir()
        write_hf_folder(folder, model, tokenizer, GenerateConfig(temperature=0), "float32", "lm-eval comparison\n")
        command = [
            args.lm_eval,
            "--model",
            "hf",
            "--model_args",
            f"pretrained={folder},dtype=float32",
            "--tasks",
            "kiln_next_line",
            "--include_path",
            str(tmp_path / "tasks"),
            "--device",
            "cpu",
            "--batch_size",
            "16",
            "--output_path",
            str(tmp_path / "out"),
            "--log_samples",
        ]
        print(" ".join(command), flush=True)
        env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp)
        if done.returncode != 0:
            raise SystemExit(f"lm_eval failed ({done.returncode}):\n{done.stderr[-3000:]}")
        results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())["results"]["kiln_next_line"]
        samples = [
            json.loads(line)
            for line in next((tmp_path / "out").rglob("samples_kiln_next_line_*.jsonl")).read_text().splitlines()
        ]
    theirs = {}
    for s in samples:  # per choice: [[loglik, is_greedy]]
        for j, resp in enumerate(s["resps"]):
            theirs[(s["doc_id"], j)] = float(resp[0][0])
    diffs, k = [], 0
    for i, it in enumerate(items):
        for j in range(len(it.choices)):
            diffs.append(abs(ours[k] - theirs[(i, j)]))
            k += 1
    lm_acc, lm_norm = results["acc,none"], results["acc_norm,none"]
    print(f"{len(items)} items, {sum(len(it.choices) for it in items)} choices")
    print(
        f"kiln:    acc {kiln['acc']:.4f}  acc_norm_char {kiln['acc_norm_char']:.4f}  acc_norm_token "
        f"{kiln['acc_norm_token']:.4f}"
    )
    print(f"lm_eval: acc {lm_acc:.4f}  acc_norm {lm_norm:.4f}")
    print(f"largest log-likelihood difference for the same choice: {max(diffs):.2e} nats")
    fields = {
        "items": len(items),
        "kiln_acc": kiln["acc"],
        "lm_eval_acc": round(lm_acc, 5),
        "kiln_acc_norm_char": kiln["acc_norm_char"],
        "lm_eval_acc_norm": round(lm_norm, 5),
        "kiln_acc_norm_token": kiln["acc_norm_token"],
        "max_loglik_diff": f"{max(diffs):.2e}",
    }
    print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()))


if __name__ == "__main__":
    main()
