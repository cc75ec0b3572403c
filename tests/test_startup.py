"""What `kiln` imports before any work, checked in a fresh interpreter: no torch for the verbs that need none.

Importing torch takes about 1.6 s (2 cores): `kiln --version` took 2.1 to 2.5 s while a recipe
section's module imported the module that computes with torch, 0.6 s without it, and every curate
and tokenize run paid it too (benchmarks/startup.py). One child process parses `--version` and the
help of the torch-free verbs, validates a whole recipe (every section, train's and eval's
included), then curates two small files, trains a tokenizer and tokenizes them, all in-process,
and stops at the first of these that imported torch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TEXTS = {
    "harbour.txt": (
        "The harbour was quiet on the morning the ferry came back. A few fishermen mended their nets on the quay. "
        "An old dog slept in the sun beside a stack of empty crates. Nobody expected the boat so early. The first "
        "passengers found the ticket office still locked and had to wait on the benches outside.\n\n"
        "By noon the town was busy again. Children ran between the stalls of the market. A baker sold the last of "
        "his bread, and the harbour master walked along the pier with a notebook. He wrote down the names of the "
        "boats that had come in during the night.\n\nIn the evening the wind turned and the fishing boats went out "
        "again. Their lights could be seen from the hill until well after midnight."
    ),
    "garden.txt": (
        "Tomatoes need a warm, sheltered spot and plenty of water once the fruit begins to form. Plant them out "
        "after the last frost. Tie each stem to a cane as it grows. Pinch out the side shoots every week, so that "
        "the plant puts its strength into the fruit.\n\nFeed them with a liquid fertiliser when the first flowers "
        "open. Water at the base in the evening rather than over the leaves. If the summer turns cold and wet, "
        "pick the green fruit before the first night frost. It will ripen slowly on a sunny windowsill.\n\nSave a "
        "few seeds from the best plants each year. Dry them on paper and keep them in a cool, dark drawer."
    ),
}

CHILD = """
import contextlib, io, sys

def check(what):
    if "torch" in sys.modules:
        sys.exit(f"torch imported by {what}")

from kiln.cli import main
check("importing kiln.cli")
folder, = sys.argv[1:]
for argv in (["--version"], ["--help"], ["curate", "--help"], ["train-tokenizer", "--help"], ["tokenize", "--help"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main(argv)
    check(f"kiln {' '.join(argv)}")
from kiln.recipe import load_recipe
load_recipe("demo", [f"runs_dir={folder}/runs"])
check("validating the demo recipe (every section)")
runs = ["--set", f"runs_dir={folder}/runs"]
common = ["--set", "name=tiny", *runs]
steps = (
    # one worker: the tasks run inline, in this process, as each spawned worker would run them
    ["curate", "--input", f"{folder}/notes/*.txt", "--run", "tiny", *runs, "--set", "curate.executor.workers=1"],
    ["train-tokenizer", *common, "--set", "tokenizer.vocab_size=311"],  # the least beside the specials: 1.3 KB
    ["tokenize", *common, "--set", "tokenize.val_fraction=0.5"],
)
for argv in steps:
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["-q", *argv]) == 0, argv
    check(f"kiln {argv[0]}")
"""


def test_cli_curate_and_tokenize_import_no_torch(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    for name, text in TEXTS.items():
        (tmp_path / "notes" / name).write_text(text + "\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "runs" / "tiny" / "tokenize" / "manifest.json").exists()
