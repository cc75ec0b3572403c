"""Word splitting speed per language (kiln.text.segments.split_words), and the English path against the rule
as it ran before languages existed (the English regex alone, with no language lookup).

Text, all found on the machine: English from /usr/share/common-licenses and the standard library's module
docstrings; every other language from the gettext message catalogs in /usr/share/locale (the translations of
every message each catalog holds, de-duplicated), in documents of about 4 KB, repeated to at least `--mb` MB
per language (the catalogs of some languages are smaller). One thread, best of `--repeats`, after a warm-up;
MB/s counts the UTF-8 bytes of the input.
Ends with: RESULT en_mb_s=.. en_before_mb_s=.. en_ratio=.. <lang>_mb_s=.. ... (one per language measured)
Not measured: the segmenters' start (a dictionary load of 0.01-0.1 s per process), multiple threads.
"""

from __future__ import annotations

import argparse
import ast
import gettext
import struct
import sysconfig
import time
from pathlib import Path

from kiln.text.segments import _TOKEN, split_words

LOCALES = {
    "fr": "fr",
    "de": "de",
    "es": "es",
    "it": "it",
    "pt": "pt_BR",
    "ru": "ru",
    "ko": "ko",
    "zh": "zh_CN",
    "zh-Hant": "zh_TW",
    "ja": "ja",
    "th": "th",
    "hi": "hi",
    "ar": "ar",
}
DOC_BYTES = 4096
DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def catalog_text(locale: str) -> str:
    """Every translated message of the locale's catalogs, once each, a line each."""
    seen: dict[str, None] = {}
    for mo in sorted(Path("/usr/share/locale", locale, "LC_MESSAGES").glob("*.mo")):
        try:
            with mo.open("rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog  # type: ignore[attr-defined]
        except (OSError, UnicodeDecodeError, ValueError, struct.error):  # a catalog gettext cannot read
            continue
        for key, value in catalog.items():
            if isinstance(key, str) and key and isinstance(value, str) and value.strip():
                seen.setdefault(" ".join(value.split()), None)
    return "\n".join(seen)


def english_text() -> str:
    """The licences and the standard library's docstrings (read from its source, nothing imported)."""
    parts = [p.read_text(errors="replace") for p in sorted(Path("/usr/share/common-licenses").glob("*")) if p.is_file()]
    for source in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            tree = ast.parse(source.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        parts += [doc for node in ast.walk(tree) if isinstance(node, DOCUMENTED) and (doc := ast.get_docstring(node))]
    return "\n".join(parts)


def documents(text: str, mb: float) -> list[str]:
    """The text cut at line breaks into documents of about DOC_BYTES, repeated to at least `mb` MB."""
    docs, current, size = [], [], 0
    for line in text.splitlines():
        current.append(line)
        size += len(line.encode()) + 1
        if size >= DOC_BYTES:
            docs.append("\n".join(current))
            current, size = [], 0
    if current:
        docs.append("\n".join(current))
    total = sum(len(d.encode()) for d in docs)
    return docs * max(1, int(mb * 1e6 / max(total, 1)) + 1) if total < mb * 1e6 else docs


def speed(split: object, docs: list[str], repeats: int) -> float:
    size = sum(len(d.encode()) for d in docs)
    split(docs[0])  # type: ignore[operator]  # warm-up: a segmenter loads its dictionary here
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for d in docs:
            split(d)  # type: ignore[operator]
        best = min(best, time.perf_counter() - start)
    return size / best / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=2.0, help="MB of text per language")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, float] = {}
    english = documents(english_text(), args.mb)
    # Before: the English rule alone; now: the lookup of the document's language (none given, as with the
    # language step off, and "en", as with it on) in front of the same rule. Interleaved, best of each.
    before = speed(lambda t: list(filter(None, _TOKEN.findall(t))), english, args.repeats)
    unknown = speed(lambda t: split_words(t, None), english, args.repeats)
    named = speed(lambda t: split_words(t, "en"), english, args.repeats)
    results |= {"en_mb_s": min(unknown, named), "en_before_mb_s": before, "en_ratio": min(unknown, named) / before}
    print(f"en: {before:.1f} MB/s before, {unknown:.1f} (no language) / {named:.1f} (en) now", flush=True)
    for language, locale in LOCALES.items():
        text = catalog_text(locale)
        if not text:
            print(f"{language}: no catalogs under /usr/share/locale/{locale}; skipped", flush=True)
            continue
        docs = documents(text, args.mb)
        mb_s = speed(lambda t, language=language: split_words(t, language), docs, args.repeats)
        words = sum(len(split_words(d, language)) for d in docs[:50])
        print(
            f"{language} ({locale}): {mb_s:.2f} MB/s, {words / sum(len(d.encode()) for d in docs[:50]) * 1e3:.0f} "
            "words per kB",
            flush=True,
        )
        results[f"{language.replace('-', '_')}_mb_s"] = mb_s
    print("RESULT " + " ".join(f"{k}={v:.3f}" for k, v in results.items()))


if __name__ == "__main__":
    main()
