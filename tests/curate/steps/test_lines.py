"""kiln.curate.steps.lines: line normalization, per-document counting, and cutting boilerplate."""

from __future__ import annotations

import numpy as np

from kiln.core.document import Document
from kiln.curate.audit import Ledger
from kiln.curate.steps.lines import BoilerplateLines, count_keys, document_line_keys, line_key, normalize_line


def test_normalize_line_by_hand():
    assert normalize_line("  Page 3 of 12  ") == "page 0 of 00"
    assert normalize_line("* Share   on\tTwitter!") == "share on twitter"
    assert normalize_line(" -- ") == ""


def test_each_document_counts_a_line_once():
    a = Document("a", "Accept cookies\nAccept cookies\nreal text", "web")
    b = Document("b", "accept COOKIES.\nother text", "web")
    keys, counts = count_keys([document_line_keys(a), document_line_keys(b)])
    by_key = dict(zip(keys.tolist(), counts.tolist()))
    assert by_key[line_key("web", "accept cookies")] == 2
    assert by_key[line_key("web", "real text")] == 1
    assert keys.dtype == np.uint64 and list(keys) == sorted(keys)


def test_counts_are_per_source():
    assert line_key("web", "x") != line_key("books", "x")


def test_cuts_boilerplate_lines_and_counts_them():
    step = BoilerplateLines([line_key("web", "accept cookies")])
    ledger = Ledger()
    text = "Title\n\nAccept cookies\n\nBody text here."
    [out] = list(step.process([Document("a", text, "web")], ledger))
    assert out.text == "Title\n\nBody text here."
    assert ledger.tally("web").stats == {"line_dedup:lines_removed": 1}
    # another source's identical line is not boilerplate there
    [same] = list(step.process([Document("b", text, "books")], ledger))
    assert same.text == text


def test_a_document_of_only_boilerplate_is_removed():
    step = BoilerplateLines([line_key("web", "accept cookies")])
    ledger = Ledger()
    assert list(step.process([Document("a", "Accept cookies\n\n", "web")], ledger)) == []
    assert ledger.removed[0]["reason"] == "line_dedup:all_lines_boilerplate"


def test_folding_in_small_batches_gives_the_same_counts():
    docs = [Document(str(i), "\n".join(f"line {j % 7} of many" for j in range(i % 13)), "web") for i in range(200)]
    key_sets = [document_line_keys(d) for d in docs]
    whole = count_keys(key_sets)
    folded = count_keys(key_sets, flush_keys=3)
    assert whole[0].tolist() == folded[0].tolist() and whole[1].tolist() == folded[1].tolist()
    assert whole[1].dtype == np.int64 and sum(whole[1].tolist()) == sum(len(k) for k in key_sets)
