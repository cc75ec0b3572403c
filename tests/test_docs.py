"""README.md and docs/*.md checked against the repository and the code, without running anything.

- Every relative link and `#anchor` resolves: a file of the repository (not one git ignores) and,
  for a Markdown target, a heading it has, slugged as GitHub does (lowercase; punctuation other
  than hyphens, underscores and spaces removed; spaces to hyphens; a repeated heading gets -1, -2).
- Every `kiln ...` command shown in a code block or in inline code parses with kiln's own parser
  (`kiln.cli.build_parser()`, built at test time, so the check follows the code's verbs), and every
  `--set SECTION.KEY=VALUE` names a key of `kiln.recipe.Recipe` (below a list or mapping field,
  such as curate.inputs or mix.weights, only the field itself is checked).
- Every file and module named in inline code exists: a path under a top folder of the repository
  (`tests/train/test_loss.py`), a `.py` file below src/kiln (`core/layout.py`, `cli.py`) or a dotted name
  (`kiln.train.loop.train`: a module, or a name a module defines at its top level).
- Every YAML block that is a recipe (it has a top-level `name`) validates as one.
- Prose lines (outside code blocks and table rows) stay within 120 characters, inline code spans
  close on the line they open, and the README links every docs page.

Commands are read from untagged (or sh, bash) code blocks, one line at a time with
backslash-continued lines joined; blocks tagged yaml, python, json, toml, html or text hold none
(`text` is for diagrams and messages). Placeholders: an ALL-CAPS word (NAME, DIR, STEP, N)
stands for a value; VERB for each verb and SUBCOMMAND for each subcommand of the verb before it.
A span that only names a verb (`kiln import-hf`) or an option without its value
(`kiln curate --explain`) is checked for the names alone.
Not checked: external links (no network here), and what a command does when run.
"""

from __future__ import annotations

import argparse
import functools
import io
import re
import shlex
import subprocess
import types
import typing
from collections import Counter
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pytest
import yaml
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
MAX_PROSE_CHARS = 120
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")
FENCE = re.compile(r"^ {0,3}(```+|~~~+)\s*([\w+-]*)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SHELL_OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "&>"}
NOT_COMMANDS = {"yaml", "yml", "python", "py", "json", "toml", "html", "text"}  # blocks with no shell lines


@dataclass(frozen=True)
class Line:
    page: Path
    number: int
    text: str
    code_lang: str | None  # the fenced block's language ("" when untagged); None outside code
    block: int  # which fenced block of the page it is in (1, 2, ...); 0 outside code


@dataclass(frozen=True)
class Command:
    page: Path
    number: int
    text: str
    args: tuple[str, ...]  # what follows `kiln`, placeholders kept

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page}:{self.number}"


def doc_pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def read_lines(page: Path) -> list[Line]:
    """The page's lines, each marked with the fenced code block it is in; fence lines themselves are left out."""
    lines, fence, lang, block = [], "", None, 0
    for number, text in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        match = FENCE.match(text)
        if match and not fence:
            fence, lang, block = match.group(1), match.group(2).lower(), block + 1
            continue
        if match and match.group(1)[0] == fence[:1] and len(match.group(1)) >= len(fence) and not match.group(2):
            fence, lang = "", None
            continue
        lines.append(Line(page, number, text, lang, block if fence else 0))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: `Run report (`kiln report`)` -> run-report-kiln-report."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors by its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@functools.cache
def anchors(page: Path) -> frozenset[str]:
    """Every anchor of a Markdown page: its headings' slugs (repeats numbered -1, -2, ...) and HTML ids."""
    seen: Counter[str] = Counter()
    found = set()
    for line in read_lines(page):
        if line.code_lang is not None:
            continue
        match = HEADING.match(line.text)
        if match:
            base = slug(match.group(2))
            found.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
            seen[base] += 1
        found.update(HTML_ANCHOR.findall(line.text))
    return frozenset(found)


def ignored_by_git(path: Path, root: Path) -> bool:
    if not (root / ".git").exists():
        return False
    found = subprocess.run(["git", "-C", str(root), "check-ignore", "-q", str(path)], capture_output=True)
    return found.returncode == 0


def link_problem(page: Path, target: str, root: Path) -> str | None:
    """Why a relative link of `page` does not resolve, or None."""
    path_part, _, anchor = unquote(target).partition("#")
    file = (page.parent / path_part).resolve() if path_part else page
    if not file.is_relative_to(root):
        return "points outside the repository"
    if not file.exists():
        return f"{file.relative_to(root)} does not exist"
    if ignored_by_git(file, root):
        return f"{file.relative_to(root)} is ignored by git, so not in the repository"
    if anchor and file.suffix != ".md":
        return "an anchor into a file that is not Markdown"
    if anchor and anchor not in anchors(file):
        near = sorted(a for a in anchors(file) if a.split("-")[0] == anchor.split("-")[0])
        return f"{file.name} has no heading #{anchor}" + (f" (similar: {', '.join(near)})" if near else "")
    return None


def link_problems(pages: list[Path], root: Path = ROOT) -> tuple[int, list[str]]:
    """(links checked, one line per link that does not resolve, with its page and line)."""
    root = root.resolve()
    checked, problems = 0, []
    for page in pages:
        for line in read_lines(page):
            if line.code_lang is not None:
                continue
            for target in LINK.findall(INLINE_CODE.sub("code", line.text)):
                if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//", target):
                    continue  # an external address: not checked offline
                checked += 1
                problem = link_problem(page.resolve(), target, root)
                if problem:
                    problems.append(f"{page.resolve().relative_to(root)}:{line.number}: ({target}) {problem}")
    return checked, problems


def shell_words(text: str) -> list[str]:
    """The words of one shell line, comments dropped and cut at the first pipe, redirection or `;`."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = []
    try:
        for word in lexer:
            if word in SHELL_OPERATORS:
                break
            words.append(word)
    except ValueError:  # an unclosed quote in a fragment: take the words before it
        pass
    return words


def kiln_args(words: list[str]) -> tuple[str, ...] | None:
    """What follows `kiln` (or `.venv/bin/kiln`, or `-m kiln` after torchrun) when the line runs kiln."""
    start = 0
    while start < len(words) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[start]):
        start += 1  # VAR=value before the command
    if start < len(words) and words[start] in ("kiln", ".venv/bin/kiln"):
        return tuple(words[start + 1 :])
    for i in range(start, len(words) - 1):
        if words[i] == "-m" and words[i + 1] == "kiln":
            return tuple(words[i + 2 :])
    return None


def commands_in(page: Path) -> list[Command]:
    """Each `kiln ...` command line of a page's shell code blocks and of its inline code."""
    found = []
    pending: list[Line] = []
    for line in read_lines(page):
        if line.code_lang is not None:
            if line.code_lang in NOT_COMMANDS:
                continue
            pending.append(line)
            if line.text.rstrip().endswith("\\"):
                continue  # a continued line: join it with the next
            text = " ".join(p.text.rstrip().removesuffix("\\") for p in pending)
            first, pending = pending[0], []
            args = kiln_args(shell_words(text))
            if args is not None:
                found.append(Command(page, first.number, text.strip(), args))
            continue
        for _, span in INLINE_CODE.findall(line.text):
            if span.startswith("kiln "):
                args = kiln_args(shell_words(span))
                if args is not None:
                    found.append(Command(page, line.number, span, args))
    return found


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def parse_error(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """argparse's complaint about these arguments, or None when they parse (--help counts as parsing)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            parser.parse_args(args)
        except SystemExit as e:
            if e.code not in (0, None):
                return (err.getvalue().strip().splitlines() or [f"exit status {e.code}"])[-1]
    return None


def expansions(parser: argparse.ArgumentParser, args: tuple[str, ...]) -> list[list[str]]:
    """The argument lists a command stands for: VERB and SUBCOMMAND become each real name, other
    placeholders the value 1 (a number, a name and a path alike)."""
    lists: list[list[str]] = [[]]
    level = parser
    for arg in args:
        names = subcommands(level) if level is not None else {}
        if arg in ("VERB", "SUBCOMMAND") and names:
            lists = [done + [name] for done in lists for name in names]
            level = None
        elif arg in names:
            lists = [done + [arg] for done in lists]
            level = names[arg]
        else:
            lists = [done + (["1"] if PLACEHOLDER.match(arg) else [arg]) for done in lists]
            level = None if not arg.startswith("-") else level
    return lists


def names_only(parser: argparse.ArgumentParser, args: tuple[str, ...]) -> bool:
    """Whether the command only names a verb (and subcommand): `kiln import-hf`, `kiln quality train-lm`."""
    level = parser
    for arg in args:
        names = subcommands(level)
        if arg not in names and arg not in ("VERB", "SUBCOMMAND"):
            return False
        level = names.get(arg, level)
    return bool(args)


def command_problem(parser: argparse.ArgumentParser, command: Command) -> str | None:
    """Why the command would not parse, or None."""
    template = any(a in ("VERB", "SUBCOMMAND") for a in command.args)
    for args in expansions(parser, command.args):
        error = parse_error(parser, args)
        if error and args and args[-1].startswith("--") and "expected one argument" in error:
            error = parse_error(parser, [*args, "1"])  # `kiln curate --explain`: names the option
        if error and re.search(r"\brequired\b", error) and (template or names_only(parser, command.args)):
            error = None  # a verb named in prose, or a form for every subcommand, not a full command line
        if error:
            return f"{command.where()}: `kiln {' '.join(args)}`: {error}"
    return None


def members(annotation: typing.Any) -> tuple[typing.Any, ...]:
    """The types a field may hold: X | Y | None -> (X, Y)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(a for a in typing.get_args(annotation) if a is not type(None))
    return (annotation,)


def recipe_key_problem(key: str) -> str | None:
    """Why `key` (train.optim.lr) is not a recipe key, or None. Below a list or mapping field
    (curate.inputs, mix.weights) only the field itself is checked."""
    from kiln.recipe import Recipe

    model: type[BaseModel] = Recipe
    parts = key.split(".")
    for depth, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            where = ".".join(parts[:depth]) or "the top level"
            return f"{key} is not a recipe key ({where} has {', '.join(sorted(model.model_fields))})"
        if depth == len(parts) - 1:
            return None
        kinds = members(field.annotation)
        if len(kinds) == 1 and isinstance(kinds[0], type) and issubclass(kinds[0], BaseModel):
            model = kinds[0]
        elif any(typing.get_origin(k) in (list, tuple, dict) for k in kinds):
            return None
        else:
            return f"{'.'.join(parts[: depth + 1])} takes a value, not keys below it"


def set_keys(args: tuple[str, ...]) -> list[str]:
    keys = []
    for i, arg in enumerate(args):
        if arg == "--set" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--set="):
            value = arg.removeprefix("--set=")
        else:
            continue
        if "=" in value:
            keys.append(value.partition("=")[0].strip())
    return keys


def command_problems(pages: list[Path]) -> tuple[int, list[str]]:
    """(commands checked, one line per command that does not parse or names an unknown recipe key)."""
    from kiln.cli import build_parser

    parser = build_parser()
    checked, problems = 0, []
    for page in pages:
        for command in commands_in(page):
            checked += 1
            problem = command_problem(parser, command)
            if problem:
                problems.append(problem)
            for key in set_keys(command.args):
                if not all(PLACEHOLDER.match(p) for p in key.split(".")):
                    bad = recipe_key_problem(key)
                    if bad:
                        problems.append(f"{command.where()}: `{command.text}`: --set {bad}")
    return checked, problems


TOP_FOLDERS = ("src/", "tests/", "benchmarks/", "recipes/", "docs/", ".ci/")
SOURCE = ROOT / "src"


def names_a_file(span: str) -> bool:
    """Whether inline code is a repository path: under a top folder, or a `.py` file below src/kiln.
    Placeholders, globs and braces (`<source>/val_ids.txt`) are not paths to check; nor is `.py`."""
    if not re.fullmatch(r"[\w./-]+", span) or re.fullmatch(r"\.\w+", span):
        return False
    return span.startswith(TOP_FOLDERS) or span.endswith(".py")


def named_file_problem(span: str) -> str | None:
    """Why a path named in inline code is not in the repository, or None."""
    if (ROOT / span).exists() or (not span.startswith(TOP_FOLDERS) and (SOURCE / "kiln" / span).exists()):
        return None
    return f"{span if span.startswith(TOP_FOLDERS) else 'src/kiln/' + span} does not exist"


def dotted_name_problem(dotted: str) -> str | None:
    """Why `kiln.a.b` names no module of src/ and no top-level name of one, or None."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = SOURCE.joinpath(*parts[:cut])
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if not module.is_file():
            continue
        rest = parts[cut:]
        if not rest:
            return None
        source = module.read_text(encoding="utf-8")
        if len(rest) == 1 and re.search(rf"^(?:def|class)\s+{rest[0]}\b|^{rest[0]}\s*[:=]", source, re.M):
            return None
        missing = "/".join(parts[: cut + 1])
        return f"{dotted}: no module src/{missing}.py, and {module.relative_to(ROOT)} defines no top-level {rest[0]}"
    return f"{dotted}: no such module under src/"


def named_problems(pages: list[Path]) -> tuple[int, list[str]]:
    """(names checked, one line per file or module named in inline code that does not exist)."""
    checked, problems = 0, []
    for page in pages:
        for line in read_lines(page):
            if line.code_lang is not None:
                continue
            for _, span in INLINE_CODE.findall(line.text):
                if re.fullmatch(r"kiln(\.\w+)+", span):
                    problem = dotted_name_problem(span)
                elif names_a_file(span):
                    problem = named_file_problem(span)
                else:
                    continue
                checked += 1
                if problem:
                    problems.append(f"{page.relative_to(ROOT)}:{line.number}: {problem}")
    return checked, problems


def recipe_blocks(pages: list[Path]) -> dict[str, object]:
    """Each YAML block that is a recipe (a mapping with a top-level `name`), by where it starts."""
    blocks: dict[tuple[Path, int], list[Line]] = {}
    for page in pages:
        for line in read_lines(page):
            if line.code_lang in ("yaml", "yml"):
                blocks.setdefault((page, line.block), []).append(line)
    found = {}
    for lines in blocks.values():
        data = yaml.safe_load("\n".join(line.text for line in lines))
        if isinstance(data, dict) and "name" in data:
            found[f"{lines[0].page.relative_to(ROOT)}:{lines[0].number}"] = data
    return found


def test_links_and_anchors_resolve() -> None:
    checked, problems = link_problems(doc_pages())
    print(f"{checked} relative links and anchors checked in {len(doc_pages())} pages")
    assert checked >= 40, f"only {checked} relative links found: is the link pattern still matching?"
    assert not problems, f"{len(problems)} of {checked} links do not resolve:\n" + "\n".join(problems)


def test_kiln_commands_parse_with_real_verbs_and_recipe_keys() -> None:
    checked, problems = command_problems(doc_pages())
    print(f"{checked} kiln commands checked in {len(doc_pages())} pages")
    assert checked >= 60, f"only {checked} kiln commands found: is the extraction still matching?"
    assert not problems, f"{len(problems)} of {checked} commands are wrong:\n" + "\n".join(problems)


def test_files_and_modules_named_exist() -> None:
    checked, problems = named_problems(doc_pages())
    print(f"{checked} files and modules named in {len(doc_pages())} pages")
    assert checked >= 30, f"only {checked} files and modules named: is the pattern still matching?"
    assert not problems, f"{len(problems)} of {checked} names are stale (renamed or removed?):\n" + "\n".join(problems)


def test_recipes_shown_validate() -> None:
    from kiln.core.errors import ConfigError
    from kiln.recipe import validate_recipe

    recipes = recipe_blocks(doc_pages())
    assert recipes, "the README shows no recipe (a YAML block with a top-level name)"
    problems = []
    for where, data in recipes.items():
        try:
            validate_recipe(data, origin=where)
        except ConfigError as e:
            problems.append(str(e))
    assert not problems, "\n".join(problems)


def test_prose_lines_fit_and_inline_code_closes() -> None:
    """Long prose lines are wrapped (tables and code exempt); an inline code span opens and closes on
    one line, since the command check reads spans line by line."""
    problems = []
    for page in doc_pages():
        for line in read_lines(page):
            if line.code_lang is not None:
                continue
            where = f"{page.relative_to(ROOT)}:{line.number}"
            if not line.text.lstrip().startswith("|") and len(line.text) > MAX_PROSE_CHARS:
                problems.append(f"{where}: {len(line.text)} characters, over {MAX_PROSE_CHARS}: wrap it")
            if "`" in INLINE_CODE.sub("", line.text):
                problems.append(f"{where}: an inline code span runs onto the next line: keep it on one")
    assert not problems, "\n".join(problems)


def test_readme_links_every_docs_page() -> None:
    linked = {unquote(t).partition("#")[0] for t in LINK.findall((ROOT / "README.md").read_text(encoding="utf-8"))}
    missing = [p.relative_to(ROOT).as_posix() for p in doc_pages()[1:]]
    missing = [p for p in missing if p not in linked]
    assert not missing, f"README.md links no docs page named {missing}"


# The checker itself, on pages written here: a hand-worked example of each rule.


def test_slugs_follow_github() -> None:
    assert slug("Run report (`kiln report`)") == "run-report-kiln-report"
    assert slug("Training (`kiln train`): models, objectives") == "training-kiln-train-models-objectives"
    assert slug("Sweeps for `kiln plan fit`") == "sweeps-for-kiln-plan-fit"
    assert slug("dedup_quality.py") == "dedup_qualitypy"
    assert slug("See [Planning](planning.md)") == "see-planning"


CHECKED_README = """# Title

[ok](docs/a.md#how-to-1) [ok](#title) [gone](docs/b.md) [bad anchor](docs/a.md#how-to-2) [web](https://x.org)

```
kiln curate --set curate.max_total_mb=10   # a comment
kiln fly --fast
kiln train --set train.no_such_key=1 | tee log
torchrun --nproc-per-node 2 -m kiln train \\
    --set parallel.dp_shard=2
```

Inline: `kiln plan flops --params 7B --tokens 2T`, `kiln plan nothing`, `kiln import-hf`, `kiln eval --data`,
`kiln VERB --help`, `kiln report --run NAME --watch N`.
"""


def test_checker_reports_broken_links_unknown_verbs_and_keys(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## How to\n\n## How to\n\ntext\n", encoding="utf-8")
    page = tmp_path / "README.md"
    page.write_text(CHECKED_README, encoding="utf-8")

    checked, problems = link_problems([page], root=tmp_path)
    assert checked == 4  # the external address is left out
    assert problems == [
        "README.md:3: (docs/b.md) docs/b.md does not exist",
        "README.md:3: (docs/a.md#how-to-2) a.md has no heading #how-to-2 (similar: how-to, how-to-1)",
    ]

    commands = commands_in(page)
    assert [c.args for c in commands][:4] == [
        ("curate", "--set", "curate.max_total_mb=10"),
        ("fly", "--fast"),
        ("train", "--set", "train.no_such_key=1"),
        ("train", "--set", "parallel.dp_shard=2"),
    ]
    checked, problems = command_problems([page])
    assert checked == 10
    assert len(problems) == 3, problems
    assert "README.md:7: `kiln fly --fast`: " in problems[0] and "invalid choice: 'fly'" in problems[0]
    assert "README.md:8: " in problems[1] and "train.no_such_key is not a recipe key" in problems[1]
    assert "README.md:13: `kiln plan nothing`: " in problems[2] and "invalid choice: 'nothing'" in problems[2]


REAL_KEYS = ["train.optim.lr", "curate.inputs", "mix.weights.code", "curate.sources.docs.pii.enabled"]


@pytest.mark.parametrize("key", REAL_KEYS)
def test_real_recipe_keys_pass(key: str) -> None:
    assert recipe_key_problem(key) is None


@pytest.mark.parametrize("key", ["train.optim.rate", "trian.steps", "train.steps.max", "model.preset.tiny"])
def test_made_up_recipe_keys_are_named(key: str) -> None:
    assert recipe_key_problem(key) is not None
