"""kiln.evaluate.export: a kiln model loaded by transformers computes the same logits, generates the
same tokens, and its tokenizer gives the same ids; options no Llama-family model has are refused."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.core.errors import FatalError
from kiln.core.layout import RunLayout
from kiln.core.manifest import Stage
from kiln.evaluate.config import ExportConfig, GenerateConfig
from kiln.evaluate.export import run as export
from kiln.model.config import ModelConfig
from kiln.model.init import build_model
from kiln.model.weights import save_weights
from kiln.text.specials import EOT, special_tokens
from kiln.text.tokenizer import KilnTokenizer, train_bpe

transformers = pytest.importorskip("transformers")

TEXT = (
    "def parse(value):\n    return value.strip().split(',')\n\n"
    "The quick brown fox jumps over the lazy dog. Zoë's café serves crème brûlée; 東京 is 東京.\n"
    "for i in range(10):\n\tprint(i ** 2, end=' ')  # squares\n"
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> KilnTokenizer:
    tok = train_bpe([TEXT] * 30, vocab_size=400, min_frequency=2, specials=special_tokens(2, 1))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(path)
    return KilnTokenizer.load(path)


def make_run(root: Path, tokenizer: KilnTokenizer, **model: object) -> tuple[Path, torch.nn.Module]:
    """A run directory holding a tokenizer and a random model's checkpoint (no other stage)."""
    run_dir = root / "run"
    layout = RunLayout(run_dir)
    layout.tokenizer_json.parent.mkdir(parents=True)
    tokenizer.save(layout.tokenizer_json)
    # type: ignore[arg-type]
    cfg = ModelConfig(vocab_size=tokenizer.vocab_size, d_model=64, n_layers=2, n_heads=4, max_seq_len=96, **model)
    # init_std 0.2: larger weights than a fresh model's make the logits differ from position to
    # position, so the comparison is not of near-uniform distributions.
    net = build_model(cfg.model_copy(update={"init_std": 0.2}), 0, "cpu").eval()
    with torch.no_grad():  # attention biases start at zero: random ones make them count in the comparison
        for name, p in net.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.5)
    layout.checkpoint.parent.mkdir(parents=True)
    save_weights(layout.checkpoint, net)
    return run_dir, net


def load_hf(folder: Path) -> tuple[torch.nn.Module, object]:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32).eval()
    return model, transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)


@pytest.mark.parametrize(
    ("options", "architecture"),
    [
        ({"n_kv_heads": 2, "tie_embeddings": True}, "LlamaForCausalLM"),
        ({"n_kv_heads": 1, "rope_theta": 500000.0, "ffn_hidden": 96}, "LlamaForCausalLM"),
        ({"qk_norm": True, "n_kv_heads": 2, "z_loss": 1e-4}, "Qwen3ForCausalLM"),
        ({"attention_bias": True, "n_kv_heads": 2, "head_dim": 24}, "Qwen2ForCausalLM"),
        ({"qk_norm": True, "head_dim": 8, "n_kv_heads": 2}, "Qwen3ForCausalLM"),
        ({"rope_scaling": {"type": "linear", "factor": 3.0}}, "LlamaForCausalLM"),
        (
            {
                "rope_scaling": {
                    "type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 256,
                }
            },
            "LlamaForCausalLM",
        ),
    ],
)
def test_transformers_computes_kilns_logits_from_the_exported_folder(
    tmp_path: Path, tokenizer: KilnTokenizer, options: dict, architecture: str
) -> None:
    run_dir, ours = make_run(tmp_path, tokenizer, **options)
    manifest = export(ExportConfig(), GenerateConfig(), run_dir)
    folder = run_dir / "export" / "hf"
    assert manifest["counts"]["architecture"] == architecture
    hf, _ = load_hf(folder)
    assert type(hf).__name__ == architecture
    assert hf.config.head_dim == ours.cfg.head_width
    scaling = options.get("rope_scaling")
    assert scaling is None or hf.config.rope_parameters["factor"] == scaling["factor"]
    random_ids = torch.randint(0, tokenizer.vocab_size, (3, 96), generator=torch.Generator().manual_seed(1))
    text_ids = torch.tensor([tokenizer.encode(TEXT)[:96]])
    for ids in (random_ids, text_ids):
        with torch.no_grad():
            ours_BTV, theirs_BTV = ours(ids), hf(ids).logits.float()
        assert ours_BTV.std() > 1.0  # logits that vary: a real comparison
        assert (ours_BTV - theirs_BTV).abs().max().item() < 1e-6


def test_greedy_generation_is_the_same_token_for_token(tmp_path: Path, tokenizer: KilnTokenizer) -> None:
    run_dir, ours = make_run(tmp_path, tokenizer, n_kv_heads=2, tie_embeddings=True)
    export(ExportConfig(), GenerateConfig(), run_dir)
    hf, hf_tok = load_hf(run_dir / "export" / "hf")
    prompt = tokenizer.encode("def parse(")
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(40):  # kiln's forward over the whole prefix, argmax of the last position
            ids.append(int(ours(torch.tensor([ids]))[0, -1].argmax()))
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, eos_token_id=None)
    assert out[0].tolist() == ids
    assert hf_tok.decode(out[0]) == tokenizer.decode(ids)


def test_a_model_larger_than_max_shard_mb_is_sharded_with_an_index_transformers_loads(
    tmp_path: Path, tokenizer: KilnTokenizer
) -> None:
    run_dir, ours = make_run(tmp_path, tokenizer, n_kv_heads=2)  # about 0.6 MB in fp32
    out = tmp_path / "out"
    manifest = export(ExportConfig(max_shard_mb=0.1, out=str(out)), GenerateConfig(), run_dir)
    folder = run_dir / "export" / "hf"
    shards = sorted(p.name for p in folder.glob("model-*.safetensors"))
    assert len(shards) > 2 and shards[-1] == f"model-{len(shards):05d}-of-{len(shards):05d}.safetensors"
    assert not (folder / "model.safetensors").exists()
    assert all((folder / name).stat().st_size <= 0.1e6 + 4096 for name in shards)  # a tensor fits a shard here
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    assert index["metadata"]["total_size"] == sum(p.numel() * 4 for p in ours.parameters())
    assert {*shards, "model.safetensors.index.json"} <= set(manifest["counts"]["files"])
    hf, _ = load_hf(folder)
    ids = torch.randint(0, tokenizer.vocab_size, (2, 96), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours_BTV, theirs_BTV = ours(ids), hf(ids).logits
    assert ours_BTV.std() > 1.0 and (ours_BTV - theirs_BTV).abs().max().item() < 1e-6
    # The copy at OUT holds the shards, and a later export replaces it as one of its own.
    export(ExportConfig(max_shard_mb=0.1, out=str(out)), GenerateConfig(), run_dir, force=True)
    assert tree(out) == tree(folder) | {"kiln_export.json": (out / "kiln_export.json").read_bytes()}


def test_the_folder_describes_the_tokens_and_the_sampling(tmp_path: Path, tokenizer: KilnTokenizer) -> None:
    run_dir, _ = make_run(tmp_path, tokenizer)
    export(ExportConfig(), GenerateConfig(temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=33), run_dir)
    folder = run_dir / "export" / "hf"
    config = json.loads((folder / "config.json").read_text())
    assert (
        config["eos_token_id"] == config["bos_token_id"] == tokenizer.eot_id
        and config["pad_token_id"] == tokenizer.pad_id
    )
    assert json.loads((folder / "generation_config.json").read_text()) == {
        "bos_token_id": tokenizer.eot_id,
        "eos_token_id": tokenizer.eot_id,
        "pad_token_id": tokenizer.pad_id,
        "max_new_tokens": 33,
        "do_sample": True,
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.9,
    }
    _, hf_tok = load_hf(folder)
    assert hf_tok.eos_token == EOT and hf_tok.eos_token_id == tokenizer.eot_id
    assert hf_tok("hello").input_ids == tokenizer.encode("hello")  # nothing added around the text
    gen = transformers.GenerationConfig.from_pretrained(folder)
    assert (gen.temperature, gen.top_k, gen.max_new_tokens) == (0.7, 20, 33)
    card = (folder / "README.md").read_text()
    assert "LlamaForCausalLM" in card and "AutoModelForCausalLM" in card


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(st.characters(exclude_categories=("Cs",)), max_size=200)
    | st.sampled_from(
        [
            "<|endoftext|>",
            "a<|endoftext|>b",
            "<|pad|><|mask|><|fim_prefix|>",
            "<|sentinel_0|> x",
            "\x00\x01\r\n\t  \u200b\ufeff",
            "   leading and trailing   ",
            "emoji 👩‍👩‍👧 and combining e\u0301",
            "def f():\n\n\n    return 1\n",
            "1234567890 3.14159 1e-9",
        ]
    )
)
def test_transformers_tokenizer_gives_kilns_ids_on_any_text(
    exported_tokenizer: object, tokenizer: KilnTokenizer, text: str
) -> None:
    ids = tokenizer.encode(text)
    assert exported_tokenizer(text).input_ids == ids  # type: ignore[operator]
    assert exported_tokenizer.decode(ids) == tokenizer.decode(ids)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def exported_tokenizer(tmp_path_factory: pytest.TempPathFactory, tokenizer: KilnTokenizer) -> object:
    run_dir, _ = make_run(tmp_path_factory.mktemp("tokrun"), tokenizer)
    export(ExportConfig(), GenerateConfig(), run_dir)
    return load_hf(run_dir / "export" / "hf")[1]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"activation": "relu2"}, "model.activation=relu2"),
        ({"activation": "gelu"}, "model.activation=gelu"),
        ({"logit_softcap": 30.0}, "model.logit_softcap=30.0"),
        ({"qk_norm": True, "attention_bias": True}, "model.qk_norm with model.attention_bias"),
    ],
)
def test_options_without_a_transformers_counterpart_are_refused_by_name(
    tmp_path: Path, tokenizer: KilnTokenizer, options: dict, named: str
) -> None:
    run_dir, _ = make_run(tmp_path, tokenizer, **options)
    with pytest.raises(FatalError, match=named):
        export(ExportConfig(), GenerateConfig(), run_dir)
    assert not (run_dir / "export").exists()


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_copy_goes_to_out_with_its_marker_and_replaces_only_an_earlier_export(
    tmp_path: Path, tokenizer: KilnTokenizer
) -> None:
    run_dir, _ = make_run(tmp_path, tokenizer)
    out = tmp_path / "hub" / "model"
    manifest = export(ExportConfig(out=str(out)), GenerateConfig(), run_dir)
    hf = run_dir / "export" / "hf"
    assert sorted(p.name for p in out.iterdir()) == sorted([p.name for p in hf.iterdir()] + ["kiln_export.json"])
    marker = json.loads((out / "kiln_export.json").read_text())
    assert marker == {"format": "kiln-export v1", "run": str(run_dir.resolve()), "fingerprint": manifest["fingerprint"]}
    (out / "model.safetensors").write_bytes(b"stale")
    export(ExportConfig(out=str(out)), GenerateConfig(), run_dir, force=True)  # an earlier export: replaced
    assert (out / "model.safetensors").read_bytes() == (hf / "model.safetensors").read_bytes()


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize(
    ("make", "named"),
    [
        (
            {"config.json": "{}", "important.txt": "notes", "data/raw.bin": "x"},
            "config.json, data, important.txt",
        ),  # looks like a model folder
        (
            {"config.json": "{}", "model.safetensors": "mine"},
            "config.json, model.safetensors",
        ),  # an export from elsewhere, unmarked
        (
            {"kiln_export.json": '{"format": "kiln-export v1"}', "config.json": "{}", "notes.txt": "keep"},
            "notes.txt",
        ),  # a kiln export plus the user's notes
        (
            {"kiln_export.json": '{"format": "kiln-export v1"}', "tokenizer.json/inside.txt": "x"},
            "tokenizer.json",
        ),  # an export's name, not its file
    ],
)
def test_a_folder_kiln_did_not_write_is_never_replaced_even_with_force(
    tmp_path: Path, tokenizer: KilnTokenizer, make: dict[str, str], named: str, force: bool
) -> None:
    run_dir, _ = make_run(tmp_path, tokenizer)
    mine = tmp_path / "mine"
    for rel, text in make.items():
        (mine / rel).parent.mkdir(parents=True, exist_ok=True)
        (mine / rel).write_text(text)
    before = tree(mine)
    with pytest.raises(
        FatalError,
        match=(
            rf"export.out {mine}: {mine} holds {named}, which kiln did not write.*Choose another folder, or remove it "
            r"yourself"
        ),
    ):
        export(ExportConfig(out=str(mine)), GenerateConfig(), run_dir, force)
    assert tree(mine) == before
    assert not (run_dir / "export").exists()  # stopped before any work


def test_the_staging_folders_beside_out_are_not_removed_when_kiln_did_not_write_them(
    tmp_path: Path, tokenizer: KilnTokenizer
) -> None:
    run_dir, _ = make_run(tmp_path, tokenizer)
    out, beside = tmp_path / "model", tmp_path / "model.old"
    beside.mkdir()
    (beside / "thesis.tex").write_text("years of work")
    with pytest.raises(FatalError, match=r"model.old holds thesis.tex, which kiln did not write"):
        export(ExportConfig(out=str(out)), GenerateConfig(), run_dir)
    assert (beside / "thesis.tex").read_text() == "years of work"


@pytest.mark.parametrize(
    ("where", "message"),
    [
        (lambda run: run / "train" / "checkpoint", "inside the run directory"),  # the trained model itself
        (lambda run: run / "export" / "hf", "inside the run directory"),
        (lambda run: run / "export", "inside the run directory"),
        (lambda run: run, "the run directory itself"),
        (lambda run: run.parent, "a folder that holds the run directory"),
        (
            lambda run: run.parent.parent / "other" / "train" / "checkpoint",
            r"inside .*other-root/run/train, a stage folder of another kiln run",
        ),
        (lambda run: run.parent.parent / "link-to-train", "inside the run directory"),  # a symlink to the run's train/
    ],
)
def test_out_inside_the_run_or_any_stage_folder_is_refused_before_any_work(
    tmp_path: Path, tokenizer: KilnTokenizer, where: Callable[[Path], Path], message: str
) -> None:
    run_dir, _ = make_run(tmp_path / "runs", tokenizer)
    other = Stage(tmp_path / "other-root" / "run", "train", {}, inputs=[])  # another run's train stage
    other.begin()
    (other.dir / "checkpoint").mkdir()
    (other.dir / "checkpoint" / "config.json").write_text("{}")
    other.finish([other.dir / "checkpoint" / "config.json"], {}, "trained")
    (tmp_path / "other").symlink_to(other.run_dir)
    (tmp_path / "link-to-train").symlink_to(run_dir / "train", target_is_directory=True)
    before = tree(run_dir)
    with pytest.raises(FatalError, match=message):
        export(ExportConfig(out=str(where(run_dir))), GenerateConfig(), run_dir)
    assert tree(run_dir) == before and not (run_dir / "export").exists()


def test_an_up_to_date_export_copies_to_a_new_out_and_says_so(
    tmp_path: Path, tokenizer: KilnTokenizer, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    from kiln.cli import main

    run_dir, _ = make_run(tmp_path / "runs", tokenizer)
    first, second = tmp_path / "first", tmp_path / "second"
    args = ["export", "--set", f"runs_dir={run_dir.parent}", "--set", "name=run"]
    assert main([*args, str(first)]) == 0
    capsys.readouterr()
    caplog.set_level(logging.INFO, logger="kiln")
    assert main([*args, str(second)]) == 0
    printed = capsys.readouterr().out
    assert "export: up to date" in caplog.text and f"copied {run_dir / 'export' / 'hf'} to {second}" in caplog.text
    assert str(first) not in printed and str(first) not in (run_dir / "export" / "summary.txt").read_text()
    assert tree(second) == tree(first)
