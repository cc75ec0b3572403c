"""C4: bad lines removed (and counted), bad pages dropped with the exact reason."""

from __future__ import annotations

from kiln.core.document import Document
from kiln.curate.audit import Ledger
from kiln.curate.steps.c4 import C4, C4Config

STEP = C4(C4Config())
FIVE = [
    "One sentence here.",
    "Two sentences here.",
    "Three sentences here.",
    "Four sentences here.",
    "Five sentences here.",
]


def run(text: str, step: C4 = STEP) -> tuple[list[Document], Ledger]:
    ledger = Ledger()
    return list(step.process([Document(id="d", text=text, source="web")], ledger)), ledger


def kept_text(text: str, step: C4 = STEP) -> tuple[str, int]:
    out, ledger = run(text, step)
    assert len(out) == 1 and ledger.removed == []
    return out[0].text, ledger.tally("web").stats["c4:lines_removed"]


def dropped(text: str, rule: str, step: C4 = STEP) -> dict:
    out, ledger = run(text, step)
    assert out == [] and ledger.removed[0]["reason"] == f"c4:{rule}"
    return ledger.removed[0]


def test_clean_page_is_kept_unchanged() -> None:
    text = "\n".join(FIVE)
    doc = Document(id="d", text=text, source="web")
    out = list(STEP.process([doc], Ledger()))
    assert out == [doc] and out[0] is doc  # same object: its shared split is reused downstream


def test_sentence_count() -> None:
    kept_text(" ".join(FIVE))  # five sentences on one line
    row = dropped(" ".join(FIVE[:4]), "too_few_sentences")
    assert (row["value"], row["threshold"]) == (4, 5)


def test_short_lines_are_removed_and_counted() -> None:
    text, removed = kept_text("\n".join(FIVE + ["two words", "three words here"]))
    assert text == "\n".join(FIVE + ["three words here"]) and removed == 1


def test_blank_lines_and_edges_go_without_counting() -> None:
    text, removed = kept_text("  " + "\n\n".join(FIVE) + "  \n")
    assert text == "\n".join(FIVE) and removed == 0


def test_long_word() -> None:
    text, removed = kept_text("\n".join(FIVE + ["a b " + "x" * 1000]))
    assert removed == 0
    text, removed = kept_text("\n".join(FIVE + ["a b " + "x" * 1001]))
    assert text == "\n".join(FIVE) and removed == 1


def test_javascript_and_policy_lines() -> None:
    for line in ["Please enable JavaScript to view", "This site uses cookies to help", "Read our Privacy Policy now"]:
        text, removed = kept_text("\n".join(FIVE + [line]))
        assert text == "\n".join(FIVE) and removed == 1


def test_citations_are_stripped() -> None:
    text, _ = kept_text("\n".join(FIVE[:4] + ["Five sentences here.[12][edit][citation needed]"]))
    assert text.endswith("Five sentences here.")


def test_lorem_ipsum_and_curly_brace_drop_the_page() -> None:
    dropped("\n".join(FIVE + ["Lorem ipsum dolor sit amet"]), "lorem_ipsum")
    dropped("\n".join(FIVE + ["int main() { return 0; }"]), "curly_bracket")
    # only lines that survive the line rules count: a two-word line with a brace goes alone
    text, removed = kept_text("\n".join(FIVE + ["{ x"]))
    assert removed == 1


def test_terminal_punctuation_rule_is_off_by_default() -> None:
    text, removed = kept_text("\n".join(FIVE + ["no final mark here"]))
    assert removed == 0
    strict = C4(C4Config(require_terminal_punctuation=True))
    text, removed = kept_text("\n".join(FIVE + ["no final mark here", "trailing off..."]), strict)
    assert text == "\n".join(FIVE) and removed == 2


def test_a_page_with_every_line_removed_is_dropped() -> None:
    step = C4(C4Config(min_sentences=0))
    dropped("a b\nc d\n", "all_lines_removed", step)


def test_lines_of_a_language_written_without_spaces_count_its_words() -> None:
    """Chinese and Japanese lines hold no spaces: each counts its segmenter's words, so a sentence is not a
    "line under 3 words" nor a "word over 1,000 characters"; a line of one or two words still goes."""
    zh = [
        "这个工具可以把原始文本变成训练数据。",
        "它会读取网页和文档。",
        "每个阶段都会记录输入和输出。",
        "用户可以检查结果。",
        "这是测试里的第五个句子。",
    ]
    ja = [
        "このツールは生のテキストを変換します。",
        "ウェブページや文書を読み込みます。",
        "各段階は入力を記録します。",
        "後から確認できます。",
        "五つ目の文です。",
    ]
    for language, lines in (("zh", zh), ("ja", ja)):
        long_line = lines[0] * 60  # over 1,000 characters, no space
        text = "\n".join([*lines, "好", long_line])
        ledger = Ledger()
        [out] = list(STEP.process([Document(id="d", text=text, source="web", meta={"language": language})], ledger))
        assert out.text == "\n".join([*lines, long_line]) and ledger.tally("web").stats["c4:lines_removed"] == 1
