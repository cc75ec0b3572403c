"""kiln.evaluate.import_hf: a Llama folder saved by transformers becomes a kiln run with the same
logits; an exported kiln run comes back bit for bit; folders kiln cannot reproduce are refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from kiln.core.errors import FatalError
from kiln.core.layout import RunLayout
from kiln.evaluate.config import ExportConfig, GenerateConfig, ImportConfig
from kiln.evaluate.export import run as export
from kiln.evaluate.generate import run as generate
from kiln.evaluate.import_hf import run as import_hf
from kiln.model.config import ModelConfig
from kiln.model.init import build_model
from kiln.model.weights import checkpoint_config, load_trained_model, load_weights_into, save_weights
from kiln.text.specials import special_tokens
from kiln.text.tokenizer import KilnTokenizer, train_bpe

transformers = pytest.importorskip("transformers")

TEXT = "def parse(value):\n    return value.strip().split(',')\n\nThe quick brown fox jumps over the lazy dog.\n"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> KilnTokenizer:
    tok = train_bpe([TEXT] * 30, vocab_size=360, min_frequency=2, specials=special_tokens(1, 0))
    tok.save(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    return tok


def llama_folder(root: Path, tokenizer: KilnTokenizer, **config: object) -> tuple[Path, torch.nn.Module]:
    """A random LlamaForCausalLM saved by transformers, with kiln's tokenizer.json beside it."""
    settings = {"vocab_size": tokenizer.vocab_size, "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "initializer_range": 0.2, "tie_word_embeddings": False}
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**settings | config)).eval()
    folder = root / "hf-llama"
    model.save_pretrained(folder)
    assert tokenizer.path is not None
    shutil.copyfile(tokenizer.path, folder / "tokenizer.json")
    return folder, model


@pytest.mark.parametrize("config", [{}, {"tie_word_embeddings": True, "rope_theta": 50000.0}])
def test_a_transformers_llama_imports_with_the_same_logits(tmp_path: Path, tokenizer: KilnTokenizer, config: dict) -> None:
    folder, theirs = llama_folder(tmp_path, tokenizer, **config)
    run_dir = tmp_path / "runs" / "imported"
    manifest = import_hf(ImportConfig(source=str(folder)), run_dir)
    assert manifest["counts"]["architecture"] == "LlamaForCausalLM"
    ours = load_trained_model(RunLayout(run_dir).checkpoint)
    assert ours.cfg.tie_embeddings == config.get("tie_word_embeddings", False) and ours.cfg.rope_theta == config.get("rope_theta", 10000.0)
    ids = torch.cat([torch.randint(0, tokenizer.vocab_size, (2, 100), generator=torch.Generator().manual_seed(2)), torch.tensor([tokenizer.encode(TEXT * 8)[:100]])])
    with torch.no_grad():
        ours_BTV, theirs_BTV = ours(ids), theirs(ids).logits
    assert ours_BTV.std() > 1.0 and (ours_BTV - theirs_BTV).abs().max().item() < 1e-4
    # The run works as a trained one: generation, and a starting point for continued pretraining.
    sample = generate(GenerateConfig(prompt="def ", max_new_tokens=5, temperature=0), run_dir)["counts"]["sample"]
    assert sample.startswith("def ")
    fresh = build_model(checkpoint_config(RunLayout(run_dir).checkpoint), 1, "cpu")
    load_weights_into(fresh, RunLayout(run_dir).checkpoint)
    assert torch.equal(fresh.lm_head.weight, ours.lm_head.weight)
    assert "train.init_from" in (run_dir / "train" / "summary.txt").read_text()
    # ... and exports again, its card saying where it came from.
    export(ExportConfig(), GenerateConfig(), run_dir)
    assert f"Imported from the Hugging Face folder {folder}" in (run_dir / "export" / "hf" / "README.md").read_text()
    assert KilnTokenizer.load(RunLayout(run_dir).tokenizer_json).encode(TEXT) == tokenizer.encode(TEXT)


def test_an_imported_run_scores_any_file_as_transformers_does(tmp_path: Path, tokenizer: KilnTokenizer) -> None:
    from kiln.evaluate.config import EvalConfig
    from kiln.evaluate.run import run as evaluate
    from kiln.pipeline import read_for_eval

    folder, theirs = llama_folder(tmp_path, tokenizer)
    run_dir = tmp_path / "runs" / "imported"
    import_hf(ImportConfig(source=str(folder)), run_dir)
    data = tmp_path / "held_out.jsonl"
    texts = [TEXT * 3, "The lazy dog sleeps.\n" * 20]
    data.write_text("".join(json.dumps({"text": t, "source": "mine"}) + "\n" for t in texts))
    scored = evaluate(EvalConfig(data=[str(data)]), run_dir, read_file=read_for_eval)["counts"]["data"]["held_out.jsonl"]
    # The same windows through transformers: documents with end of document after each, cut in 129-token windows.
    ids = torch.tensor([t for text in texts for t in [*tokenizer.encode(text), tokenizer.eot_id]])
    n = (len(ids) - 1) // 128
    windows = ids[: n * 128 + 1].unfold(0, 129, 128)
    with torch.no_grad():
        logits = theirs(windows[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()).item()
    assert scored["sources"]["mine"]["tokens"] == n * 128
    assert scored["sources"]["mine"]["loss"] == pytest.approx(loss, abs=1e-4)


def test_export_then_import_gives_back_the_same_weights(tmp_path: Path, tokenizer: KilnTokenizer) -> None:
    source = tmp_path / "runs" / "source"
    layout = RunLayout(source)
    layout.tokenizer_json.parent.mkdir(parents=True)
    tokenizer.save(layout.tokenizer_json)
    cfg = ModelConfig(vocab_size=tokenizer.vocab_size, d_model=64, n_layers=2, n_heads=4, n_kv_heads=1, qk_norm=True, tie_embeddings=True, max_seq_len=64)
    model = build_model(cfg, 3, "cpu")
    layout.checkpoint.parent.mkdir(parents=True)
    save_weights(layout.checkpoint, model)
    export(ExportConfig(), GenerateConfig(), source)
    back = tmp_path / "runs" / "back"
    import_hf(ImportConfig(source=str(source / "export" / "hf")), back)
    again = load_trained_model(RunLayout(back).checkpoint)
    shape = lambda c: {k: v for k, v in c.model_dump().items() if k not in ("ffn_hidden", "ffn_multiplier")} | {"hidden": c.hidden}  # noqa: E731
    assert shape(again.cfg) == shape(cfg)  # the width comes back as ffn_hidden
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c | {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}, "RoPE scaling 'linear'"),
        (lambda c: c | {"attention_bias": True}, "attention_bias true"),
        (lambda c: c | {"architectures": ["MistralForCausalLM"]}, "architecture 'MistralForCausalLM'"),
    ],
)
def test_settings_kiln_cannot_reproduce_are_refused_by_name(tmp_path: Path, tokenizer: KilnTokenizer, edit: object, message: str) -> None:
    folder, _ = llama_folder(tmp_path, tokenizer)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(edit(config)))  # type: ignore[operator]
    with pytest.raises(FatalError, match=message):
        import_hf(ImportConfig(source=str(folder)), tmp_path / "runs" / "x")
    assert not (tmp_path / "runs" / "x").exists()


def test_a_foreign_tokenizer_is_refused_with_the_reason(tmp_path: Path, tokenizer: KilnTokenizer) -> None:
    folder, _ = llama_folder(tmp_path, tokenizer)
    data = json.loads((folder / "tokenizer.json").read_text())
    data["model"]["ignore_merges"] = False
    (folder / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(FatalError, match="not a tokenizer kiln made .*ignore_merges false"):
        import_hf(ImportConfig(source=str(folder)), tmp_path / "runs" / "x")
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    shutil.copyfile(tokenizer.path, folder / "tokenizer.json")  # type: ignore[arg-type]
    with pytest.raises(FatalError, match="kiln does not unpickle weights"):
        import_hf(ImportConfig(source=str(folder)), tmp_path / "runs" / "x")
