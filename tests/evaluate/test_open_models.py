"""Open models with their own tokenizers, per family: a random model built with transformers' own
class and config (bf16-stored, sharded safetensors with an index), imported, gives transformers'
logits, greedy generation and loss, and exports back to a folder transformers loads with the same
logits, its tokenizer files byte for byte and its config.json keys kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_tokenizers import save as save_tokenizer

from kiln.core.layout import RunLayout
from kiln.eval_files import read_for_eval
from kiln.evaluate.config import EvalConfig, ExportConfig, GenerateConfig, ImportConfig
from kiln.evaluate.export import run as export
from kiln.evaluate.generate import complete
from kiln.evaluate.import_hf import run as import_hf
from kiln.evaluate.run import run as evaluate
from kiln.model.weights import load_trained_model
from kiln.text.hf_tokenizer import HfTokenizer
from kiln.text.load import load_tokenizer

transformers = pytest.importorskip("transformers")

SIZES = {
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "initializer_range": 0.2,
}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
    "rope_theta": 500000.0,
}
# family: (transformers class prefix, tokenizer kind, config settings)
FAMILIES = {
    "llama2": ("Llama", "llama2", {"tie_word_embeddings": False}),
    "tinyllama": ("Llama", "llama2", {"tie_word_embeddings": False, "num_key_value_heads": 1}),
    "llama3": ("Llama", "llama3", {"tie_word_embeddings": True, "rope_parameters": LLAMA3_ROPE}),
    "smollm2": ("Llama", "gpt2", {"tie_word_embeddings": True, "rope_theta": 100000.0}),
    "mistral": ("Mistral", "llama2", {"tie_word_embeddings": False, "sliding_window": None}),
    "qwen2": ("Qwen2", "qwen2", {"tie_word_embeddings": True, "use_sliding_window": False}),
    "qwen3": ("Qwen3", "qwen2", {"tie_word_embeddings": False, "head_dim": 32, "use_sliding_window": False}),
}
TEXT = "def parse(value):\n    return value.strip().split(',')\n\nThe quick brown fox jumps over the lazy dog. "


def open_model_folder(root: Path, family: str) -> tuple[Path, torch.nn.Module]:
    """The family's random model, stored in bf16 across several shards with an index, and its tokenizer."""
    prefix, kind, settings = FAMILIES[family]
    folder = save_tokenizer(kind, root / family)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = {k: tok.convert_tokens_to_ids(getattr(tok, k)) for k in ("bos_token", "eos_token") if getattr(tok, k)}
    config = getattr(transformers, f"{prefix}Config")(
        vocab_size=len(tok), **SIZES | settings, **{f"{k.split('_')[0]}_token_id": i for k, i in ids.items()}
    )
    torch.manual_seed(0)
    model = getattr(transformers, f"{prefix}ForCausalLM")(config).eval()
    with torch.no_grad():  # transformers zeroes biases and norm gains at init: random ones make them count
        for name, p in model.named_parameters():
            if name.endswith(".bias") or "norm" in name:
                p.normal_(1.0 if "norm" in name else 0.0, 0.1)
    model.to(torch.bfloat16).save_pretrained(folder, max_shard_size="100KB")
    assert len(list(folder.glob("model-*-of-*.safetensors"))) > 1 and (folder / "model.safetensors.index.json").exists()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return folder, theirs


@pytest.fixture(scope="module", params=list(FAMILIES))
def imported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp(request.param)
    folder, theirs = open_model_folder(root, request.param)
    run_dir = root / "runs" / "imported"
    import_hf(ImportConfig(source=str(folder)), run_dir)
    tokenizer = load_tokenizer(RunLayout(run_dir).tokenizer_json)
    return {"folder": folder, "theirs": theirs, "run": run_dir, "tokenizer": tokenizer, "family": request.param}


def test_logits_match_transformers_on_the_models_own_ids(imported: dict) -> None:
    tokenizer, theirs = imported["tokenizer"], imported["theirs"]
    assert isinstance(tokenizer, HfTokenizer)
    auto = transformers.AutoTokenizer.from_pretrained(imported["folder"], split_special_tokens=True)
    ids = tokenizer.document(TEXT * 2)[:-1]
    assert ids == auto(TEXT * 2)["input_ids"]  # the template's bos included, as the model was trained
    ours = load_trained_model(RunLayout(imported["run"]).checkpoint)
    with torch.no_grad():
        ours_BTV, theirs_BTV = ours(torch.tensor([ids])), theirs(torch.tensor([ids])).logits
    # The same math in the same order (RoPE tables included): 0.0 measured for every family here.
    assert ours_BTV.std() > 0.5 and (ours_BTV - theirs_BTV).abs().max().item() < 1e-6


def test_greedy_generation_matches_transformers_for_32_tokens(imported: dict) -> None:
    tokenizer, theirs = imported["tokenizer"], imported["theirs"]
    ours = load_trained_model(RunLayout(imported["run"]).checkpoint)
    [done] = complete(ours, tokenizer, ["def parse("], GenerateConfig(max_new_tokens=32, temperature=0))
    prompt = ([tokenizer.bos_id] if tokenizer.bos_id is not None else []) + tokenizer.encode("def parse(")
    banned = [[i] for i in tokenizer.specials.values() if i != tokenizer.eot_id]  # kiln never samples a special
    out = theirs.generate(
        torch.tensor([prompt]),
        max_new_tokens=32,
        do_sample=False,
        bad_words_ids=banned or None,
        eos_token_id=tokenizer.eot_id,
        pad_token_id=tokenizer.pad_id,
    )[0, len(prompt) :].tolist()
    assert len(done.ids) > 0 and list(done.ids) == [i for i in out if i != tokenizer.pad_id][: len(done.ids)]
    assert len(done.ids) == 32 or out[len(done.ids)] == tokenizer.eot_id


def test_eval_loss_equals_transformers_on_the_same_windows(imported: dict, tmp_path: Path) -> None:
    tokenizer, theirs = imported["tokenizer"], imported["theirs"]
    data = tmp_path / "held_out.jsonl"
    texts = [TEXT * 3, "The lazy dog sleeps.\n" * 20]
    data.write_text("".join(json.dumps({"text": t, "source": "mine"}) + "\n" for t in texts))
    cfg = EvalConfig(data=[str(data)], seq_len=64)
    scored = evaluate(cfg, imported["run"], read_file=read_for_eval, force=True)["counts"]["data"]["held_out.jsonl"]
    # The same windows through transformers: each document between the model's own boundaries.
    ids = torch.tensor([t for text in texts for t in tokenizer.document(text)])
    n = (len(ids) - 1) // 64
    windows = ids[: n * 64 + 1].unfold(0, 65, 64)
    with torch.no_grad():
        logits = theirs(windows[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()).item()
    assert scored["sources"]["mine"]["tokens"] == n * 64
    assert scored["sources"]["mine"]["loss"] == pytest.approx(loss, abs=1e-5)  # kiln rounds to 5 decimals


def test_the_export_loads_in_transformers_with_the_same_logits_files_and_keys(imported: dict) -> None:
    folder, theirs, run_dir = imported["folder"], imported["theirs"], imported["run"]
    export(ExportConfig(dtype="float32"), GenerateConfig(), run_dir, force=True)
    out = run_dir / "export" / "hf"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (folder / name).read_bytes()
    original, written = (json.loads((f / "config.json").read_text()) for f in (folder, out))
    for key in (
        "architectures",
        "model_type",
        "rope_parameters",
        "bos_token_id",
        "eos_token_id",
        "tie_word_embeddings",
    ):
        assert written.get(key) == original.get(key), key
    back = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.tensor([imported["tokenizer"].document(TEXT)])
    with torch.no_grad():
        assert (back(ids).logits - theirs(ids).logits).abs().max().item() < 1e-6  # the same weights, the same code
    auto = transformers.AutoTokenizer.from_pretrained(out, split_special_tokens=True)
    assert auto(TEXT, add_special_tokens=False)["input_ids"] == imported["tokenizer"].encode(TEXT)


def test_a_model_trained_anew_with_an_imported_tokenizer_exports_its_own_config(imported: dict) -> None:
    """The imported config.json is kept only for the model it describes: another shape with the same
    tokenizer (tokenizer.from_run, trained from scratch) gets kiln's config with the tokenizer's ids."""
    from kiln.evaluate.export import model_config
    from kiln.model.weights import checkpoint_config

    tokenizer = imported["tokenizer"]
    own = checkpoint_config(RunLayout(imported["run"]).checkpoint)
    kept = model_config(own, tokenizer, "float32")
    assert kept["architectures"] == json.loads((imported["folder"] / "config.json").read_text())["architectures"]
    other = own.model_copy(update={"d_model": 32, "n_heads": 2, "n_kv_heads": 1, "head_dim": None})
    written = model_config(other, tokenizer, "float32")
    assert written["hidden_size"] == 32 and written["num_attention_heads"] == 2
    assert written["eos_token_id"] == tokenizer.eot_id
