"""kiln.tokenize.extend on an imported run: terms become whole tokens of the model's own tokenizer
(byte-level BPE as Llama 3 ships it, SentencePiece-style BPE as Llama 2 does), the model grows mean
rows for them, and transformers reads the extension with the same ids and logits as kiln."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_tokenizers import TRAINING_TEXT
from hf_tokenizers import save as save_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from kiln.cli import main
from kiln.core.errors import FatalError
from kiln.core.layout import CHECKPOINT, TOKENIZER, TOKENIZER_EXTENDED, TRAIN, RunLayout
from kiln.evaluate.config import ExportConfig, GenerateConfig, ImportConfig
from kiln.evaluate.export import run as export
from kiln.evaluate.import_hf import run as import_hf
from kiln.model.weights import load_trained_model
from kiln.text.hf_tokenizer import CONFIG, HfTokenizer
from kiln.text.load import load_tokenizer
from kiln.text.specials import FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, MASK, sentinel
from kiln.tokenize.extend import ExtendConfig, extend_hf, parse_specials
from kiln.tokenize.extend import run as extend_run

transformers = pytest.importorskip("transformers")

TERMS = ["pretraining", "tokenizer", "dataloader", "checkpoint"]
# Text without the terms (nor any piece equal to one of their forms).
PLAIN = "".join(TRAINING_TEXT) + "We train a model on text, then evaluate it; the loader reads shards.\n"
DOMAIN_TEXT = (
    "Before pretraining, the tokenizer is fixed and the dataloader streams shards; a checkpoint is saved every "
    "hour.\nResume pretraining from the last checkpoint when the dataloader stalls.\n"
)
PADDED_ROWS = 8  # the model's embedding is larger than the vocabulary, as many open models pad it


def imported_run(root: Path, kind: str) -> Path:
    """A run imported from a random model saved by transformers with `kind`'s tokenizer beside it: Qwen2's
    model for its tokenizer (transformers reads that with a class of its own), Llama's for the others."""
    folder = save_tokenizer(kind, root / f"hf-{kind}")
    vocab = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size()
    torch.manual_seed(0)
    family = "Qwen2" if kind == "qwen2" else "Llama"
    config = getattr(transformers, f"{family}Config")(
        vocab_size=vocab + PADDED_ROWS,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        initializer_range=0.2,
        tie_word_embeddings=False,
    )
    getattr(transformers, f"{family}ForCausalLM")(config).save_pretrained(folder)
    run_dir = root / "runs" / kind
    import_hf(ImportConfig(source=str(folder)), run_dir)
    return run_dir


@pytest.fixture(scope="module", params=["llama3", "gpt2", "qwen2", "llama2"])
def extended(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp(request.param)
    run_dir = imported_run(root, request.param)
    terms, text = root / "terms.txt", root / "val.txt"
    terms.write_text("\n".join(TERMS) + "\n", encoding="utf-8")
    text.write_text(DOMAIN_TEXT, encoding="utf-8")
    argv = ["extend-tokenizer", "--terms", str(terms), "--text", str(text), "--set", f"runs_dir={run_dir.parent}"]
    assert main([*argv, "--set", f"name={run_dir.name}"]) == 0
    manifest = extend_run(ExtendConfig(terms=str(terms), text=str(text)), run_dir)  # up to date: the same manifest
    layout = RunLayout(run_dir)
    return {
        "kind": request.param,
        "run": run_dir,
        "manifest": manifest,
        "old": load_tokenizer(layout.tokenizer_json),
        "new": load_tokenizer(layout.stage(TOKENIZER_EXTENDED) / "tokenizer.json"),
        "added": extend_hf(load_tokenizer(layout.tokenizer_json), TERMS)[1],
    }


def test_each_term_form_is_one_new_token(extended: dict[str, Any]) -> None:
    old, new, added = extended["old"], extended["new"], extended["added"]
    assert isinstance(new, HfTokenizer) and new.encoder_name
    forms = [f for f in added if not f.step]
    # The bare form is a piece of its own only under a byte-level pre-split.
    bare = extended["kind"] != "llama2"
    assert [f.form for f in forms] == [form for t in TERMS for form in ((" " + t, t) if bare else (" " + t,))]
    # Only the Qwen2 run's terms are made by merges, with tokens on the way.
    assert (len(forms) < len(added)) == (extended["kind"] == "qwen2")
    assert sorted(f.id for f in added) == list(range(old.vocab_size, old.vocab_size + len(added)))
    assert new.vocab_size == old.vocab_size + len(added)
    for f in forms:
        assert f.new and len(f.pieces) > 1 and old.encode("\n" + f.form) == old.encode("\n") + f.pieces
        assert new.encode("\n" + f.form) == new.encode("\n") + [f.id]
    text = "the tokenizer and the dataloader run pretraining from a checkpoint every day"
    ids = new.encode(text)
    assert all(ids.count(f.id) == 1 for f in forms if f.form.startswith(" ")) and new.decode(ids) == text


def test_text_without_the_terms_keeps_its_ids(extended: dict[str, Any]) -> None:
    old, new = extended["old"], extended["new"]
    new_ids = {f.id for f in extended["added"]}
    for text in (PLAIN, PLAIN.upper(), " ".join(PLAIN.split()[::-1])):
        ids = new.encode(text)
        assert ids == new.hf.encode(text, add_special_tokens=False).ids
        if extended["kind"] == "qwen2":  # a merge on the way to a term may fire elsewhere: only then do ids change
            assert ids == old.encode(text) or new_ids & set(ids)
        else:
            assert ids == old.encode(text)


def test_the_folder_files_and_boundaries_are_kept(extended: dict[str, Any]) -> None:
    old, new = extended["old"], extended["new"]
    assert new.files["tokenizer.json"] != old.files["tokenizer.json"]
    assert {n: d for n, d in new.files.items() if n != "tokenizer.json"} == {
        n: d for n, d in old.files.items() if n != "tokenizer.json"
    }
    assert new.origin == old.origin and new.boundaries == old.boundaries
    assert (new.bos_id, new.eot_id, new.pad_id) == (old.bos_id, old.eot_id, old.pad_id)


def test_new_rows_are_the_mean_of_the_old_pieces_rows(extended: dict[str, Any]) -> None:
    layout = RunLayout(extended["run"])
    before = load_trained_model(layout.checkpoint)
    after = load_trained_model(layout.stage(TOKENIZER_EXTENDED) / CHECKPOINT)
    rows = extended["old"].vocab_size + PADDED_ROWS  # the new ids take over the padding rows, then grow it
    assert before.cfg.vocab_size == rows and after.cfg.vocab_size == max(rows, extended["new"].vocab_size)
    new_ids = [f.id for f in extended["added"]]
    kept = [i for i in range(rows) if i not in new_ids]
    for name in ("embed.weight", "lm_head.weight"):
        old_rows, new_rows = before.state_dict()[name], after.state_dict()[name]
        assert torch.equal(new_rows[kept], old_rows[kept])
        for f in extended["added"]:
            assert torch.allclose(new_rows[f.id], old_rows[f.pieces].mean(dim=0))


def test_summary_states_the_method_and_fertility_before_and_after(extended: dict[str, Any]) -> None:
    added = [f for f in extended["added"] if not f.step]
    summary = (RunLayout(extended["run"]).stage(TOKENIZER_EXTENDED) / "summary.txt").read_text()
    before = sum(len(f.pieces) for f in added) / len(added)
    assert f"{len(extended['added'])} new tokens for 4 terms; checkpoint resized" in summary
    assert "is the mean of the rows of the tokens its form was cut into before" in summary
    assert f"fertility of the term forms (tokens per form in running text): {before:.2f} -> 1.00" in summary
    counts = extended["manifest"]["counts"]
    assert counts["added_tokens"] == len(extended["added"])
    fertility = counts["fertility"]  # kiln.tokenize.report's measures of the domain's validation text
    assert fertility["after"]["tokens_per_word"] < fertility["before"]["tokens_per_word"]
    # The report encodes " word" alone, which a SentencePiece-style tokenizer reads as two space markers.
    assert fertility["after"]["fertility"] < fertility["before"]["fertility"] or extended["kind"] == "llama2"
    assert (
        f"fertility {fertility['before']['fertility']} -> {fertility['after']['fertility']}, tokens per word "
        f"{fertility['before']['tokens_per_word']} -> {fertility['after']['tokens_per_word']}"
    ) in summary


WORDS = st.sampled_from([*TERMS, "Pre", "un", "s", "x", "the", "é", "東京", "12", "_", "-"])
GLUE = st.sampled_from(["", " ", "  ", "\n", ".", ", ", "\t"])


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_ids_agree_with_transformers_on_text_with_the_terms(extended: dict[str, Any], data: st.DataObject) -> None:
    theirs = auto_tokenizer(RunLayout(extended["run"]).stage(TOKENIZER_EXTENDED))
    parts = data.draw(st.lists(st.tuples(WORDS, GLUE), max_size=12))
    text = "".join(w + g for w, g in parts) + data.draw(st.text(max_size=8))
    assert extended["new"].encode(text) == theirs(text, add_special_tokens=False)["input_ids"]


def auto_tokenizer(folder: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(folder, split_special_tokens=True)


def test_the_export_loads_in_transformers_with_the_same_ids_and_logits(
    extended: dict[str, Any], tmp_path: Path
) -> None:
    """A run of the extended tokenizer and checkpoint, exported: transformers' folder is kiln's model."""
    source = RunLayout(extended["run"]).stage(TOKENIZER_EXTENDED)
    run_dir = tmp_path / "extended-run"
    shutil.copytree(source, run_dir / TOKENIZER, ignore=shutil.ignore_patterns(CHECKPOINT, "manifest.json"))
    shutil.copytree(source / CHECKPOINT, RunLayout(run_dir).checkpoint)
    assert RunLayout(run_dir).checkpoint.parent == run_dir / TRAIN
    folder = Path(export(ExportConfig(), GenerateConfig(), run_dir)["counts"]["folder"])
    text = "the tokenizer and the dataloader run pretraining from a checkpoint. " + TRAINING_TEXT[1]
    ours_tok = load_tokenizer(run_dir / TOKENIZER / "tokenizer.json")
    ids = ours_tok.encode(text)
    assert auto_tokenizer(folder)(text, add_special_tokens=False)["input_ids"] == ids
    assert len(transformers.AutoTokenizer.from_pretrained(folder)) == ours_tok.vocab_size
    ours = load_trained_model(RunLayout(run_dir).checkpoint)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    batch = torch.tensor([ids[:64]])
    with torch.no_grad():
        ours_BTV, theirs_BTV = ours(batch), theirs(batch).logits
    assert ours_BTV.shape == theirs_BTV.shape and (ours_BTV - theirs_BTV).abs().max().item() < 1e-5


@pytest.mark.parametrize(
    ("kind", "named", "model_type"),
    [("llama2", "LlamaTokenizer", "llama"), ("gpt2", None, "gpt2"), ("qwen2", "Qwen2Tokenizer", "qwen2")],
)
def test_transformers_reads_the_terms_whatever_tokenizer_class_the_folder_names(
    tmp_path: Path, kind: str, named: str | None, model_type: str
) -> None:
    # transformers 5 rebuilds these classes (or config.json's model_type's, when none is named) from the
    # vocabulary and merges alone: the folder is told to run tokenizer.json as it is, except for Qwen2, whose
    # class transformers picks whatever the folder says, so its terms are made by merges.
    folder = save_tokenizer(kind, tmp_path / "in")
    settings = {k: v for k, v in json.loads((folder / CONFIG).read_text()).items() if k != "tokenizer_class"}
    (folder / CONFIG).write_text(json.dumps(settings | ({"tokenizer_class": named} if named else {})))
    files = {n: (folder / n).read_bytes() for n in ("tokenizer.json", CONFIG)}
    origin = {"config.json": json.dumps({"model_type": model_type}).encode()}
    new, added = extend_hf(HfTokenizer(files, str(folder), origin=origin), TERMS)
    if model_type == "qwen2":
        assert new.files[CONFIG] == files[CONFIG] and any(f.step for f in added)
    else:
        assert json.loads(new.files[CONFIG]) == settings | {"tokenizer_class": "PreTrainedTokenizerFast"}
    out = tmp_path / "out"
    out.mkdir()
    for name, data in {**new.files, **origin}.items():
        (out / name).write_bytes(data)
    theirs = auto_tokenizer(out)
    text = "the tokenizer and the dataloader run pretraining from a checkpoint every day"
    ids = new.encode(text)
    assert theirs(text, add_special_tokens=False)["input_ids"] == ids
    assert all(ids.count(f.id) == 1 for f in added if f.form.startswith(" ") and not f.step)
    assert theirs(PLAIN, add_special_tokens=False)["input_ids"] == new.encode(PLAIN)


@pytest.mark.parametrize(
    ("kind", "term", "message"),
    [
        ("llama2", "Kubernetes", r"term 'Kubernetes': .* lacks some of its characters"),
        ("llama3", "COVID-19", r"term 'COVID-19': .* cuts it into several pieces"),
        ("llama2", "data loader", r"term 'data loader': .* cuts it into several pieces"),
        ("unigram", "pretraining", r"a Unigram tokenizer .*; extend-tokenizer adds terms to byte-level"),
        ("bert", "pretraining", r"a WordPiece tokenizer .*; extend-tokenizer adds terms to byte-level"),
    ],
)
def test_what_cannot_become_one_token_is_refused(tmp_path: Path, kind: str, term: str, message: str) -> None:
    folder = save_tokenizer(kind, tmp_path / kind)
    files = {n: (folder / n).read_bytes() for n in ("tokenizer.json", "tokenizer_config.json") if (folder / n).exists()}
    with pytest.raises(FatalError, match=message):
        extend_hf(HfTokenizer(files, str(folder)), [term])


def edited(kind: str, folder: Path, token: str) -> HfTokenizer:
    """`kind`'s tokenizer with `token` in its vocabulary and no merge that makes it."""
    save_tokenizer(kind, folder)
    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    data["model"]["vocab"][token] = len(data["model"]["vocab"]) + len(data["added_tokens"])
    files = {"tokenizer.json": json.dumps(data).encode(), "tokenizer_config.json": (folder / CONFIG).read_bytes()}
    return HfTokenizer(files, str(folder))


def test_a_tokenizer_where_reading_whole_pieces_would_change_ids_is_refused(tmp_path: Path) -> None:
    # " zq" cannot be reached by merges: reading that piece as one token would change its ids.
    with pytest.raises(FatalError, match=r"1 tokens of tokenizer.json do not encode as themselves \(\['Ġzq'\]\)"):
        extend_hf(edited("gpt2", tmp_path / "gpt2", "Ġzq"), TERMS)
    # A token across a space marker: cutting the text at each marker would change its ids.
    with pytest.raises(FatalError, match=r"tokens that hold '▁' after another character \(\['a▁b'\]\)"):
        extend_hf(edited("llama2", tmp_path / "llama2", "a▁b"), TERMS)


def test_kiln_special_tokens_join_an_imported_tokenizer_with_mean_rows(tmp_path: Path) -> None:
    run_dir = imported_run(tmp_path, "llama3")
    terms = tmp_path / "terms.txt"
    terms.write_text("pretraining\n", encoding="utf-8")
    manifest = extend_run(ExtendConfig(terms=str(terms), specials="fim,mask,sentinels:2"), run_dir)
    layout = RunLayout(run_dir)
    folder = layout.stage(TOKENIZER_EXTENDED)
    old, new = load_tokenizer(layout.tokenizer_json), load_tokenizer(folder / "tokenizer.json")
    spellings = [FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX, MASK, sentinel(0), sentinel(1)]
    ids = list(range(old.vocab_size + 2, old.vocab_size + 8))  # after the term's two forms
    assert old.fim_ids is None and old.mask_id is None and old.sentinel_ids == []
    assert new.fim_ids == tuple(ids[:3]) and new.mask_id == ids[3] and new.sentinel_ids == ids[4:]
    assert manifest["counts"]["special_tokens"] == spellings
    before, after = load_trained_model(layout.checkpoint), load_trained_model(folder / CHECKPOINT)
    for name in ("embed.weight", "lm_head.weight"):
        mean = before.state_dict()[name][: old.vocab_size].mean(dim=0)
        assert all(torch.allclose(after.state_dict()[name][i], mean) for i in ids)
    assert transformers.AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids(spellings) == ids
    text = f"{FIM_PREFIX}def f(): {FIM_SUFFIX} pretraining"  # spelled in a document: text, for both
    assert new.encode(text) == auto_tokenizer(folder)(text, add_special_tokens=False)["input_ids"]
    assert not set(ids) & set(new.encode(text))


def test_specials_list() -> None:
    assert parse_specials("mask, sentinels:2,fim,mask") == [
        MASK,
        sentinel(0),
        sentinel(1),
        FIM_PREFIX,
        FIM_MIDDLE,
        FIM_SUFFIX,
    ]
    for bad in ("sentinels", "sentinels:0", "fim:2", "cls"):
        with pytest.raises(FatalError, match=rf"--specials '{bad}': '{bad}' is not fim, mask or sentinels:N"):
            parse_specials(bad)
