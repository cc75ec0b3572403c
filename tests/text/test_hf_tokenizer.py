"""kiln.text.hf_tokenizer: a Hugging Face folder's tokenizer gives transformers' AutoTokenizer's ids
on any text, for every kind a model folder carries, with the boundaries its model was trained with."""

from __future__ import annotations

import json
import pydoc_data.topics
import sysconfig
from functools import cache
from pathlib import Path

import pytest
from hf_tokenizers import BYTE_LEVEL, KINDS, save
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import models, pre_tokenizers

from kiln.core.errors import FatalError
from kiln.text.hf_tokenizer import TOKENIZER_JSON, HfTokenizer
from kiln.text.load import load_tokenizer

transformers = pytest.importorskip("transformers")

SPELLINGS = ["<|endoftext|>", "<s>", "</s>", "[CLS]", "[SEP]", "<unk>", "<|begin_of_text|>", "<|im_start|>", "<pad>"]
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200)
PIECES = st.one_of(
    TEXT,
    st.sampled_from(SPELLINGS),
    st.text(" \t\n\r\u00a0\u3000", min_size=1, max_size=12),  # whitespace runs
    st.sampled_from(["👩‍💻", "🇫🇷🇩🇪", "👍🏽", "🙂" * 5, "e\u0301", "ﬁ"]),  # emoji sequences, combining marks
    st.text("ab xy\n", min_size=500, max_size=3000),  # long lines
)


def folder_of(kind: str, root: Path) -> Path:
    return save(kind, root / kind)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[HfTokenizer, object]]:
    """Per kind: kiln's tokenizer of the saved folder, and transformers' AutoTokenizer of the same folder."""
    root = tmp_path_factory.mktemp("hf-tokenizers")
    out = {}
    for kind in KINDS:
        folder = folder_of(kind, root)
        files = {p.name: p.read_bytes() for p in folder.iterdir() if p.suffix == ".json"}
        theirs = transformers.AutoTokenizer.from_pretrained(folder, split_special_tokens=True)
        out[kind] = (HfTokenizer(files, str(folder)), theirs)
    return out


def demo_texts() -> list[str]:
    """A slice of the demo corpus: every pydoc topic and every 40th standard-library module."""
    stdlib = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[::40]
    return [*pydoc_data.topics.topics.values(), *(p.read_text(encoding="utf-8") for p in stdlib)]


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(PIECES, max_size=6))
def test_ids_equal_autotokenizers_on_any_text(pairs: dict, kind: str, pieces: list[str]) -> None:
    ours, theirs = pairs[kind]
    text = "".join(pieces)
    assert ours.encode(text) == theirs(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("kind", KINDS)
def test_ids_equal_autotokenizers_on_the_demo_corpus(pairs: dict, kind: str) -> None:
    ours, theirs = pairs[kind]
    texts = demo_texts()
    assert sum(len(t) for t in texts) > 500_000
    assert ours.encode_batch(texts) == theirs(texts, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_document_has_the_boundaries_the_model_was_trained_with(pairs: dict, kind: str) -> None:
    """AutoTokenizer's own template gives the start (and BERT's and T5's the end); kiln ends every document with eos."""
    ours, theirs = pairs[kind]
    text = "def f(x):\n    return x  # ok"
    template = theirs(text)["input_ids"]
    doc = ours.document(text)
    if kind in ("bert", "unigram"):  # their templates end with the end-of-document token
        assert doc == template
    else:
        assert doc[:-1] == template
        assert doc[-1] == ours.eot_id == theirs.convert_tokens_to_ids(theirs.eos_token)
    expected_bos = {"llama3": "<|begin_of_text|>", "llama2": "<s>", "bert": "[CLS]"}.get(kind)
    assert ours.boundaries.bos == expected_bos


def test_boundaries_come_from_the_folder_and_the_recipe_overrides_them(pairs: dict) -> None:
    qwen, _ = pairs["qwen2"]
    assert (qwen.bos_id, qwen.boundaries.eos, qwen.boundaries.pad) == (None, "<|endoftext|>", "<|endoftext|>")
    assert qwen.fim_ids is not None and qwen.mask_id is None
    llama2, _ = pairs["llama2"]
    assert (llama2.boundaries.bos, llama2.boundaries.eos, llama2.boundaries.pad) == ("<s>", "</s>", "</s>")
    assert "no pad_token: pad is eos" in llama2.describe()
    changed = llama2.with_boundaries(False, None, "<unk>")
    assert changed.bos_id is None and changed.pad_id == 0 and changed.document("a")[-1] == llama2.eot_id
    assert llama2.with_boundaries(True, None, None).bos_id == 1
    with pytest.raises(FatalError, match=r"\['<nope>'\] are not in the vocabulary"):
        llama2.with_boundaries(None, "<nope>", None)


@pytest.mark.parametrize("kind", BYTE_LEVEL)
def test_byte_level_tokenizers_encode_with_the_fastest_exact_library(pairs: dict, kind: str) -> None:
    ours, _ = pairs[kind]
    assert ours.encoder_name == "splintr"


def test_the_bytes_of_each_token_add_up_to_the_text(pairs: dict) -> None:
    """Bits per byte needs each id's bytes: byte-level and byte-fallback tokens add up to the UTF-8 text exactly."""
    text = "Grüße 🙂 def f(x):\n\treturn 42 \x00 東京"
    for kind in ("gpt2", "llama3", "qwen2"):
        ours, _ = pairs[kind]
        assert int(ours.token_bytes()[ours.encode(text)].sum()) == len(text.encode("utf-8"))
    llama2, _ = pairs["llama2"]  # the normaliser's leading ▁ counts as one more byte, the space it stands for
    assert int(llama2.token_bytes()[llama2.encode(text)].sum()) == len(text.encode("utf-8")) + 1


def test_saved_files_come_back_byte_for_byte_and_a_changed_one_is_refused(pairs: dict, tmp_path: Path) -> None:
    ours, _ = pairs["llama3"]
    outputs = ours.save(tmp_path / TOKENIZER_JSON)
    assert {p.name for p in outputs} >= {"tokenizer.json", "tokenizer_config.json", "kiln_tokenizer.json"}
    again = load_tokenizer(tmp_path / TOKENIZER_JSON)
    assert isinstance(again, HfTokenizer) and again.files == ours.files
    assert again.encode("hello world") == ours.encode("hello world") and again.bos_id == ours.bos_id
    config = tmp_path / "tokenizer_config.json"
    config.write_text(config.read_text().replace("begin_of_text", "begin_of_tex"))
    with pytest.raises(FatalError, match="tokenizer_config.json: changed since kiln wrote it"):
        load_tokenizer(tmp_path / TOKENIZER_JSON)


@pytest.mark.parametrize("kind", KINDS)
def test_flat_batch_equals_autotokenizers(pairs: dict, kind: str) -> None:
    """The flat batch call gives AutoTokenizer's ids: no template, special spellings in text as text."""
    ours, theirs = pairs[kind]
    texts = [*demo_texts()[:20], "", *(f"a {s} b" for s in SPELLINGS), "plain words only"]
    ids, lengths = ours.encode_flat(texts)
    expected = theirs(texts, add_special_tokens=False)["input_ids"]
    assert lengths.tolist() == [len(e) for e in expected]
    assert ids.tolist() == [i for row in expected for i in row]


def test_fertility_reads_a_spaced_word_as_the_tokenizer_sees_it_in_text(pairs: dict) -> None:
    """A SentencePiece-style tokenizer marks word starts itself: " quick" counts as "quick" alone,
    the tokens it takes inside text, not as two word markers."""
    from kiln.tokenize.report import HeldoutDoc, measure

    llama2, _ = pairs["llama2"]
    assert llama2.prepends_space and not pairs["llama3"][0].prepends_space
    report = measure(llama2, [HeldoutDoc("prose", "en", "The quick quick quick")])
    in_text = len(llama2.encode("The quick quick quick")) / 4
    assert report["all"]["fertility"] == pytest.approx(in_text)
    assert len(llama2.encode(" quick")) > len(llama2.encode("quick"))  # what counting " quick" alone gave


def test_tiktoken_is_not_offered_when_its_merge_order_would_differ() -> None:
    """tiktoken merges by the id a merge makes, tokenizers by the merges' order: "cab" is c+ab to the
    file (a b comes first) but ca+b to tiktoken (ca has the lower id), so tiktoken is not a candidate."""
    from tokenizers import Tokenizer as HF

    from kiln.text.byte_level import byte_alphabet
    from kiln.text.engines import reference, with_tiktoken

    vocab = {c: b for b, c in byte_alphabet().items()} | {"ca": 256, "ab": 257}
    hf = HF(models.BPE(vocab=vocab, merges=[("a", "b"), ("c", "a")]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert reference(hf).encode("cab") == [99, 257]
    assert with_tiktoken(json.loads(hf.to_str()), hf) is None
    hf = HF(models.BPE(vocab=vocab | {"ca": 257, "ab": 256}, merges=[("a", "b"), ("c", "a")]))  # ids in merge order
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert with_tiktoken(json.loads(hf.to_str()), hf) is not None


def test_roles_are_read_as_transformers_reads_them_and_bad_files_are_named(tmp_path: Path) -> None:
    folder = save("llama2", tmp_path / "llama2")
    (folder / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<unk>", "pad_token": None}))
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.suffix == ".json"}
    ours = HfTokenizer(files, str(folder))
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    assert ours.boundaries.eos == theirs.eos_token == "<unk>"  # the map's role over tokenizer_config.json's
    with pytest.raises(FatalError, match=r"llama2/tokenizer_config.json: not valid JSON"):
        HfTokenizer(files | {"tokenizer_config.json": b"{oops"}, str(folder))
    with pytest.raises(FatalError, match=r"special_tokens_map.json: a JSON list, not an object"):
        HfTokenizer(files | {"special_tokens_map.json": b"[]"}, str(folder))


@settings(max_examples=80, deadline=None)
@given(pieces=st.lists(st.one_of(TEXT, st.sampled_from(["<tool_call>", "</tool_call>", "<tool", "call>"])), max_size=6))
def test_non_special_added_tokens_keep_the_fast_encoder_and_transformers_ids(pieces: list[str]) -> None:
    """Qwen2.5's kind: added tokens that are not special are matched in text by tokenizers (specials split or
    not); kiln cuts them out before splintr encodes the rest."""
    ours, theirs = qwen_with_tools()
    assert ours.encoder_name == "splintr"
    text = "".join(pieces)
    assert ours.encode(text) == theirs(text, add_special_tokens=False)["input_ids"]


@cache
def qwen_with_tools() -> tuple[HfTokenizer, object]:
    from tempfile import mkdtemp

    from hf_tokenizers import ROLES, build
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_str(build("qwen2").to_str())
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<tool_call>", "</tool_call>")])
    folder = Path(mkdtemp()) / "qwen-tools"
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **ROLES["qwen2"]).save_pretrained(folder)
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.suffix == ".json"}
    return HfTokenizer(files, str(folder)), transformers.AutoTokenizer.from_pretrained(
        folder, split_special_tokens=True
    )
