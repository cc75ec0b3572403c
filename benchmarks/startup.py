"""Start-up time of `kiln` commands, and which of their processes imported torch.

Three commands, each run `--repeats` times as a user types them (the `kiln` script beside this
Python, a fresh process every time), median wall time:
  version  kiln --version
  help     kiln --help (builds every verb's parser, with the recipe keys of its sections)
  curate   kiln curate on two small text files (about 1 KB each, both kept), a fresh run each time,
           the default steps with the local executor's worker processes (one per core): process
           start, the recipe, the workers' start, every phase, the manifest
Then each once more with PYTHONPROFILEIMPORTTIME=1, which every process a command starts (the
curate workers are spawned) inherits: the number of processes and how many of them imported torch.
Curation and tokenization need no torch; a command that imports it pays about 1.6 s before any
work (`import torch` alone, 2 cores, 2026-12-07).
Ends with: RESULT version_s=.. help_s=.. curate_s=.. version_torch=.. help_torch=.. curate_torch=..
curate_processes=..  (the *_torch figures count processes that imported torch)
Not measured: the stages that need torch (train, eval, generate, export), which import it when they run.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KILN = Path(sys.executable).with_name("kiln")
# Two documents the default curate steps keep: prose with stop words, varied lines, no repeated n-grams.
TEXTS = {
    "river.txt": (
        "The river rose quickly after the storm, and the people of the valley watched the water climb the old "
        "stone wall behind the mill. They had seen floods before, but this one came faster than any of them "
        "could remember. By evening the lower fields were under a sheet of brown water that carried branches, "
        "fence posts and the odd bucket downstream.\n\nIn the morning the farmers walked out along the ridge to "
        "count what was left. Most of the sheep had found the high ground on their own, and the barn had kept "
        "its roof, so nobody complained for long. The school stayed closed for a week while the road was "
        "cleared, which the children thought was the best part of the whole affair."
    ),
    "knife.txt": (
        "A good kitchen knife should be sharpened often and stored dry. Most cooks find that a medium stone is "
        "enough for weekly care, while a fine stone gives the edge a polish that lasts longer between sessions. "
        "Wash the blade by hand, dry it at once, and keep it on a magnetic strip or in a wooden block rather than "
        "loose in a drawer.\n\nWhen you cut, let the weight of the blade do the work and keep your fingertips "
        "curled away from the edge. A dull knife is more dangerous than a sharp one, because it slips on the "
        "skin of a tomato or an onion instead of biting into it. If you are unsure how to hold the stone, ask "
        "somebody at the shop where you bought the knife to show you once."
    ),
}
# One line per module a process imports: "import time: <self us> | <cumulative us> | <indented name>".
IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)\s*$", re.MULTILINE)
PROCESS_START = "import time: self [us] | cumulative | imported package"


def commands(folder: Path) -> dict[str, list[str]]:
    """Each measured command; {run} is replaced by a fresh run name for every curate."""
    inputs = str(folder / "notes" / "*.txt")
    runs = f"runs_dir={folder / 'runs'}"
    return {
        "version": [str(KILN), "--version"],
        "help": [str(KILN), "--help"],
        "curate": [str(KILN), "-q", "curate", "--input", inputs, "--run", "{run}", "--set", runs],
    }


def run_once(argv: list[str], run: str, env: dict[str, str] | None = None) -> tuple[float, str]:
    """Wall seconds of one command, and its stderr."""
    argv = [a.replace("{run}", run) for a in argv]
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return wall, done.stderr


def torch_processes(stderr: str) -> tuple[int, int]:
    """(processes, processes that imported torch) in a PYTHONPROFILEIMPORTTIME=1 command's stderr."""
    per_process = stderr.split(PROCESS_START)[1:]
    return len(per_process), sum("torch" in IMPORTED.findall(p) for p in per_process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="Runs of each command; the median is reported.")
    args = parser.parse_args()
    if not KILN.exists():
        raise SystemExit(f"{KILN} not found: run with the Python of kiln's virtualenv (.venv/bin/python)")
    result: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="kiln-startup-") as tmp:
        folder = Path(tmp)
        (folder / "notes").mkdir()
        for name, text in TEXTS.items():
            (folder / "notes" / name).write_text(text + "\n", encoding="utf-8")
        env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
        for label, argv in commands(folder).items():
            walls = [run_once(argv, f"startup-{i}")[0] for i in range(args.repeats)]
            processes, with_torch = torch_processes(run_once(argv, "startup-imports", env)[1])
            median = statistics.median(walls)
            print(
                f"{label:<8} median {median:.3f} s of {args.repeats} ({', '.join(f'{w:.3f}' for w in walls)}); "
                f"{with_torch} of {processes} processes imported torch",
                flush=True,
            )
            result[f"{label}_s"] = f"{median:.3f}"
            result[f"{label}_torch"] = str(with_torch)
            if label == "curate":
                result["curate_processes"] = str(processes)
    order = ("version_s", "help_s", "curate_s", "version_torch", "help_torch", "curate_torch", "curate_processes")
    print("RESULT " + " ".join(f"{key}={result[key]}" for key in order))


if __name__ == "__main__":
    main()
