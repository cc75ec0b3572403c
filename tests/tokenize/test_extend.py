"""kiln.tokenize.extend: terms become whole tokens; a model grows rows for them and is otherwise unchanged."""

from __future__ import annotations

import json
import pydoc_data.topics
import shutil
from pathlib import Path

import pytest
import torch

from kiln.cli import main
from kiln.core.errors import FatalError
from kiln.model.config import ModelConfig
from kiln.model.transformer import Transformer
from kiln.model.weights import load_trained_model, save_weights
from kiln.text.specials import special_tokens
from kiln.text.tokenizer import KilnTokenizer, train_bpe
from kiln.tokenize.config import TokenizerConfig
from kiln.tokenize.extend import ExtendConfig, extend, read_terms, resize
from kiln.tokenize.extend import run as extend_run
from kiln.tokenize.train import run as train_tokenizer

TERMS = ["Kubernetes", "pretraining", "東京都庁"]
# Text that never contains a term (nor a piece whose merges could meet one).
PLAIN = (
    "def parse(tokens):\n    return [t.strip() for t in tokens if t]  # the usual case\n\nStatements are executed in "
    "order."
)


@pytest.fixture(scope="module")
def tok() -> KilnTokenizer:
    texts = [pydoc_data.topics.topics[name] for name in sorted(pydoc_data.topics.topics)[:60]]
    return train_bpe(texts, vocab_size=600, min_frequency=2, specials=special_tokens(2, 2))


@pytest.fixture(scope="module")
def extended(tok):
    return extend(tok, TERMS)


def test_terms_become_one_token(tok, extended):
    new, added = extended
    assert [(f.term, f.form) for f in added] == [(t, form) for t in TERMS for form in (" " + t, t)]
    for f in added:
        assert len(f.pieces) > 1 and f.pieces == tok.encode(f.form)  # several tokens before
        assert new.encode(f.form) == [f.id] and f.new  # one after, a new id
    assert sorted(f.id for f in added) == list(range(tok.vocab_size, tok.vocab_size + 6))
    assert new.vocab_size == tok.vocab_size + 6 and new.specials == tok.specials
    text = "We run Kubernetes for pretraining.\nKubernetes: 東京都庁 (pretraining)"
    ids = new.encode(text)
    assert new.decode(ids) == text
    assert ids.count(added[0].id) == 1 and ids.count(added[1].id) == 1 and ids.count(added[2].id) == 1
    assert new.hf.encode(text, add_special_tokens=False).ids == ids  # the saved HF file agrees with kiln's encoder


def test_terms_inside_longer_words_agree_with_the_hf_file(tok, extended):
    # A new token can also form inside a longer piece ("Kubernetesify"); both encoders must agree there.
    new, _ = extended
    for text in ("Kubernetesify unpretraining Kubernetes_x xpretrainingx 東京都庁舎", "formats reformat " * 3):
        ids = new.encode(text)
        assert new.hf.encode(text, add_special_tokens=False).ids == ids and new.decode(ids) == text
    common, _ = extend(tok, ["format", "the", "ing"])
    for text in ("formats unformatted reformatting", "andthes bathing singing", " defineed"):
        assert common.hf.encode(text, add_special_tokens=False).ids == common.encode(text)


def test_text_without_the_terms_encodes_as_before(tok, extended):
    new, _ = extended
    for text in (PLAIN, *(pydoc_data.topics.topics[name] for name in sorted(pydoc_data.topics.topics)[60:80])):
        assert new.encode(text) == tok.encode(text) == new.hf.encode(text, add_special_tokens=False).ids


def test_a_form_already_one_token_is_left_alone(tok):
    word = next(w for w in ("the", "and", "is") if len(tok.encode(" " + w)) == 1)
    new, added = extend(tok, [word])
    assert added[0].form == " " + word and added[0].id is None and not added[0].new
    assert new.vocab_size == tok.vocab_size + (0 if len(tok.encode(word)) == 1 else 1)


def test_multi_piece_term_is_refused(tok):
    with pytest.raises(
        FatalError, match=r"term 'COVID-19': kiln's pre-split cuts it into 3 pieces \['COVID', '-', '19'\]"
    ):
        extend(tok, ["COVID-19"])


@pytest.mark.parametrize("term", ["'s", ".NET", "_init"])
def test_term_whose_spaced_form_splits_adds_the_bare_form(tok, term):
    new, added = extend(tok, [term])
    assert [f.form for f in added] == [term] and new.encode(term) == [
        added[0].id if added[0].new else new.encode(term)[0]
    ]
    assert new.hf.encode(f"x {term} y{term}", add_special_tokens=False).ids == new.encode(f"x {term} y{term}")


def test_checkpoint_with_fewer_rows_than_the_tokenizer_is_refused(tok, extended):
    new, added = extended
    small = Transformer(ModelConfig(vocab_size=tok.vocab_size - 10, d_model=16, n_layers=1, n_heads=1, max_seq_len=16))
    with pytest.raises(FatalError, match="fewer than the tokenizer's"):
        resize(small, added, tok.vocab_size, new.vocab_size)


def test_terms_file(tmp_path):
    path = tmp_path / "terms.txt"
    path.write_text("Kubernetes\n\n  pretraining  \nKubernetes\n", encoding="utf-8")
    assert read_terms(path) == ["Kubernetes", "pretraining"]
    path.write_text("\n \n")
    with pytest.raises(FatalError, match="no terms"):
        read_terms(path)
    path.write_bytes(b"caf\xe9\n")
    with pytest.raises(FatalError, match="not UTF-8"):
        read_terms(path)
    with pytest.raises(FatalError, match="no such terms file"):
        read_terms(tmp_path / "missing.txt")


@pytest.mark.parametrize("tied", [False, True])
def test_resized_model_keeps_its_outputs_on_text_without_terms(tok, extended, tied):
    new, added = extended
    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=2, max_seq_len=64, tie_embeddings=tied)
    ).eval()
    grown = resize(model, added, tok.vocab_size, new.vocab_size)
    assert grown.cfg.vocab_size == new.vocab_size and grown.embed.weight.shape == (new.vocab_size, 32)
    ids = torch.tensor([new.encode(PLAIN)[:64]])
    assert ids.tolist()[0] == tok.encode(PLAIN)[:64]
    with torch.no_grad():
        before, after = model(ids), grown(ids)
    assert after.shape[-1] == new.vocab_size
    assert torch.equal(after[..., : tok.vocab_size], before)  # every old logit unchanged, bit for bit
    for f in added:
        assert torch.allclose(grown.embed.weight[f.id], model.embed.weight[f.pieces].mean(dim=0))
        assert torch.allclose(grown.lm_head.weight[f.id], model.lm_head.weight[f.pieces].mean(dim=0))
    assert (grown.lm_head.weight is grown.embed.weight) == tied


def test_stage_extends_tokenizer_and_checkpoint(curated_run, tmp_path, capsys):
    run_dir = Path(shutil.copytree(curated_run, tmp_path / "run"))
    train_tokenizer(TokenizerConfig(vocab_size=600, sample_mb=1.0, heldout_fraction=0.2), run_dir)
    old = KilnTokenizer.load(run_dir / "tokenizer" / "tokenizer.json")
    torch.manual_seed(0)
    save_weights(
        run_dir / "train" / "checkpoint",
        Transformer(ModelConfig(vocab_size=old.vocab_size, d_model=32, n_layers=1, n_heads=2, max_seq_len=32)),
    )
    terms = tmp_path / "terms.txt"
    terms.write_text("Kubernetes\npretraining\n", encoding="utf-8")

    argv = ["extend-tokenizer", "--terms", str(terms), "--set", f"runs_dir={tmp_path}", "--set", "name=run"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"vocab {old.vocab_size} -> {old.vocab_size + 4}: 4 new tokens for 2 terms; checkpoint resized" in out
    assert "' Kubernetes'" in out and " -> 1" in out
    folder = run_dir / "tokenizer-extended"
    new = KilnTokenizer.load(folder / "tokenizer.json")
    assert new.encode(" Kubernetes") == [old.vocab_size]
    assert load_trained_model(folder / "checkpoint").cfg.vocab_size == new.vocab_size
    rows = json.loads((folder / "terms.json").read_text())
    assert [(r["form"], r["tokens_after"]) for r in rows] == [
        (" Kubernetes", 1),
        ("Kubernetes", 1),
        (" pretraining", 1),
        ("pretraining", 1),
    ]
    assert all(r["tokens_before"] > 1 for r in rows)
    manifest = extend_run(ExtendConfig(terms=str(terms)), run_dir)  # unchanged inputs: up to date
    assert manifest["counts"] == {
        "vocab_size": new.vocab_size,
        "added_tokens": 4,
        "terms": 2,
        "checkpoint_resized": True,
    }
    with pytest.raises(FatalError, match="no checkpoint there"):
        extend_run(ExtendConfig(terms=str(terms), checkpoint=str(tmp_path / "nowhere")), run_dir)
    with pytest.raises(FatalError, match="inside tokenizer-extended/, which this stage rewrites"):
        extend_run(ExtendConfig(terms=str(terms), checkpoint=str(folder / "checkpoint")), run_dir, force=True)
    assert (folder / "checkpoint" / "model.safetensors").is_file()  # refused before anything was removed
    with pytest.raises(FatalError, match="is kiln's own tokenizer, which has mask, FIM and"):
        extend_run(ExtendConfig(terms=str(terms), specials="fim"), run_dir, force=True)
