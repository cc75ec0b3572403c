"""kiln.evaluate.import_hf: a Llama folder saved by transformers becomes a kiln run with the same
logits; an exported kiln run comes back bit for bit; folders kiln cannot reproduce are refused by name."""

from __future__ import annotations

import copy
import json
import logging
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from kiln.core.errors import FatalError
from kiln.core.layout import RunLayout
from kiln.core.manifest import Stage, sha256_file
from kiln.evaluate.config import ExportConfig, GenerateConfig, ImportConfig
from kiln.evaluate.export import run as export
from kiln.evaluate.generate import run as generate
from kiln.evaluate.import_hf import run as import_hf
from kiln.model.config import ModelConfig
from kiln.model.init import build_model
from kiln.model.weights import checkpoint_config, load_trained_model, load_weights_into, save_weights
from kiln.text.hf_tokenizer import HfTokenizer
from kiln.text.load import load_tokenizer
from kiln.text.specials import special_tokens
from kiln.text.tokenizer import KilnTokenizer, train_bpe
from kiln.tokenize.config import TokenizerConfig
from kiln.train.config import TrainConfig

transformers = pytest.importorskip("transformers")

TEXT = "def parse(value):\n    return value.strip().split(',')\n\nThe quick brown fox jumps over the lazy dog.\n"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> KilnTokenizer:
    tok = train_bpe([TEXT] * 30, vocab_size=360, min_frequency=2, specials=special_tokens(1, 0))
    tok.save(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    return tok


def llama_folder(
    root: Path,
    tokenizer: KilnTokenizer,
    family: str = "Llama",
    max_shard_size: str = "5GB",
    dtype: torch.dtype = torch.float32,
    **config: object,
) -> tuple[Path, torch.nn.Module]:
    """A random <family>ForCausalLM (Llama by default) saved by transformers in `dtype` and shards of
    max_shard_size, with kiln's tokenizer.json beside it; the model returned is fp32, holding the saved values."""
    settings = {
        "vocab_size": tokenizer.vocab_size,
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5,
        "initializer_range": 0.2,
        "tie_word_embeddings": False,
    }
    torch.manual_seed(0)
    model_class, config_class = getattr(transformers, f"{family}ForCausalLM"), getattr(transformers, f"{family}Config")
    model = model_class(config_class(**settings | config)).eval()
    with torch.no_grad():  # transformers zeroes biases at init: random ones make them count in the comparison
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.5)
        for p in model.parameters():  # the values `dtype` holds; the RoPE buffers stay fp32
            p.copy_(p.to(dtype))
    folder = root / "hf-llama"
    copy.deepcopy(model).to(dtype).save_pretrained(folder, max_shard_size=max_shard_size)
    assert tokenizer.path is not None
    shutil.copyfile(tokenizer.path, folder / "tokenizer.json")
    return folder, model


@pytest.mark.parametrize(
    ("config", "saved"),
    [
        ({}, {}),
        ({"tie_word_embeddings": True, "rope_theta": 50000.0}, {}),
        ({}, {"max_shard_size": "200KB", "dtype": torch.bfloat16}),  # shards and an index
    ],
)
def test_a_transformers_llama_imports_with_the_same_logits(
    tmp_path: Path, tokenizer: KilnTokenizer, config: dict, saved: dict
) -> None:
    folder, theirs = llama_folder(tmp_path, tokenizer, **saved, **config)
    assert (len(list(folder.glob("model-*-of-*.safetensors"))) > 1) == bool(saved)
    run_dir = tmp_path / "runs" / "imported"
    manifest = import_hf(ImportConfig(source=str(folder)), run_dir)
    assert manifest["counts"]["architecture"] == "LlamaForCausalLM"
    # One file in kiln's names, tensor by tensor in the folder's dtype (bf16 stays bf16).
    with safe_open(RunLayout(run_dir).checkpoint / "model.safetensors", "pt") as f:
        assert {f.get_slice(n).get_dtype() for n in f.keys()} == {"BF16" if saved else "F32"}
        assert "embed.weight" in f.keys() and ("lm_head.weight" in f.keys()) != config.get("tie_word_embeddings", False)
    ours = load_trained_model(RunLayout(run_dir).checkpoint)
    assert ours.cfg.tie_embeddings == config.get("tie_word_embeddings", False) and ours.cfg.rope_theta == config.get(
        "rope_theta", 10000.0
    )
    ids = torch.cat(
        [
            torch.randint(0, tokenizer.vocab_size, (2, 100), generator=torch.Generator().manual_seed(2)),
            torch.tensor([tokenizer.encode(TEXT * 8)[:100]]),
        ]
    )
    with torch.no_grad():
        ours_BTV, theirs_BTV = ours(ids), theirs(ids).logits
    assert ours_BTV.std() > 1.0 and (ours_BTV - theirs_BTV).abs().max().item() < 1e-6
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
    from kiln.eval_files import read_for_eval
    from kiln.evaluate.config import EvalConfig
    from kiln.evaluate.run import run as evaluate

    folder, theirs = llama_folder(tmp_path, tokenizer)
    run_dir = tmp_path / "runs" / "imported"
    import_hf(ImportConfig(source=str(folder)), run_dir)
    data = tmp_path / "held_out.jsonl"
    texts = [TEXT * 3, "The lazy dog sleeps.\n" * 20]
    data.write_text("".join(json.dumps({"text": t, "source": "mine"}) + "\n" for t in texts))
    scored = evaluate(EvalConfig(data=[str(data)]), run_dir, read_file=read_for_eval)["counts"]["data"][
        "held_out.jsonl"
    ]
    # The same windows through transformers: documents with end of document after each, cut in 129-token windows.
    ids = torch.tensor([t for text in texts for t in [*tokenizer.encode(text), tokenizer.eot_id]])
    n = (len(ids) - 1) // 128
    windows = ids[: n * 128 + 1].unfold(0, 129, 128)
    with torch.no_grad():
        logits = theirs(windows[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()).item()
    assert scored["sources"]["mine"]["tokens"] == n * 128
    assert scored["sources"]["mine"]["loss"] == pytest.approx(loss, abs=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_export_then_import_gives_back_the_same_weights(tmp_path: Path, tokenizer: KilnTokenizer, dtype: str) -> None:
    source = tmp_path / "runs" / "source"
    layout = RunLayout(source)
    layout.tokenizer_json.parent.mkdir(parents=True)
    tokenizer.save(layout.tokenizer_json)
    cfg = ModelConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=1,
        qk_norm=True,
        tie_embeddings=True,
        max_seq_len=64,
    )
    model = build_model(cfg, 3, "cpu")
    layout.checkpoint.parent.mkdir(parents=True)
    save_weights(layout.checkpoint, model)
    export(ExportConfig(dtype=dtype), GenerateConfig(), source)  # type: ignore[arg-type]
    back = tmp_path / "runs" / "back"
    import_hf(ImportConfig(source=str(source / "export" / "hf")), back)
    again = load_trained_model(RunLayout(back).checkpoint)
    shape = lambda c: (
        {k: v for k, v in c.model_dump().items() if k not in ("ffn_hidden", "ffn_multiplier")} | {"hidden": c.hidden}
    )  # noqa: E731
    assert shape(again.cfg) == shape(cfg)  # the width comes back as ffn_hidden
    stored = getattr(torch, dtype)  # bf16 weights come back as the fp32 values of the stored bf16 ones
    assert all(
        torch.equal(a.to(stored).float(), b) and b.dtype == torch.float32
        for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True)
    )


LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # head_dim 16: wavelengths 6 to 19,869 positions, so with 256 some are kept (< 64), one is blended
    # (64 to 256) and the rest are divided by the factor: all three of the rule's cases.
    "original_max_position_embeddings": 256,
}


@pytest.mark.parametrize(
    ("family", "config", "options"),
    [
        ("Qwen2", {}, {"attention_bias": True}),
        ("Qwen3", {"head_dim": 24}, {"head_dim": 24, "qk_norm": True}),
        ("Llama", {"rope_parameters": {"rope_theta": 10000.0, **LLAMA3}}, {"rope_scaling": {"type": "llama3"}}),
        (
            "Llama",
            {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}},
            {"rope_scaling": {"type": "linear", "factor": 4.0}},
        ),
    ],
)
def test_qwen2_qwen3_and_scaled_rope_llama_import_and_export_with_the_same_logits(
    tmp_path: Path, tokenizer: KilnTokenizer, family: str, config: dict, options: dict
) -> None:
    folder, theirs = llama_folder(tmp_path, tokenizer, family=family, **config)
    run_dir = tmp_path / "runs" / "imported"
    manifest = import_hf(ImportConfig(source=str(folder)), run_dir)
    assert manifest["counts"]["architecture"] == f"{family}ForCausalLM"
    ours = load_trained_model(RunLayout(run_dir).checkpoint)
    for key, value in options.items():  # the settings arrive as kiln's own options
        got = getattr(ours.cfg, key)
        assert (got.model_dump() | value == got.model_dump()) if isinstance(value, dict) else got == value, key
    assert manifest["counts"]["params"] == sum(p.numel() for p in theirs.parameters())
    ids = torch.randint(0, tokenizer.vocab_size, (2, 100), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours_BTV, theirs_BTV = ours(ids), theirs(ids).logits
    # fp32 rounding: kiln takes RoPE angles in float64 and norms its own way; the default Llama differs by as much.
    assert ours_BTV.std() > 1.0 and (ours_BTV - theirs_BTV).abs().max().item() < 1e-6
    # Exported again, transformers builds the same class with the same settings and computes the same logits.
    export(ExportConfig(), GenerateConfig(), run_dir)
    exported = run_dir / "export" / "hf"
    back = transformers.AutoModelForCausalLM.from_pretrained(exported, local_files_only=True, dtype=torch.float32)
    assert type(back).__name__ == f"{family}ForCausalLM"
    assert back.config.head_dim == ours.cfg.head_width
    assert back.config.rope_parameters == theirs.config.rope_parameters
    with torch.no_grad():
        assert (back.eval()(ids).logits - theirs_BTV).abs().max().item() < 1e-6


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda c: (
                c
                | {
                    "rope_scaling": {"rope_type": "yarn", "factor": 2.0},
                    "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0},
                }
            ),
            "RoPE scaling 'yarn'",
        ),
        # transformers 5 reads rope_scaling first: beside a default rope_parameters it is still YaRN or dynamic.
        (
            lambda c: c | {"rope_scaling": {"rope_type": "yarn", "factor": 2.0}},
            r"RoPE scaling 'yarn' in rope_scaling \(kiln scales RoPE by linear or llama3 only\)",
        ),
        (lambda c: c | {"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "RoPE scaling 'dynamic' in rope_scaling"),
        (lambda c: c | {"partial_rotary_factor": 0.5}, "partial_rotary_factor below 1"),
        (lambda c: c | {"attention_bias": True}, "attention_bias true in LlamaForCausalLM"),
        (
            lambda c: c | {"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True, "sliding_window": 16},
            "use_sliding_window true",
        ),
        (lambda c: c | {"architectures": ["MistralForCausalLM"], "sliding_window": 4096}, "sliding_window 4096"),
        (lambda c: c | {"architectures": ["GPTNeoXForCausalLM"]}, "architecture 'GPTNeoXForCausalLM'"),
    ],
)
def test_settings_kiln_cannot_reproduce_are_refused_by_name(
    tmp_path: Path, tokenizer: KilnTokenizer, edit: object, message: str
) -> None:
    folder, _ = llama_folder(tmp_path, tokenizer)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(edit(config)))  # type: ignore[operator]
    if "rope_scaling" in message:  # what transformers builds from it: the scaling kiln names
        loaded = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
        assert loaded.rope_parameters["rope_type"] in message
    with pytest.raises(FatalError, match=message):
        import_hf(ImportConfig(source=str(folder)), tmp_path / "runs" / "x")
    assert not (tmp_path / "runs" / "x").exists()


def test_a_tokenizer_kiln_did_not_make_is_kept_as_the_folders_own(tmp_path: Path, tokenizer: KilnTokenizer) -> None:
    folder, _ = llama_folder(tmp_path, tokenizer)
    data = json.loads((folder / "tokenizer.json").read_text())
    data["model"]["ignore_merges"] = False  # no longer kiln's kind: kept byte for byte, read by `tokenizers`' rules
    (folder / "tokenizer.json").write_text(json.dumps(data))
    import_hf(ImportConfig(source=str(folder)), tmp_path / "runs" / "x")
    kept = load_tokenizer(RunLayout(tmp_path / "runs" / "x").tokenizer_json)
    assert isinstance(kept, HfTokenizer) and kept.files["tokenizer.json"] == (folder / "tokenizer.json").read_bytes()
    assert (folder / "config.json").read_bytes() == kept.origin["config.json"]
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    shutil.copyfile(tokenizer.path, folder / "tokenizer.json")  # type: ignore[arg-type]
    with pytest.raises(FatalError, match="kiln does not unpickle weights"):
        import_hf(ImportConfig(source=str(folder)), tmp_path / "runs" / "x")


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory: pytest.TempPathFactory, tokenizer: KilnTokenizer) -> Path:
    return llama_folder(tmp_path_factory.mktemp("saved"), tokenizer)[0]


def edit_json(name: str, change: Callable[[dict], object]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        (folder / name).write_text(json.dumps(change(json.loads((folder / name).read_text()))))

    return edit


def index_naming(shard: str) -> Callable[[Path], None]:
    """An index that maps every tensor to model.safetensors, except the output projection to `shard`."""

    def edit(folder: Path) -> None:
        with safe_open(folder / "model.safetensors", "pt") as f:
            names = list(f.keys())
        weight_map = {n: shard if n == "lm_head.weight" else "model.safetensors" for n in names}
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    return edit


def truncate(folder: Path) -> None:
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def link(name: str, target: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        (folder / name).unlink()
        (folder / name).symlink_to(target if target.startswith("/") else folder.parent / target)

    return edit


def outside_copy(folder: Path) -> None:
    shutil.copyfile(folder / "model.safetensors", folder.parent / "elsewhere.safetensors")
    link("model.safetensors", "elsewhere.safetensors")(folder)


HOSTILE = {
    "config not JSON": (lambda f: (f / "config.json").write_text('{"vocab_size": 360,'), "config.json: not valid JSON"),
    "config a list": (lambda f: (f / "config.json").write_text("[1, 2]"), "config.json: a JSON list, not an object"),
    "config a folder": (
        lambda f: ((f / "config.json").unlink(), (f / "config.json").mkdir()),
        "config.json: not a regular file",
    ),
    "config linked to /dev/zero": (link("config.json", "/dev/zero"), "config.json: a symlink to /dev/zero"),
    "no heads": (
        edit_json("config.json", lambda c: c | {"num_attention_heads": 0}),
        "config.json: num_attention_heads is 0; it must be a positive integer",
    ),
    "negative heads": (
        edit_json("config.json", lambda c: c | {"num_attention_heads": -4}),
        "num_attention_heads is -4",
    ),
    "heads a string": (
        edit_json("config.json", lambda c: c | {"num_attention_heads": "4"}),
        'num_attention_heads is "4"',
    ),
    "heads a float": (
        edit_json("config.json", lambda c: c | {"num_attention_heads": 4.5}),
        "num_attention_heads is 4.5",
    ),
    "no hidden size": (
        edit_json("config.json", lambda c: {k: v for k, v in c.items() if k != "hidden_size"}),
        "config.json: hidden_size is missing",
    ),
    "heads not dividing the width": (
        edit_json("config.json", lambda c: c | {"num_attention_heads": 5}),
        "config.json: kiln cannot reproduce this model: hidden_size 64 is not a multiple of num_attention_heads 5",
    ),
    "kv heads not dividing the heads": (
        edit_json("config.json", lambda c: c | {"num_key_value_heads": 3}),
        "config.json: kiln cannot reproduce this model: num_attention_heads 4 is not a multiple of num_key_value_heads",
    ),
    "odd head_dim": (
        edit_json("config.json", lambda c: c | {"head_dim": 3}),
        r"config.json: not a model kiln can build: head_dim \(3\) must be even for RoPE",
    ),
    "rope a list": (
        edit_json("config.json", lambda c: c | {"rope_parameters": [1], "rope_scaling": None}),
        "config.json: not a config kiln can read",
    ),
    "a billion layers": (
        edit_json("config.json", lambda c: c | {"num_hidden_layers": 10**9}),
        r"config.json: importing [\d,]+ parameters .* needs [\d,.]+ GB of weights or more, and the folder",
    ),
    "1e11 tokens": (
        edit_json("config.json", lambda c: c | {"vocab_size": 10**11}),
        r"config.json: importing 12,800,\d{3},\d{3},\d{3} parameters .* needs [\d,.]+ GB",
    ),
    "truncated weights": (truncate, "model.safetensors: cannot be read as safetensors"),
    "weights not safetensors": (
        lambda f: (f / "model.safetensors").write_text("hello"),
        "model.safetensors: cannot be read as safetensors",
    ),
    "weights linked to a system file": (
        link("model.safetensors", "/etc/passwd"),
        "model.safetensors: a symlink to /etc/passwd, outside",
    ),
    "weights linked to /dev/zero": (
        link("model.safetensors", "/dev/zero"),
        "model.safetensors: a symlink to /dev/zero, outside",
    ),
    "weights linked outside the folder": (
        outside_copy,
        "model.safetensors: a symlink to .*elsewhere.safetensors, outside",
    ),
    "weights a dangling link": (link("model.safetensors", "gone.safetensors"), "model.safetensors: no such file"),
    "index to /dev/zero": (index_naming("/dev/zero"), "model.safetensors.index.json: '/dev/zero' is not a file of"),
    "index to a parent folder": (
        index_naming("../elsewhere.safetensors"),
        "model.safetensors.index.json: '../elsewhere.safetensors' is not a file of",
    ),
    "index to a missing shard": (
        index_naming("model-00002-of-00002.safetensors"),
        r"model-00002-of-00002.safetensors: no such file \(named in .*model.safetensors.index.json\)",
    ),
    "index to a folder": (
        lambda f: ((f / "shards").mkdir(), index_naming("shards")(f)),
        r"shards: not a regular file \(named in",
    ),
    "index without weight_map": (
        lambda f: (f / "model.safetensors.index.json").write_text('{"metadata": {}}'),
        "model.safetensors.index.json: no weight_map",
    ),
    "index a list": (
        lambda f: (f / "model.safetensors.index.json").write_text("[]"),
        "model.safetensors.index.json: no weight_map",
    ),
    "index not JSON": (
        lambda f: (f / "model.safetensors.index.json").write_text("{"),
        "model.safetensors.index.json: not valid JSON",
    ),
    "tokenizer linked to /dev/zero": (link("tokenizer.json", "/dev/zero"), "tokenizer.json: a symlink to /dev/zero"),
}


def stops_the_cli_with_one_line(
    tmp_path: Path, source: Path, edit: Callable[[Path], object], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An import of `source` edited by `edit` stops with one line matching `message`, nothing written."""
    from kiln.cli import main

    folder = tmp_path / "hf"
    shutil.copytree(source, folder)
    edit(folder)
    t0 = time.perf_counter()
    code = main(["-q", "import-hf", str(folder), "--run", "x", "--set", f"runs_dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("kiln import-hf: error: ") and re.search(message, err), err
    assert time.perf_counter() - t0 < 20  # checked, not allocated: a billion layers stop at once
    assert not (tmp_path / "runs" / "x").exists()


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_folder_stops_the_cli_with_one_line_naming_the_file(
    tmp_path: Path, saved_llama: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stops_the_cli_with_one_line(tmp_path, saved_llama, *HOSTILE[case], capsys)


@pytest.fixture(scope="module")
def sharded_llama(tmp_path_factory: pytest.TempPathFactory, tokenizer: KilnTokenizer) -> Path:
    return llama_folder(tmp_path_factory.mktemp("sharded"), tokenizer, max_shard_size="200KB")[0]


def truncate_last_shard(folder: Path) -> None:
    path = sorted(folder.glob("model-*-of-*.safetensors"))[-1]
    path.write_bytes(path.read_bytes()[: path.stat().st_size - 100])  # the header whole, the data short


SHARDED = {
    "a truncated shard": (
        truncate_last_shard,
        r"hf/model-(\d{5})-of-\1\.safetensors: cannot be read as safetensors .*truncated",
    ),
    "a shape the config disagrees with": (
        edit_json("config.json", lambda c: c | {"intermediate_size": 96}),
        (
            r"hf/model-\d{5}-of-\d{5}\.safetensors: model\.layers\.\d\.mlp\.(gate|up|down)_proj\.weight is "
            r"\((160, 64|64, 160)\) and \S+hf/config\.json makes it \((96, 64|64, 96)\)"
        ),
    ),
}


@pytest.mark.parametrize("case", SHARDED)
def test_a_damaged_shard_stops_the_cli_naming_the_shard_and_the_tensor(
    tmp_path: Path, sharded_llama: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stops_the_cli_with_one_line(tmp_path, sharded_llama, *SHARDED[case], capsys)


def test_a_hugging_face_cache_snapshot_of_links_into_its_blobs_imports(tmp_path: Path, saved_llama: Path) -> None:
    repo = tmp_path / "hub" / "models--someone--tiny"
    snapshot, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, path in enumerate(sorted(saved_llama.iterdir())):  # the hub's layout: every file a link to its blob
        shutil.copyfile(path, blobs / f"blob{i}")
        (snapshot / path.name).symlink_to(Path("../../blobs") / f"blob{i}")
    manifest = import_hf(ImportConfig(source=str(snapshot)), tmp_path / "runs" / "cached")
    assert manifest["counts"]["architecture"] == "LlamaForCausalLM"


def tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def trained_run(run_dir: Path, tokenizer: KilnTokenizer) -> None:
    """A run as `kiln train` leaves it: a tokenizer stage with its report, a train stage with its
    config section, checkpoint, metrics and TensorBoard events."""
    tok = Stage(run_dir, "tokenizer", {"tokenizer": TokenizerConfig(vocab_size=tokenizer.vocab_size)}, inputs=[])
    tok.begin()
    assert tokenizer.path is not None
    outputs = KilnTokenizer.load(tokenizer.path).save(
        tok.dir / "tokenizer.json"
    )  # a copy: saving moves a tokenizer's path
    (tok.dir / "report.json").write_text('{"bytes_per_token": 3.9}\n')
    tok.finish([*outputs, tok.dir / "report.json"], {"vocab_size": tokenizer.vocab_size}, "trained tokenizer")
    model_cfg = ModelConfig(vocab_size=tokenizer.vocab_size, d_model=64, n_layers=2, n_heads=4)
    train = Stage(
        run_dir, "train", {"model": model_cfg, "train": TrainConfig(steps=300)}, inputs=[], upstream=["tokenizer"]
    )
    train.begin()
    outputs = save_weights(train.dir / "checkpoint", build_model(model_cfg, 0, "cpu"))
    (train.dir / "metrics.jsonl").write_text('{"step": 1, "loss": 5.9}\n')
    (train.dir / "tensorboard").mkdir()
    (train.dir / "tensorboard" / "events.out.tfevents.1").write_bytes(b"\0" * 64)
    train.finish(outputs, {"steps": 300}, "300 steps", logs=[train.dir / "metrics.jsonl"])


def test_importing_into_a_trained_run_stops_and_force_keeps_the_run_aside(
    tmp_path: Path, tokenizer: KilnTokenizer, saved_llama: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = tmp_path / "runs" / "demo"
    trained_run(run_dir, tokenizer)
    before = tree(run_dir)
    with pytest.raises(
        FatalError,
        match=(
            r"tokenizer: .*runs/demo/tokenizer holds kiln_tokenizer.json, manifest.json, report.json, summary.txt, "
            r"tokenizer.json \(not written by an import of .*\); pass --force"
        ),
    ):
        import_hf(ImportConfig(source=str(saved_llama)), run_dir)
    assert tree(run_dir) == before  # nothing touched
    import_hf(ImportConfig(source=str(saved_llama)), run_dir, force=True)
    aside = {p.name.split(".old-")[0]: p for p in run_dir.iterdir() if ".old-" in p.name}
    assert sorted(aside) == ["tokenizer", "train"]  # both moved aside whole, nothing deleted
    assert {f"{stage}/{rel}": h for stage, p in aside.items() for rel, h in tree(p).items()} == before
    assert json.loads((run_dir / "train" / "manifest.json").read_text())["config"] == {
        "import": {"source": str(saved_llama)}
    }
    # The same folder again: up to date, nothing redone or moved.
    caplog.set_level(logging.INFO, logger="kiln")
    now = tree(run_dir)
    import_hf(ImportConfig(source=str(saved_llama)), run_dir)
    assert tree(run_dir) == now and "train: up to date" in caplog.text
    # Another folder's import is not this one's to replace either.
    other, _ = llama_folder(tmp_path / "other", tokenizer, num_hidden_layers=1)
    with pytest.raises(FatalError, match=r"\(not written by an import of .*other/hf-llama\)"):
        import_hf(ImportConfig(source=str(other)), run_dir)
    assert tree(run_dir) == now


def test_an_interrupted_training_in_the_run_is_kept_aside_by_a_forced_reimport(
    tmp_path: Path, tokenizer: KilnTokenizer, saved_llama: Path
) -> None:
    run_dir = tmp_path / "runs" / "demo"
    import_hf(ImportConfig(source=str(saved_llama)), run_dir)
    partial = run_dir / "train.partial"  # continued pretraining in the same run, interrupted after step 10
    (partial / "states" / "step-00000010").mkdir(parents=True)
    (partial / "in_progress.json").write_text(
        json.dumps({"config_hash": "x", "settings": {"model": {}, "train": {"steps": 100}}})
    )
    (partial / "states" / "step-00000010" / "model.pt").write_bytes(b"\1" * 32)
    import_hf(ImportConfig(source=str(saved_llama)), run_dir)  # up to date: the interrupted run is not touched
    assert (partial / "states" / "step-00000010" / "model.pt").is_file()
    import_hf(
        ImportConfig(source=str(saved_llama)), run_dir, force=True
    )  # redone; the interrupted run moved aside, whole
    (aside,) = run_dir.glob("train.old-*-partial")
    assert (aside / "states" / "step-00000010" / "model.pt").read_bytes() == b"\1" * 32
    assert not partial.exists() and (run_dir / "train" / "checkpoint" / "model.safetensors").is_file()


def copied(source: Path, root: Path) -> Path:
    folder = root / "hf"
    shutil.copytree(source, folder)
    return folder


def logits_of(model: torch.nn.Module, vocab_size: int) -> torch.Tensor:
    ids = torch.randint(0, vocab_size, (2, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model(ids)
    return out if isinstance(out, torch.Tensor) else out.logits


def test_rope_scaling_beside_rope_parameters_is_read_as_transformers_reads_it(
    tmp_path: Path, tokenizer: KilnTokenizer, saved_llama: Path
) -> None:
    # rope_scaling wins, and its base is the top-level rope_theta's default, not rope_parameters' 50,000.
    folder = copied(saved_llama, tmp_path)
    edit_json(
        "config.json",
        lambda c: (
            c
            | {
                "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0},
                "rope_scaling": {"rope_type": "linear", "factor": 4.0},
            }
        ),
    )(folder)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    assert theirs.config.rope_parameters == {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}
    import_hf(ImportConfig(source=str(folder)), tmp_path / "runs" / "r")
    ours = load_trained_model(RunLayout(tmp_path / "runs" / "r").checkpoint)
    assert ours.cfg.rope_theta == 10000.0 and ours.cfg.rope_scaling.model_dump() == {"type": "linear", "factor": 4.0}
    assert (logits_of(ours, tokenizer.vocab_size) - logits_of(theirs.eval(), tokenizer.vocab_size)).abs().max() < 1e-6


def test_a_tied_config_with_its_own_lm_head_imports_as_transformers_loads_it(
    tmp_path: Path, tokenizer: KilnTokenizer, saved_llama: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from safetensors.torch import load_file, save_file

    folder = copied(saved_llama, tmp_path)  # untied: lm_head.weight stored, other values than the embedding
    edit_json("config.json", lambda c: c | {"tie_word_embeddings": True})(folder)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    assert not torch.equal(theirs.lm_head.weight, theirs.model.embed_tokens.weight)  # transformers 5 keeps it apart
    caplog.set_level(logging.WARNING, logger="kiln")
    import_hf(ImportConfig(source=str(folder)), tmp_path / "runs" / "apart")
    assert "tie_word_embeddings is true, but model.safetensors holds lm_head.weight with other values" in caplog.text
    ours = load_trained_model(RunLayout(tmp_path / "runs" / "apart").checkpoint)
    assert not ours.cfg.tie_embeddings
    assert (logits_of(ours, tokenizer.vocab_size) - logits_of(theirs.eval(), tokenizer.vocab_size)).abs().max() < 1e-6
    export(ExportConfig(), GenerateConfig(), tmp_path / "runs" / "apart")  # and says so to transformers 4 and 5
    assert (
        json.loads((tmp_path / "runs" / "apart" / "export" / "hf" / "config.json").read_text())["tie_word_embeddings"]
        is False
    )
    # The same values stored twice: tied, by both.
    state = load_file(folder / "model.safetensors")
    save_file(
        state | {"lm_head.weight": state["model.embed_tokens.weight"].clone()},
        folder / "model.safetensors",
        {"format": "pt"},
    )
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    assert theirs.lm_head.weight.data_ptr() == theirs.model.embed_tokens.weight.data_ptr()
    import_hf(ImportConfig(source=str(folder)), tmp_path / "runs" / "tied")
    assert load_trained_model(RunLayout(tmp_path / "runs" / "tied").checkpoint).cfg.tie_embeddings


def test_weights_holding_nan_or_inf_stop_the_import_naming_the_tensor(
    tmp_path: Path, saved_llama: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import load_file, save_file

    from kiln.cli import main

    folder = copied(saved_llama, tmp_path)
    state = load_file(folder / "model.safetensors")
    state["model.layers.1.mlp.up_proj.weight"][3, :2] = torch.tensor([float("nan"), float("inf")])
    save_file(state, folder / "model.safetensors", {"format": "pt"})
    code = main(["-q", "import-hf", str(folder), "--run", "x", "--set", f"runs_dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert re.search(
        r"hf/model.safetensors: model.layers.1.mlp.up_proj.weight holds 2 NaN or infinite values of 10,240; ", err
    ), err
    assert not (tmp_path / "runs" / "x" / "train").exists()  # no checkpoint: the stage never finished
