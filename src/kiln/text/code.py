"""Which documents are source code: the decision that sends a document to the code rules instead of
the prose rules in curation, and labels it `code` in the quality sample and the tokenizer report.

Not handled here: detecting code inside prose (a README with code blocks is prose), or the
programming language of a file without an extension.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from kiln.core.document import Document

# Programming languages by file extension (lowercased). Markup and data (.md .rst .txt .tex .html
# .xml .json .yaml .toml .csv .ipynb) are deliberately absent: HTML is extracted to prose before
# curation and web paths end in .html; JSON/YAML/TOML are data, and The Stack gave them their own
# size rules rather than these. A recipe that wants them treated as code marks the source (`marked`).
CODE_EXTENSIONS = frozenset(
    {
        ".py",
        ".pyi",
        ".pyx",
        ".c",
        ".h",
        ".cc",
        ".cpp",
        ".cxx",
        ".c++",
        ".hh",
        ".hpp",
        ".hxx",
        ".cu",
        ".cuh",
        ".m",
        ".mm",
        ".java",
        ".kt",
        ".kts",
        ".scala",
        ".groovy",
        ".gradle",
        ".clj",
        ".cljs",
        ".js",
        ".mjs",
        ".cjs",
        ".jsx",
        ".ts",
        ".tsx",
        ".vue",
        ".svelte",
        ".go",
        ".rs",
        ".rb",
        ".php",
        ".cs",
        ".fs",
        ".fsx",
        ".vb",
        ".swift",
        ".dart",
        ".sh",
        ".bash",
        ".zsh",
        ".fish",
        ".ps1",
        ".bat",
        ".cmd",
        ".lua",
        ".pl",
        ".pm",
        ".r",
        ".jl",
        ".sql",
        ".hs",
        ".lhs",
        ".ml",
        ".mli",
        ".ex",
        ".exs",
        ".erl",
        ".hrl",
        ".elm",
        ".nim",
        ".zig",
        ".d",
        ".f",
        ".f90",
        ".f95",
        ".for",
        ".ada",
        ".adb",
        ".ads",
        ".pas",
        ".lisp",
        ".el",
        ".scm",
        ".rkt",
        ".v",
        ".sv",
        ".vhd",
        ".vhdl",
        ".asm",
        ".s",
        ".sol",
        ".proto",
        ".thrift",
        ".cmake",
        ".mk",
        ".tcl",
        ".awk",
        ".sed",
        ".coffee",
        ".cr",
        ".purs",
        ".ino",
        ".glsl",
        ".hlsl",
        ".wgsl",
        ".metal",
        ".tf",
        ".nix",
        ".sas",
        ".stan",
        ".cob",
        ".cbl",
    }
)
# Build and container files named without an extension.
CODE_FILENAMES = frozenset(
    {
        "makefile",
        "gnumakefile",
        "dockerfile",
        "containerfile",
        "cmakelists.txt",
        "rakefile",
        "gemfile",
        "jenkinsfile",
        "vagrantfile",
        "justfile",
    }
)


def is_code(source: str, path: str | None, marked: bool | None) -> bool:
    """Whether a document gets the code rules instead of the prose rules.

    `marked` (set on the source in the recipe) wins when not None; otherwise a document is code
    when its source is named "code" or its path has a programming-language extension
    (CODE_EXTENSIONS) or build-file name (CODE_FILENAMES).
    """
    if marked is not None:
        return marked
    if source.lower() == "code":
        return True
    if not path:
        return False
    name = PurePosixPath(path.replace("\\", "/")).name.lower()
    return name in CODE_FILENAMES or PurePosixPath(name).suffix in CODE_EXTENSIONS


def doc_is_code(doc: Document, marked: bool | None) -> bool:
    """Code or prose rules: the input's marking, else the source name or the document's own file
    extension (a record's own path inside a JSONL or Parquet file, else the file read)."""
    return is_code(doc.source, doc.meta.get("record_path") or doc.meta.get("path"), marked)
