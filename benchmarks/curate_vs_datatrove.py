"""Curation filters against datatrove: do kiln's Gopher, C4 and FineWeb rules keep the same documents, and how much
faster.

Builds a corpus of at least `--min-mb` MB from text already on this machine (package docs,
changelogs and READMEs under /usr/share/doc, man pages under /usr/share/man with their roff
markup crudely stripped, CMake and other help under /usr/share, Python's pydoc topics), split
into web-page-sized documents, one JSONL file. Then runs, each end to end from that file to its files of kept
documents, with 2 worker processes:

  datatrove  JsonlReader -> GopherRepetitionFilter -> GopherQualityFilter -> C4QualityFilter
             -> FineWebQualityFilter -> JsonlWriter, LocalPipelineExecutor(tasks=2, workers=2),
             in its own virtualenv (created under benchmarks/.cache/ on first use; never a kiln dependency)
  kiln       `kiln curate --input <shards>` with the same four rules in the same order
             (gopher_repetition, gopher_quality, c4, fineweb), the other steps switched off, 2 workers

and reports documents/s and MB/s of each, their ratio, the Jaccard agreement of kept ids, and
per rule the documents the two disagree on, with examples. Both sides use the published
defaults, with C4's terminal-punctuation line rule off (as FineWeb runs it).
Ends with: RESULT kiln_docs_s=.. datatrove_docs_s=.. ratio=.. agreement=..
Not measured here: reading compressed input, other filters, dedup.
"""

from __future__ import annotations

import argparse
import hashlib
import html.parser
import json
import math
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
from dedup_corpus import read_local_file

from kiln.core.docshards import read_shard

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "benchmarks" / ".cache"
MAX_FILE_CHARS = 60_000
DATATROVE_PINS = [
    "datatrove==0.10.1",
    "spacy==3.8.18",
    "regex",
    "orjson",
]  # English words come from spacy.blank("en") in 0.10.1

# ---------------------------------------------------------------------------------------------
# corpus


class _HTMLText(html.parser.HTMLParser):
    """Visible text of an HTML page, a newline at each block element (like a boilerplate-free extraction)."""

    _BLOCK = {
        "p",
        "div",
        "br",
        "li",
        "tr",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "pre",
        "section",
        "table",
        "ul",
        "ol",
        "dt",
        "dd",
        "title",
    }

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in ("script", "style"):
            self._skip += 1
        if tag in self._BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self._skip:
            self._skip -= 1
        if tag in self._BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


_ROFF_TEXT_MACROS = re.compile(
    r"^[.'](?:SH|SS|B|I|BR|IR|BI|RB|IB|RI|SM|SB|IP|TP|Nm|Nd|Sh|Ss|Fl|Ar|Op|Xr|Pa|Dv|Em)\s+(.*)$"
)
_ROFF_ESCAPE = re.compile(r"\\f(?:\[[^\]]*\]|\(..|.)|\\s[-+]?\d|\\\(..|\\\[[^\]]*\]|\\[&|^%:]|\\\*\(..|\\\*.")


def _roff_to_text(src: str) -> str:
    """Man page source to rough text: text macros keep their arguments, others are dropped, escapes simplified."""
    out = []
    for line in src.split("\n"):
        if line.startswith(('.\\"', "'\\\"", '.\\"')):
            continue
        if line.startswith((".", "'")):
            m = _ROFF_TEXT_MACROS.match(line)
            if m is None:
                if line[:3] in (".PP", ".LP", ".P", ".sp", ".Pp"):
                    out.append("")
                continue
            line = m.group(1).replace('"', "")
        line = line.replace("\\-", "-").replace("\\e", "\\").replace("\\ ", " ")
        out.append(_ROFF_ESCAPE.sub("", line))
    return "\n".join(out)


def _read_text(path: Path) -> str | None:
    text = read_local_file(path)
    if text is None:
        return None
    name = path.name.removesuffix(".gz")
    if "/man/" in str(path) and re.search(r"\.\d\w*$", name):
        text = _roff_to_text(text)
    elif name.endswith((".html", ".htm")):
        parser = _HTMLText()
        parser.feed(text)
        text = "".join(parser.parts)
    # subtle: both tools see the same bytes, and datatrove splits lines on "\n" in some filters and
    # on every str.splitlines() separator in others; keep only "\n" so the comparison is about rules.
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = re.sub(r"[\x0b\x0c\x1c-\x1e\x85\u2028\u2029]", " ", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _corpus_files() -> Iterator[tuple[str, Path]]:
    """Candidate text files, round-robin over the three trees so any prefix of the corpus mixes them."""
    text_suffixes = (".txt", ".md", ".rst", ".html", ".htm", ".text", ".gz")
    trees = []
    for root, source in (("/usr/share/doc", "doc"), ("/usr/share/man", "man"), ("/usr/share", "share")):
        base = Path(root)
        files = []
        for path in sorted(base.rglob("*")) if base.is_dir() else []:
            if source == "share" and str(path).startswith(("/usr/share/doc/", "/usr/share/man/")):
                continue
            name = path.name.lower()
            if (
                (
                    name.endswith(text_suffixes)
                    or name.startswith(("readme", "changelog", "news", "copyright", "changes"))
                )
                and path.is_file()
                and not path.is_symlink()
            ):
                files.append((source, path))
        trees.append(files)
    for i in range(max(map(len, trees), default=0)):
        for files in trees:
            if i < len(files):
                yield files[i]


def _target_chars(key: str) -> int:
    """A document length for this key, log-uniform between 300 and 30,000 characters (web pages vary that much)."""
    u = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / 2**64
    return int(math.exp(math.log(300) + u * (math.log(30_000) - math.log(300))))


def build_corpus(path: Path, min_mb: float) -> tuple[int, int]:
    """Write documents of local text to `path` (JSONL) until at least `min_mb` MB; return (documents, bytes of text)."""
    docs = nbytes = 0
    tmp = path.with_suffix(".tmp")
    path.parent.mkdir(
        parents=True, exist_ok=True
    )  # benchmarks/.cache/ on a fresh clone, whichever benchmark runs first
    with tmp.open("w", encoding="utf-8") as out:

        def emit(doc_id: str, source: str, text: str) -> None:
            nonlocal docs, nbytes
            out.write(json.dumps({"id": doc_id, "text": text, "source": source}, ensure_ascii=False) + "\n")
            docs += 1
            nbytes += len(text.encode("utf-8"))

        def split(doc_id: str, source: str, text: str) -> None:
            paragraphs, size, k = [], 0, 0
            target = _target_chars(f"{doc_id}#0")
            for para in text.split("\n\n"):
                paragraphs.append(para)
                size += len(para) + 2
                if size >= target:
                    emit(f"{doc_id}#{k}", source, "\n\n".join(paragraphs))
                    paragraphs, size, k = [], 0, k + 1
                    target = _target_chars(f"{doc_id}#{k}")
            if paragraphs and "".join(paragraphs).strip():
                emit(f"{doc_id}#{k}", source, "\n\n".join(paragraphs))

        try:
            from pydoc_data.topics import topics
        except ImportError:
            topics = {}
        for name, text in sorted(topics.items()):
            split(f"pydoc/{name}", "pydoc", text.strip())
        for source, file in _corpus_files():
            if nbytes >= min_mb * 1e6:
                break
            text = _read_text(file)
            if text:
                # cap each file so a few huge changelogs do not make up most of the corpus
                split(f"{source}:{file}", source, text[:MAX_FILE_CHARS])
    tmp.rename(path)
    return docs, nbytes


def write_shards(corpus: Path, shard_dir: Path, n_shards: int) -> list[Path]:
    """Deal the corpus round-robin into `n_shards` JSONL files: datatrove gives each task whole files."""
    shard_dir.mkdir(parents=True, exist_ok=True)
    paths = [shard_dir / f"part-{i:02d}.jsonl" for i in range(n_shards)]
    outs = [p.open("w", encoding="utf-8") for p in paths]
    with corpus.open(encoding="utf-8") as f:
        for i, line in enumerate(f):
            outs[i % n_shards].write(line)
    for out in outs:
        out.close()
    return paths


# ---------------------------------------------------------------------------------------------
# datatrove (the reference), in its own virtualenv

_DATATROVE_PIPELINE = """
import sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.filters import (
    C4QualityFilter, FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter,
)
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter

if __name__ == "__main__":  # the executor starts its workers with forkserver, which re-imports this file
    in_dir, out_dir, log_dir, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    pipeline = [
        JsonlReader(in_dir, glob_pattern="*.jsonl"),
        GopherRepetitionFilter(),
        GopherQualityFilter(),
        C4QualityFilter(filter_no_terminal_punct=False),
        FineWebQualityFilter(),
        JsonlWriter(out_dir, compression=None),
    ]
    LocalPipelineExecutor(pipeline=pipeline, tasks=workers, workers=workers, logging_dir=log_dir).run()
"""

# Which filter drops each of a few documents (untimed; only for the disagreement breakdown).
_DATATROVE_REASONS = """
import json, sys
from datatrove.data import Document
from datatrove.pipeline.filters import (
    C4QualityFilter, FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter,
)

filters = [("gopher_repetition", GopherRepetitionFilter()), ("gopher_quality", GopherQualityFilter()),
           ("c4", C4QualityFilter(filter_no_terminal_punct=False)), ("fineweb", FineWebQualityFilter())]
for line in sys.stdin:
    d = json.loads(line)
    doc, reason = Document(text=d["text"], id=d["id"]), "kept"
    for name, f in filters:
        r = f.filter(doc)
        if r is not True:
            reason = f"{name}:{r[1] if isinstance(r, tuple) else 'dropped'}"
            break
    print(json.dumps({"id": d["id"], "reason": reason}))
"""


def datatrove_python() -> Path:
    """The datatrove virtualenv's python, creating the venv under benchmarks/.cache/ on first use."""
    venv = CACHE / "datatrove-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"creating {venv} with {' '.join(DATATROVE_PINS)} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *DATATROVE_PINS], check=True)
    return python


def run_datatrove(python: Path, shard_dir: Path, out_dir: Path, workers: int) -> tuple[float, set[str]]:
    """Wall seconds of the datatrove pipeline (interpreter start to exit) and the ids it kept."""
    script = CACHE / "datatrove_pipeline.py"
    script.write_text(_DATATROVE_PIPELINE)
    for d in (out_dir, out_dir.with_name(out_dir.name + "-logs")):
        subprocess.run(["rm", "-rf", str(d)], check=True)
    t0 = time.perf_counter()
    done = subprocess.run(
        [
            str(python),
            str(script),
            str(shard_dir),
            str(out_dir),
            str(out_dir.with_name(out_dir.name + "-logs")),
            str(workers),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"datatrove failed ({done.returncode}):\n{done.stderr[-3000:]}")
    seconds = time.perf_counter() - t0
    return seconds, _kept_ids(out_dir)


def datatrove_reasons(python: Path, docs: list[dict]) -> dict[str, str]:
    script = CACHE / "datatrove_reasons.py"
    script.write_text(_DATATROVE_REASONS)
    done = subprocess.run(
        [str(python), str(script)],
        input="".join(json.dumps(d) + "\n" for d in docs),
        capture_output=True,
        text=True,
        check=True,
    )
    return {r["id"]: r["reason"] for r in map(json.loads, done.stdout.splitlines())}


def _kept_ids(out_dir: Path) -> set[str]:
    ids = set()
    for path in sorted(out_dir.rglob("*.jsonl")):
        with path.open(encoding="utf-8") as f:
            ids.update(json.loads(line)["id"] for line in f)
    return ids


# ---------------------------------------------------------------------------------------------
# kiln: the real `kiln curate` on the same shards, with only the four rules datatrove runs.

# Steps datatrove's pipeline does not have are switched off; normalization (always on) stays.
KILN_ONLY_THE_FOUR_RULES = [
    f"curate.{step}.enabled=false"
    for step in (
        "url_filter",
        "line_dedup",
        "language",
        "code_quality",
        "pii",
        "length",
        "exact_dedup",
        "minhash_dedup",
    )
]


def run_kiln(shard_dir: Path, runs_dir: Path, workers: int) -> tuple[float, set[str], dict[str, dict]]:
    """Wall seconds of `kiln curate` (interpreter start to exit), kept ids, and each removed id's row."""
    subprocess.run(["rm", "-rf", str(runs_dir)], check=True)
    overrides = [
        f"runs_dir={runs_dir}",
        f"curate.executor.workers={workers}",
        "curate.sample_size=0",
        *KILN_ONLY_THE_FOUR_RULES,
    ]
    command = [sys.executable, "-m", "kiln", "-q", "curate", "--input", str(shard_dir / "*.jsonl"), "--run", "bench"]
    for override in overrides:
        command += ["--set", override]
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"kiln curate failed ({done.returncode}):\n{done.stderr[-3000:]}")
    seconds = time.perf_counter() - t0
    stage = runs_dir / "bench" / "curate"
    kept = set()
    for shard in sorted((stage / "shards").glob("*.jsonl.zst")):
        kept.update(doc.id for doc in read_shard(shard))
    removed = {
        r["id"]: r
        for r in pq.read_table(stage / "removed.parquet", columns=["id", "reason", "value", "threshold"]).to_pylist()
    }
    return seconds, kept, removed


# ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--min-mb", type=float, default=55.0, help="Corpus size to build, MB of text.")
    parser.add_argument("--workers", type=int, default=2, help="Worker processes on each side.")
    parser.add_argument("--examples", type=int, default=3, help="Disagreeing documents to show per rule.")
    args = parser.parse_args()
    CACHE.mkdir(parents=True, exist_ok=True)

    corpus = CACHE / f"corpus-{args.min_mb:g}mb.jsonl"
    if not corpus.exists():
        docs, nbytes = build_corpus(corpus, args.min_mb)
        print(f"built {corpus.name}: {docs} documents, {nbytes / 1e6:.1f} MB of text", flush=True)
    shard_dir = CACHE / "shards"
    subprocess.run(["rm", "-rf", str(shard_dir)], check=True)
    shards = write_shards(corpus, shard_dir, args.workers)
    by_id = {}
    sources: Counter[str] = Counter()
    with corpus.open(encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            by_id[d["id"]] = d
            sources[d["source"]] += 1
    n_docs = len(by_id)
    mb = sum(len(d["text"].encode("utf-8")) for d in by_id.values()) / 1e6
    print(f"corpus: {n_docs} documents, {mb:.1f} MB, sources {dict(sources)}, {args.workers} shards")

    python = datatrove_python()
    dt_s, dt_kept = run_datatrove(python, shard_dir, CACHE / "out-datatrove", args.workers)
    print(f"datatrove: {dt_s:.1f} s, {n_docs / dt_s:.0f} docs/s, {mb / dt_s:.2f} MB/s, kept {len(dt_kept)}", flush=True)
    kiln_s, kiln_kept, removed = run_kiln(shards[0].parent, CACHE / "kiln-runs", args.workers)
    print(
        f"kiln:      {kiln_s:.1f} s, {n_docs / kiln_s:.0f} docs/s, {mb / kiln_s:.2f} MB/s, kept {len(kiln_kept)}"
        f" ({mb / kiln_s / args.workers:.2f} MB/s per worker)",
        flush=True,
    )

    agreement = len(dt_kept & kiln_kept) / max(len(dt_kept | kiln_kept), 1)
    ratio = dt_s / kiln_s
    kiln_reasons = Counter(r["reason"] for r in removed.values())
    print("kiln removals by reason: " + ", ".join(f"{k} {v}" for k, v in sorted(kiln_reasons.items())))
    differ = sorted(dt_kept ^ kiln_kept)
    dt_why = datatrove_reasons(python, [by_id[i] for i in differ]) if differ else {}
    print(
        f"agreement (Jaccard of kept ids): {agreement:.4f}; kept by only one side: {len(differ)} "
        f"(datatrove only {len(dt_kept - kiln_kept)}, kiln only {len(kiln_kept - dt_kept)})"
    )
    pairs: dict[tuple[str, str], list[str]] = {}
    for i in differ:
        kiln_why = removed[i]["reason"] if i in removed else "kept"
        pairs.setdefault((dt_why.get(i, "?"), kiln_why), []).append(i)
    for (dt_reason, kiln_reason), ids in sorted(pairs.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(ids):4d}  datatrove {dt_reason:40s} kiln {kiln_reason}")
        for i in ids[: args.examples]:
            row = removed.get(i)
            measured = (
                f"kiln measured {row['value']:.4g} against {row['threshold']:.4g}"
                if row and row["value"] is not None and row["threshold"] is not None
                else ""
            )
            print(f"        {i}  {measured}")
    if differ:
        print(
            "why they differ: kiln splits words with one regular expression that follows spaCy's English "
            "tokenizer (datatrove's);\n"
            "  the known systematic differences (unit suffixes such as '10km' stay one token, clitics split after "
            "any word,\n"
            "  a few rare spaCy exceptions, symbol-only tokens such as '©' not counted as words) move a "
            "document's measured\n"
            "  fractions by a token or two, which flips mostly documents within about 0.005 of a threshold (the "
            "values above);\n"
            "  kiln also normalizes text first (trailing spaces, blank-line runs), which datatrove does not. See "
            "kiln.text.segments."
        )
    print(
        f"RESULT kiln_docs_s={n_docs / kiln_s:.1f} datatrove_docs_s={n_docs / dt_s:.1f} ratio={ratio:.2f} "
        f"agreement={agreement:.4f}"
    )


if __name__ == "__main__":
    main()
