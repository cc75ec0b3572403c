"""`kiln export --format hf`: the trained model as a Hugging Face folder that transformers loads offline.

The folder (`export/hf/`, copied to `export.out` when given) holds config.json (kiln.model.hf:
Llama, Qwen3 with QK-norm, Qwen2 with attention biases), model.safetensors in transformers'
names (a tied output projection stored once; a model larger than export.max_shard_mb is cut into
model-00001-of-0000N.safetensors files listed in model.safetensors.index.json, as transformers
shards), kiln's tokenizer.json unchanged with tokenizer_config.json and
special_tokens_map.json (end of document is bos and eos, no token added on encode, special-token
spellings in text stay text as kiln encodes them, no clean-up of spaces on decode),
generation_config.json from the recipe's generate section, and a model card. An imported model
continued or extended (kept_origin) gets its own files back instead: its tokenizer files byte for
byte, its config.json with every key kept but vocab_size and dtype, its generation_config.json;
a model trained anew with an imported tokenizer gets kiln's config.json with the tokenizer's ids.
The model card (README.md) is written
from the run's manifests: sources and tokens, curation steps, tokenizer, training and compute,
validation bits per byte, and each stage's fingerprint. The weights stream: the checkpoint's
header is checked against its config, then each tensor is read, converted to export.dtype and
written on its own, so memory holds one tensor (and its converted copy), never the model.

OUT is the user's place, so kiln never deletes there what it did not write: OUT (and the staging
folders `<OUT>.tmp`, `<OUT>.old` beside it) is replaced only when missing, empty, or holding an
earlier kiln export (kiln_export.json, written into every copy, and nothing but the files an export
writes); anything else stops before any work, naming what kiln did not write. OUT inside the run
directory or inside any kiln stage folder (train/checkpoint, export/ itself), or OUT holding the
run, is refused too (symlinks resolved). `--force` redoes the stage; it never widens what OUT may hold.
Not handled here: reading a Hugging Face folder back (kiln.evaluate.import_hf), GGUF or other formats.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from kiln.core import storage
from kiln.core.atomic import replace_dir
from kiln.core.config import Section
from kiln.core.errors import FatalError
from kiln.core.layout import CURATE, EVAL, EXPORT, MANIFEST, TOKENIZE, TOKENIZER, TRAIN, RunLayout
from kiln.core.manifest import FORMAT as MANIFEST_FORMAT
from kiln.core.manifest import IN_PROGRESS, Stage, read_manifest
from kiln.core.mirror import shown
from kiln.core.storage import is_url
from kiln.evaluate.config import ExportConfig, GenerateConfig
from kiln.model.config import ModelConfig, count_params
from kiln.model.hf import architecture, hf_config, hf_name, model_config_from_hf
from kiln.model.safetensors_stream import SafetensorsWriter, TensorSpec, read_tensor, shard_groups
from kiln.model.weights import CONFIG, WEIGHTS, checked_tensors, checkpoint_config
from kiln.text.hf_tokenizer import HfTokenizer
from kiln.text.load import AnyTokenizer, load_tokenizer
from kiln.text.specials import EOT, MASK, PAD

log = logging.getLogger("kiln.export")
HF_FOLDER = "hf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Every file of an exported folder, in the order they are written and listed; the weights are
# model.safetensors, or shards (SHARD) and their INDEX when the model is larger than export.max_shard_mb.
MODEL_FILES = ("config.json", "model.safetensors", "generation_config.json", "README.md")
INDEX, SHARD = "model.safetensors.index.json", re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
MB = 1e6  # bytes, as transformers counts max_shard_size
DAMAGED = "the checkpoint is damaged: train again, or restore it"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
ORIGIN_CONFIG, ORIGIN_GENERATION = "config.json", "generation_config.json"  # an imported model's, kept
# What marks a copy at OUT as kiln's: the run and the export it came from.
MARKER, MARKER_FORMAT = "kiln_export.json", "kiln-export v1"


class GenerationDefaults(Section):
    """The part of the generate section an export writes (generation_config.json)."""

    max_new_tokens: int
    temperature: float
    top_k: int | None
    top_p: float | None


def tokenizer_files(folder: Path, tokenizer: AnyTokenizer, max_len: int) -> list[Path]:
    """An imported model's tokenizer files byte for byte as they came; kiln's tokenizer.json as kiln
    wrote it, with the two files that make AutoTokenizer read it as kiln does."""
    if isinstance(tokenizer, HfTokenizer):
        for name, data in tokenizer.files.items():
            (folder / name).write_bytes(data)
        return [folder / name for name in tokenizer.files]
    assert tokenizer.path is not None, "a loaded tokenizer knows its file"
    paths = [folder / name for name in TOKENIZER_FILES]
    shutil.copyfile(tokenizer.path, paths[0])
    others = [s for s in tokenizer.specials if s not in (EOT, PAD, MASK)]
    special = {
        "bos_token": EOT,
        "eos_token": EOT,
        "pad_token": PAD,
        "mask_token": MASK,
        "additional_special_tokens": others,
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "model_max_length": max_len,
        "add_bos_token": False,
        "add_eos_token": False,
        # kiln encodes "<|endoftext|>" written in a document as text; so does this tokenizer.
        "split_special_tokens": True,
        # Byte-level decoding is exact; transformers' clean-up would drop spaces before punctuation.
        "clean_up_tokenization_spaces": False,
    }
    paths[1].write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    paths[2].write_text(json.dumps(special, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return paths


# What may differ between an imported config.json and the model it is kept for: ids, sizes kiln grows, training.
NOT_SHAPE = ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "torch_dtype")


def kept_origin(cfg: ModelConfig, tokenizer: AnyTokenizer) -> dict[str, Any] | None:
    """The imported model's own config.json when it describes `cfg` (a continued or extended import,
    not a model trained anew with the import's tokenizer) and the run kept the folder's boundaries."""
    if not isinstance(tokenizer, HfTokenizer) or ORIGIN_CONFIG not in tokenizer.origin or tokenizer.boundaries.set:
        return None
    origin = json.loads(tokenizer.origin[ORIGIN_CONFIG])
    try:
        imported = model_config_from_hf(origin, ORIGIN_CONFIG)
    except FatalError:
        return None
    shape = lambda c: {k: v for k, v in hf_config(c, 0, 0).items() if k not in NOT_SHAPE}  # noqa: E731
    return origin if shape(imported) == shape(cfg) else None


def model_config(cfg: ModelConfig, tokenizer: AnyTokenizer, dtype: str) -> dict[str, Any]:
    """config.json: an imported model's own (kept_origin), every key kept (architecture, RoPE settings,
    token ids), with only the vocabulary size (grown by extend-tokenizer) and dtype written over; kiln's,
    with the tokenizer's ids, for any other model."""
    if (origin := kept_origin(cfg, tokenizer)) is not None:
        return origin | {"vocab_size": cfg.vocab_size} | {k: dtype for k in ("torch_dtype", "dtype") if k in origin}
    bos = tokenizer.eot_id if tokenizer.bos_id is None else tokenizer.bos_id
    config = hf_config(cfg, tokenizer.eot_id, tokenizer.pad_id) | {"torch_dtype": dtype}
    return config | {"bos_token_id": bos}


def generation_config(gen: GenerateConfig, tokenizer: AnyTokenizer) -> dict[str, Any]:
    """generation_config.json: the recipe's sampling defaults and the tokenizer's ids (an imported
    model's own generation_config.json is copied as it came instead, by write_hf_folder)."""
    config: dict[str, Any] = {
        "bos_token_id": tokenizer.eot_id if tokenizer.bos_id is None else tokenizer.bos_id,
        "eos_token_id": tokenizer.eot_id,
        "pad_token_id": tokenizer.pad_id,
        "max_new_tokens": gen.max_new_tokens,
    }
    if gen.temperature == 0:
        return config | {"do_sample": False}
    return config | {
        "do_sample": True,
        "temperature": gen.temperature,
        "top_k": gen.top_k or 0,
        "top_p": gen.top_p or 1.0,
    }


def write_hf_weights(
    folder: Path, ckpt: Path, stored: dict[str, TensorSpec], dtype: torch.dtype, max_shard_bytes: float
) -> list[Path]:
    """The checkpoint's tensors (stored: checked_tensors) in transformers' names and `dtype`, one at a
    time, into model.safetensors, or into shards of at most max_shard_bytes and their index."""
    kiln_of = {hf_name(k): k for k in stored}  # a tied output projection is stored once, as the embedding
    groups = shard_groups([TensorSpec(hf, dtype, stored[k].shape) for hf, k in kiln_of.items()], int(max_shard_bytes))
    names = (
        [WEIGHTS]
        if len(groups) == 1
        else [f"model-{i:05d}-of-{len(groups):05d}.safetensors" for i in range(1, len(groups) + 1)]
    )
    for name, group in zip(names, groups, strict=True):
        with SafetensorsWriter(folder / name, group, {"format": "pt"}) as out:  # transformers reads the "pt" tag
            for spec in group:
                out.write(spec.name, read_tensor(ckpt / WEIGHTS, kiln_of[spec.name], DAMAGED).to(dtype))
    if len(groups) == 1:
        return [folder / WEIGHTS]
    index = {
        "metadata": {"total_size": sum(s.nbytes for group in groups for s in group)},
        "weight_map": {s.name: name for name, group in zip(names, groups, strict=True) for s in group},
    }
    (folder / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return [folder / name for name in names] + [folder / INDEX]


def write_hf_folder(
    folder: Path,
    ckpt: Path,
    stored: dict[str, TensorSpec],
    cfg: ModelConfig,
    tokenizer: AnyTokenizer,
    gen: GenerateConfig,
    export: ExportConfig,
    card: str,
) -> list[Path]:
    """Every file of the Hugging Face folder into `folder` (existing, empty), the weights streamed from
    the checkpoint folder `ckpt` (its tensors `stored`, checked_tensors against `cfg`); returns their paths."""
    config = model_config(cfg, tokenizer, export.dtype)
    config_path, generation_path, card_path = (folder / name for name in MODEL_FILES if name != WEIGHTS)
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    weights = write_hf_weights(folder, ckpt, stored, DTYPES[export.dtype], export.max_shard_mb * MB)
    if kept_origin(cfg, tokenizer) is not None and ORIGIN_GENERATION in tokenizer.origin:
        generation_path.write_bytes(tokenizer.origin[ORIGIN_GENERATION])
    else:
        generation_path.write_text(json.dumps(generation_config(gen, tokenizer), indent=2) + "\n", encoding="utf-8")
    card_path.write_text(card, encoding="utf-8")
    return [config_path, *weights, generation_path, card_path] + tokenizer_files(folder, tokenizer, cfg.max_seq_len)


def _manifest(layout: RunLayout, stage: str) -> dict[str, Any] | None:
    return read_manifest(layout.stage(stage)) if (layout.stage(stage) / MANIFEST).is_file() else None


def model_card(run_dir: Path, cfg: ModelConfig, tokenizer: AnyTokenizer, arch: str) -> str:
    """README.md of the exported folder, from whatever manifests the run has (a stage it lacks is left out)."""
    layout = RunLayout(run_dir)
    m = {s: _manifest(layout, s) for s in (CURATE, TOKENIZER, TOKENIZE, TRAIN, EVAL)}
    name = Path(run_dir).name
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags: [kiln, base-model]",
        "---",
        "",
        f"# {name}",
        "",
        f"A {count_params(cfg):,}-parameter base language model ({arch}: {cfg.n_layers} layers, d_model {cfg.d_model}, "
        f"{cfg.n_heads} query and {cfg.kv_heads} key/value heads, SwiGLU {cfg.hidden}, RoPE base {cfg.rope_theta:g}, "
        f"{'tied' if cfg.tie_embeddings else 'untied'} embeddings{', QK-norm' if cfg.qk_norm else ''}, context "
        f"{cfg.max_seq_len} tokens), "
        "pretrained from raw text with kiln. It is a base model: it continues text, it does not follow instructions.",
        "",
    ]
    if (tok := m[TOKENIZE]) is not None:
        lines += ["## Data", "", "| source | documents (train/val) | tokens (train/val) |", "|---|---|---|"]
        for source, s in tok["counts"]["per_source"].items():
            lines.append(
                f"| {source} | {s['train']['docs']:,} / {s['val']['docs']:,} | {s['train']['tokens']:,} / "
                f"{s['val']['tokens']:,} |"
            )
        lines.append("")
    if (cur := m[CURATE]) is not None:
        c = cur["counts"]
        lines += [
            (
                f"Curation kept {c['docs_out']:,} of {c['docs_in']:,} documents ({c['bytes_out']:,} of "
                f"{c['bytes_in']:,} bytes); steps per source, in order:"
            ),
            "",
        ]
        for source, s in c["per_source"].items():
            lines.append(f"- {source}: " + " -> ".join(s.get("funnel", {})))
        top = sorted(c["removed"].items(), key=lambda kv: -kv[1])[:8]
        lines += ["", "Most frequent removal reasons: " + ", ".join(f"{r} ({n:,})" for r, n in top) + ".", ""]
    if (tk := m[TOKENIZER]) is not None and isinstance(tokenizer, HfTokenizer):
        lines += [
            "## Tokenizer",
            "",
            f"The model's own tokenizer ({tokenizer.vocab_size:,} tokens), its files as they came; each document: "
            f"{tokenizer.describe()}.",
            "",
        ]
    elif tk is not None:
        measured = tk["counts"].get("heldout_bytes_per_token")  # an imported tokenizer has no measurement
        lines += [
            "## Tokenizer",
            "",
            f"Byte-level BPE, {tokenizer.vocab_size:,} "
            f"tokens{f', {measured:.3f} bytes per token on held-out text' if measured else ''}; "
            f"end of document `{EOT}` (id {tokenizer.eot_id}) is the bos and eos token, padding `{PAD}` (id "
            f"{tokenizer.pad_id}); no token is added on encode.",
            "",
        ]
    if (tr := m[TRAIN]) is not None and "train" not in tr["config"]:  # a run `kiln import-hf` made
        lines += [
            "## Training",
            "",
            (
                f"Imported from the Hugging Face folder {tr['counts'].get('imported_from')}; its training is not "
                "recorded here."
            ),
            "",
        ]
    elif tr is not None:
        t, counts = tr["config"]["train"], tr["counts"]
        lines += [
            "## Training",
            "",
            f"{counts['steps']:,} steps, {counts['tokens_trained']:,} tokens "
            f"({', '.join(f'{s} {n:,}' for s, n in counts.get('tokens_by_source', {}).items())}), "
            f"{counts['train_flops']:.3g} FLOPs ({counts['flops_per_token']:,} per token), on "
            f"{counts.get('processes', 1)} {counts.get('device', '')} process(es); "
            f"{t['optim']['name']} at peak lr {t['optim']['lr']:g}, {t['schedule']['kind']} schedule, "
            # global_batch_tokens is None when the micro batch alone sets it: the tokens a step took
            f"{counts['tokens_trained'] // max(counts['steps'], 1):,} tokens per step of {t['seq_len']}-token windows.",
            "",
        ]
    if (ev := m[EVAL]) is not None and "before" in ev["counts"]:  # the validation split, before and after training
        after, before = ev["counts"]["after"], ev["counts"]["before"]
        lines += [
            "## Evaluation",
            "",
            "Held-out validation split of each source (bits per byte; lower is better):",
            "",
            "| source | before training | after |",
            "|---|---|---|",
        ]
        for source, r in after["sources"].items():
            lines.append(f"| {source} | {before['sources'][source]['bpb']:.3f} | {r['bpb']:.3f} |")
        lines += [f"| all | {before['all']['bpb']:.3f} | {after['all']['bpb']:.3f} |", ""]
    lines += [
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "tok = AutoTokenizer.from_pretrained(PATH)",
        "model = AutoModelForCausalLM.from_pretrained(PATH)",
        'ids = tok("def ", return_tensors="pt").input_ids',
        "print(tok.decode(model.generate(ids, max_new_tokens=40)[0]))",
        "```",
        "",
    ]
    stages = {s: mm["fingerprint"] for s, mm in m.items() if mm is not None}
    if stages:
        lines += [
            "## Lineage",
            "",
            "Fingerprints of the kiln stages that made this model (manifest.json in each stage of the run):",
            "",
        ]
        lines += [f"- {s}: `{f}`" for s, f in stages.items()] + [""]
    return "\n".join(lines)


def run(cfg: ExportConfig, gen: GenerateConfig, run_dir: Path, force: bool = False) -> dict[str, Any]:
    """The export stage (force: redo it even when up to date), then the copy at export.out."""
    run_dir = Path(run_dir)
    layout = RunLayout(run_dir)
    out = check_out(cfg.out, run_dir)  # before any work: a copy kiln may not make stops here
    ckpt, tok_path = layout.checkpoint, layout.tokenizer_json
    upstream = [s for s in (CURATE, TOKENIZER, TOKENIZE, TRAIN, EVAL) if (layout.stage(s) / MANIFEST).is_file()]
    # Only the sampling defaults that generation_config.json carries identify the export.
    defaults = GenerationDefaults(
        max_new_tokens=gen.max_new_tokens, temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p
    )
    stage = Stage(
        run_dir,
        EXPORT,
        {"export": cfg, "generation_defaults": defaults},
        [ckpt / WEIGHTS, ckpt / CONFIG, tok_path],
        upstream=upstream,
    )
    if not (
        manifest := stage.up_to_date(force, lambda m: f"the Hugging Face folder is {layout.stage(EXPORT) / HF_FOLDER}")
    ):
        model_cfg = checkpoint_config(ckpt)
        stored = checked_tensors(ckpt, model_cfg)  # a checkpoint that is not its config's stops before any work
        arch = architecture(model_cfg)  # refuses options Llama and Qwen lack before any work
        tokenizer = load_tokenizer(tok_path)
        arch = model_config(model_cfg, tokenizer, cfg.dtype).get("architectures", [arch])[0]  # an import's own name
        stage.begin()
        folder = stage.dir / HF_FOLDER
        folder.mkdir(parents=True)
        paths = write_hf_folder(
            folder, ckpt, stored, model_cfg, tokenizer, gen, cfg, model_card(run_dir, model_cfg, tokenizer, arch)
        )
        # No OUT in the summary: it is written once, and a later call may copy somewhere else.
        which = "its own tokenizer files" if isinstance(tokenizer, HfTokenizer) else "kiln's tokenizer"
        summary = f"{arch} ({cfg.dtype}) with {which}: {layout.stage(EXPORT) / HF_FOLDER}"
        manifest = stage.finish(
            paths,
            {
                "architecture": arch,
                "dtype": cfg.dtype,
                "params": count_params(model_cfg),
                "folder": str(layout.stage(EXPORT) / HF_FOLDER),
                "files": [p.name for p in paths],
            },
            summary,
        )
    if out is not None:
        marker = {"format": MARKER_FORMAT, "run": shown(run_dir.resolve()), "fingerprint": manifest["fingerprint"]}
        (copy_to_store if isinstance(out, str) else copy_out)(layout.stage(EXPORT) / HF_FOLDER, out, marker)
    return manifest


def check_out(out: str | None, run_dir: Path) -> Path | str | None:
    """export.out resolved (symlinks followed), or FatalError when kiln may not write there: inside
    the run directory or any stage folder, holding the run, or holding what no export wrote. A store's
    prefix stays a URL, checked as a folder is: empty, or an earlier export and nothing else."""
    if out is None:
        return None
    if is_url(out):
        found = storage.objects(out.rstrip("/") + "/")
        marked = MARKER in found and json.loads(storage.read_bytes(f"{out.rstrip('/')}/{MARKER}")[0]).get("format")
        ours = {MARKER, *MODEL_FILES, INDEX, *TOKENIZER_FILES}
        if foreign := sorted(n for n in found if marked != MARKER_FORMAT or (n not in ours and not SHARD.fullmatch(n))):
            raise FatalError(
                f"export.out {out}: holds {', '.join(foreign[:6])}{' ...' if len(foreign) > 6 else ''}, which kiln did "
                "not write; kiln replaces a prefix only when it holds an earlier export and nothing else: choose "
                "another one"
            )
        return out.rstrip("/")
    target, run = Path(out).resolve(), run_dir.resolve()
    if target.is_relative_to(run) or run.is_relative_to(target):
        where = (
            "the run directory itself"
            if target == run
            else f"inside the run directory {run}"
            if target.is_relative_to(run)
            else f"a folder that holds the run directory {run}"
        )
        raise FatalError(
            f"export.out {out}: {where}; the copy goes outside the run (the run's own export is "
            f"{RunLayout(run_dir).stage(EXPORT) / HF_FOLDER}): choose another folder"
        )
    stage_dir = next((a for a in target.parents if is_stage_folder(a)), None)
    if stage_dir is not None:
        raise FatalError(
            f"export.out {out}: inside {stage_dir}, a stage folder of another kiln run; choose a folder outside "
            "every run"
        )
    for folder in (target, *staging(target)):
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            raise FatalError(
                f"export.out {out}: {folder} exists and is not a folder; choose another folder, or remove it yourself"
            )
        if foreign := not_exported(folder):
            hint = (
                ""
                if (folder / MARKER).is_file()
                else f" (no {MARKER}: not a kiln export, or one from a kiln before it marked its copies)"
            )
            raise FatalError(
                f"export.out {out}: {folder} holds {', '.join(foreign[:6])}{' ...' if len(foreign) > 6 else ''}, "
                f"which kiln did not write{hint}; "
                "kiln replaces a folder only when it holds an earlier export and nothing else. Choose another "
                "folder, or remove it yourself "
                f"(--force redoes the export; it never replaces a folder kiln did not write)"
            )
    return target


def is_stage_folder(folder: Path) -> bool:
    """Whether kiln's manifest (or an unfinished stage's marker) is in `folder`: a web app's
    manifest.json is not kiln's."""
    try:
        return (folder / IN_PROGRESS).is_file() or json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get(
            "format"
        ) == MANIFEST_FORMAT
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return False


def staging(target: Path) -> tuple[Path, Path]:
    """The folders kiln.core.atomic.replace_dir writes beside `target` and removes when it finds them."""
    return target.with_name(target.name + ".tmp"), target.with_name(target.name + ".old")


def not_exported(folder: Path) -> list[str]:
    """The names in `folder` that an export did not write: none when it is missing, empty, or an
    earlier export (its marker, and only the files an export writes, each a plain file)."""
    if not folder.is_dir():
        return []
    names = sorted(p.name for p in folder.iterdir())
    try:
        marked = json.loads((folder / MARKER).read_text(encoding="utf-8")).get("format") == MARKER_FORMAT
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):  # no marker, or not kiln's
        marked = False
    if not marked:
        return names
    ours = {MARKER, *MODEL_FILES, INDEX, *TOKENIZER_FILES}
    return [
        n
        for n in names
        if (n not in ours and not SHARD.fullmatch(n)) or (folder / n).is_symlink() or not (folder / n).is_file()
    ]


def copy_to_store(folder: Path, target: str, marker: dict[str, Any]) -> None:
    """The finished folder also under a store's prefix (checked by check_out): the marker first, then
    the files, then the earlier export's objects this one does not have."""
    before = storage.objects(target + "/")
    storage.write_bytes(f"{target}/{MARKER}", (json.dumps(marker, indent=2) + "\n").encode())
    files = sorted(p for p in folder.iterdir() if p.is_file())
    for path in files:
        storage.put_file(str(path), f"{target}/{path.name}")
    storage.remove([f"{target}/{n}" for n in sorted(before) if n != MARKER and n not in {p.name for p in files}])
    log.info("export: copied %s to %s", folder, target)


def copy_out(folder: Path, target: Path, marker: dict[str, Any]) -> None:
    """The finished folder also at `target` (checked by check_out), with its marker, swapped in whole."""

    def write(tmp: Path) -> None:
        # The marker first: a copy interrupted half-way is still recognisably kiln's, and is replaced.
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        shutil.copytree(folder, tmp, dirs_exist_ok=True)

    replace_dir(target, write)
    log.info("export: copied %s to %s", folder, target)
