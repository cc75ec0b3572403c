"""`kiln import-hf DIR --run NAME`: a Llama, Mistral, Qwen2 or Qwen3 Hugging Face folder as a kiln run.

The folder's config.json becomes a ModelConfig (kiln.model.hf; settings kiln cannot reproduce,
such as YaRN RoPE scaling, biases on the output projection or sliding windows, stop the import with each named), its
safetensors weights (one file, or shards listed in model.safetensors.index.json) are renamed to
kiln's parameters and checked strictly, and its tokenizer comes along: kiln's own when the folder
is a kiln export (kiln.text.tokenizer.adopt), otherwise the folder's tokenizer files as they are,
with its config.json and generation_config.json kept for the export (kiln.text.hf_tokenizer, any
kind `tokenizers` reads; `folder_tokenizer`). The weights stream: every file's header is checked first (each
tensor's name, dtype and shape against the model the config implies, built on the meta device;
a truncated file stops here too), then the tensors are copied one at a time into the checkpoint
(read_tensor: the file opened for each), so memory holds one tensor, never the model or a shard.
Each tensor is checked as it is copied: one holding NaN or an infinity stops the import naming
it (a model computing NaN logits cannot be evaluated or trained from).
The checkpoint keeps the folder's dtype (bf16 stays bf16, at half an fp32 copy's size): every
loader (kiln.model.weights' load_trained_model for generate and eval, load_weights_into
for train.init_from) copies it into the fp32 model it builds, which gives exactly the fp32 values.
A config that ties the output projection to the embedding while the weights hold an lm_head.weight
of other values is imported untied, with a warning: transformers 5 loads it so (it ties only equal
values; transformers 4 tied them, dropping the stored lm_head), and the export then says untied.
The run gets two stages with manifests, as if it had trained:
`tokenizer/` (tokenizer.json + kiln_tokenizer.json) and `train/checkpoint/` (model.safetensors +
config.json). From there `kiln generate`, `kiln export`, `kiln eval --data FILE`, and continued
pretraining (`train.init_from: runs/NAME/train/checkpoint`, `tokenizer.from_run: runs/NAME`,
the model section printed at the end) work as on a run kiln trained.

Before anything is read into memory every file is checked: config.json is one JSON object whose
sizes are positive integers, every file is a regular file of the folder (a symlink may point only
into it, or in a Hugging Face hub cache snapshot into the repository's blobs/; never at a device
or a system file), the index's weight_map names only the folder's own files, the files' headers
hold at least the config's parameters at 2 bytes each (a config of a billion layers stops at
once), and the largest tensor fits twice in the memory this machine has available (its mapped
pages, its copy).
A run whose tokenizer/ or train/ was not made by an import of this same folder (a run kiln
trained, another import) is not replaced: --force moves those folders aside
(`<stage>.old-<time>/`, never deleted).
Not handled here: PyTorch pickles (`pytorch_model.bin`: kiln never unpickles downloaded files),
architectures other than Llama (with Mistral and TinyLlama), Qwen2 and Qwen3.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
import yaml

from kiln.core.errors import FatalError
from kiln.core.hardware import GB, available_memory, check_memory
from kiln.core.layout import MANIFEST, TOKENIZER, TOKENIZER_JSON, TRAIN, RunLayout
from kiln.core.manifest import IN_PROGRESS, Stage
from kiln.core.mirror import copy_of
from kiln.core.storage import is_url
from kiln.evaluate.config import ImportConfig
from kiln.model.config import ModelConfig, count_params
from kiln.model.hf import architecture, from_hf_state, hf_name, model_config_from_hf
from kiln.model.safetensors_stream import SafetensorsWriter, TensorSpec, header_specs, open_safetensors, read_tensor
from kiln.model.weights import parameter_shapes, save_streamed
from kiln.text.hf_tokenizer import FOLDER_FILES, ORIGIN_FILES, HfTokenizer
from kiln.text.load import AnyTokenizer
from kiln.text.tokenizer import adopt, differences

log = logging.getLogger("kiln.import")
INDEX = "model.safetensors.index.json"
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
DAMAGED = "the file is truncated or damaged: download it again"
MIN_BYTES_PER_PARAM = 2  # bf16 and fp16, the narrowest dtypes kiln imports
BLOCK_ELEMENTS = 1 << 24  # values compared or checked at a time: 16M (64 MB in fp32), whatever the tensor's size
EMBED, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"


def present(path: Path) -> bool:
    return path.exists() or path.is_symlink()  # a dangling symlink is there, and refused by name


def folder_file(folder: Path, name: str, named_in: Path | None = None) -> Path:
    """`folder/name` when it is a regular file of the folder; FatalError naming it otherwise.

    The name must stay inside the folder (no absolute path, no `..`), and a symlink must resolve
    into the folder or, in a Hugging Face hub cache snapshot (`snapshots/<revision>/`), into that
    repository's `blobs/`. named_in: the index that names the file, for the message."""
    source = f" (named in {named_in})" if named_in else ""
    if not name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise FatalError(
            f"{named_in or folder}: {name!r} is not a file of {folder}; every weight file must be one of the "
            "folder's own files"
        )
    path = folder / name
    try:
        real = path.resolve(strict=True)
    except FileNotFoundError:
        raise FatalError(f"{path}: no such file{source}; the folder is incomplete: download it again") from None
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise FatalError(f"{path}: cannot be resolved ({e}){source}") from None
    home = folder.resolve()
    blobs = home.parent.parent / "blobs" if home.parent.name == "snapshots" else None
    if not real.is_relative_to(home) and real.parent != blobs:
        raise FatalError(
            f"{path}: a symlink to {real}, outside {folder}{source}; kiln reads only the folder's own files: copy "
            "the file into the folder"
        )
    if not real.is_file():  # follows the link: false for a folder, a device, a pipe
        raise FatalError(f"{path}: not a regular file{source}; give the folder's real files")
    return path


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise FatalError(f"{path}: not valid JSON ({e}); the file is damaged, or not a Hugging Face file") from None


def weight_files(folder: Path) -> list[Path]:
    """The folder's safetensors files: model.safetensors, or the shards its index lists (each checked)."""
    if present(folder / INDEX):
        index_path = folder_file(folder, INDEX)
        index = read_json(index_path)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if (
            not isinstance(weight_map, dict)
            or not weight_map
            or not all(isinstance(v, str) for v in weight_map.values())
        ):
            raise FatalError(
                f"{index_path}: no weight_map (an object of tensor names to shard file names); the index is "
                "damaged: download it again"
            )
        return [folder_file(folder, name, index_path) for name in sorted(set(weight_map.values()))]
    if present(folder / WEIGHTS):
        return [folder_file(folder, WEIGHTS)]
    pickles = sorted(p.name for p in folder.glob("*.bin"))
    raise FatalError(
        f"{folder}: no {WEIGHTS} or {INDEX}"
        + (
            f" (found {', '.join(pickles)}: kiln does not unpickle weights; save them with safe_serialization=True)"
            if pickles
            else ""
        )
    )


def folder_tokenizer(folder: Path) -> AnyTokenizer:
    """kiln's own tokenizer when the folder is a kiln export (the same ids and encoder as before);
    otherwise the folder's tokenizer files as they are, with config.json and generation_config.json
    kept beside them for the export."""
    path = folder_file(folder, TOKENIZER_JSON)
    if not differences(read_json(path)):
        return adopt(path)
    files = {name: folder_file(folder, name).read_bytes() for name in FOLDER_FILES if present(folder / name)}
    origin = {name: folder_file(folder, name).read_bytes() for name in ORIGIN_FILES if present(folder / name)}
    return HfTokenizer(files, str(folder), origin=origin)


def check_folder(folder: Path) -> tuple[ModelConfig, AnyTokenizer, list[Path]]:
    """The model config, the tokenizer and the weight files of a Hugging Face folder, each checked,
    with no tensor read yet (plan_import reads the files' headers)."""
    if not folder.is_dir():
        raise FatalError(f"{folder}: no such folder; give a Hugging Face model folder")
    if not present(folder / CONFIG):
        raise FatalError(f"{folder}: no {CONFIG}; give a Hugging Face model folder")
    config_path = folder_file(folder, CONFIG)
    cfg = model_config_from_hf(read_json(config_path), str(config_path))
    files = weight_files(folder)
    if not present(folder / TOKENIZER_JSON):
        raise FatalError(f"{folder}: no {TOKENIZER_JSON} (kiln needs the model's tokenizer to encode text for it)")
    tokenizer = folder_tokenizer(folder)
    if tokenizer.vocab_size > (cfg.vocab_size or 0):
        raise FatalError(
            f"{folder}: the tokenizer has {tokenizer.vocab_size} tokens, the model's embedding only "
            f"{cfg.vocab_size} rows"
        )
    return cfg, tokenizer, files


def same_values(a: tuple[Path, TensorSpec], b: tuple[Path, TensorSpec]) -> bool:
    """Whether two stored tensors hold the same values (torch.equal, as transformers decides whether
    to tie), read a block of rows at a time, each file opened per block (read_tensor says why)."""
    (path_a, spec_a), (path_b, spec_b) = a, b
    if spec_a.shape != spec_b.shape:
        return False
    rows = max(1, BLOCK_ELEMENTS // max(1, spec_a.shape[-1]))
    for start in range(0, spec_a.shape[0], rows):
        with open_safetensors(path_a, DAMAGED) as fa, open_safetensors(path_b, DAMAGED) as fb:
            x, y = fa.get_slice(spec_a.name)[start : start + rows], fb.get_slice(spec_b.name)[start : start + rows]
        if not torch.equal(x.float(), y.float()):
            return False
    return True


def untie_if_stored_apart(cfg: ModelConfig, found: dict[str, tuple[Path, TensorSpec]], where: Path) -> ModelConfig:
    """cfg, untied where it ties the output projection but the weights store one of other values:
    transformers 5 keeps that lm_head (its warning: "both are present in the checkpoints with
    different values, so we will NOT tie them"), so the logits are the untied model's."""
    if not (cfg.tie_embeddings and LM_HEAD in found and EMBED in found) or same_values(found[EMBED], found[LM_HEAD]):
        return cfg
    log.warning(
        "%s: tie_word_embeddings is true, but %s holds %s with other values than %s: imported untied, as "
        "transformers loads it (set tie_word_embeddings to false in the folder to say so)",
        where,
        found[LM_HEAD][0].name,
        LM_HEAD,
        EMBED,
    )
    return cfg.model_copy(update={"tie_embeddings": False})


def plan_import(
    folder: Path, cfg: ModelConfig, files: list[Path]
) -> tuple[ModelConfig, list[tuple[Path, dict[str, TensorSpec]]]]:
    """The model config as the weights settle it (untie_if_stored_apart) and each weight file with the
    tensors to copy from it (Hugging Face name -> kiln's spec): names, dtypes and shapes checked
    against what the config implies from the files' headers, before any other tensor is read.
    FatalError naming the file (and the tensor) of the first problem."""
    found: dict[str, tuple[Path, TensorSpec]] = {}
    for path in files:
        with open_safetensors(path, DAMAGED) as f:
            for name, spec in header_specs(f, path).items():
                if name in found:
                    raise FatalError(
                        f"{path}: {name} is also in {found[name][0]}; a tensor belongs to one file: download the "
                        "folder again"
                    )
                found[name] = path, spec
    # Before the meta model is built: a config of a billion layers stops here, at once.
    held = sum(spec.nbytes for _, spec in found.values())
    if count_params(cfg) * MIN_BYTES_PER_PARAM > held:
        raise FatalError(
            f"{folder / CONFIG}: importing {count_params(cfg):,} parameters (its sizes) needs "
            f"{count_params(cfg) * MIN_BYTES_PER_PARAM / GB:,.1f} GB of weights or more, and the folder's safetensors "
            f"hold {held / GB:,.1f} GB; config.json does not describe these weights: check its sizes, or download "
            "the folder again"
        )
    where, largest = max(found.values(), key=lambda found_in: found_in[1].nbytes)
    check_memory(  # a tensor read is its mapped pages and its copy; nothing else is held
        f"{where}: importing tensor by tensor, the largest {largest.name} of {largest.nbytes / GB:,.1f} GB",
        2 * largest.nbytes,
        available_memory(),
        "this machine",
        "import on a machine with more memory",
    )
    cfg = untie_if_stored_apart(cfg, found, folder / CONFIG)
    shapes = parameter_shapes(cfg)
    # Meta tensors stand for the stored ones: from_hf_state checks the names (missing, unexpected) without data.
    from_hf_state(
        {name: torch.empty(spec.shape, dtype=spec.dtype, device="meta") for name, (_, spec) in found.items()},
        cfg,
        list(shapes),
        str(folder),
    )
    kiln_of = {hf_name(k): k for k in shapes}
    plan: dict[Path, dict[str, TensorSpec]] = {path: {} for path in files}
    for name, (path, spec) in found.items():
        if (kiln := kiln_of.get(name)) is None:  # a rotary buffer, or a tied output projection stored twice
            continue
        if spec.shape != shapes[kiln]:
            raise FatalError(
                f"{path}: {name} is {spec.shape} and {folder / CONFIG} makes it {shapes[kiln]}; the weights and the "
                "config are from different models: download the folder again"
            )
        plan[path][name] = TensorSpec(kiln, spec.dtype, spec.shape)
    return cfg, list(plan.items())


def check_finite(path: Path, name: str, tensor: torch.Tensor) -> None:
    """FatalError naming the tensor when it holds NaN or an infinity (counted a block at a time: the
    mask of a whole embedding would be another copy of it)."""
    bad = sum(int((~torch.isfinite(block)).sum()) for block in tensor.reshape(-1).split(BLOCK_ELEMENTS))
    if bad:
        raise FatalError(
            f"{path}: {name} holds {bad:,} NaN or infinite values of {tensor.numel():,}; a model with them computes "
            "NaN logits and cannot be trained from: download the folder again, or take a checkpoint from before "
            "the training diverged"
        )


def write_checkpoint(out: Path, cfg: ModelConfig, plan: list[tuple[Path, dict[str, TensorSpec]]]) -> list[Path]:
    """kiln's checkpoint at `out`, copied tensor by tensor in the stored dtype, each checked finite as it is read."""

    def fill(writer: SafetensorsWriter) -> None:
        for path, tensors in plan:
            for name, spec in tensors.items():
                tensor = read_tensor(path, name, DAMAGED)
                check_finite(path, name, tensor)
                writer.write(spec.name, tensor)

    return save_streamed(out, cfg, [spec for _, tensors in plan for spec in tensors.values()], fill)


def same_import(folder: Path, marker: str, key: str, source: str) -> bool:
    """Whether the stage folder's record (its manifest's config, or an unfinished attempt's
    settings) is an import of `source` and nothing else."""
    try:
        record = json.loads((folder / marker).read_text())[key]
        return record.keys() == {"import"} and Path(record["import"]["source"]).resolve() == Path(source).resolve()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # no record, or not kiln's
        return False


def refuse_other_work(stage: Stage, source: str, force: bool) -> None:
    """Stop before replacing a stage folder (finished or unfinished) that an import of `source` did
    not make: a run kiln trained (checkpoints, metrics, the tokenizer report), another folder's
    import. With --force they are moved aside (Stage.refuse_to_replace), never deleted."""
    records = ((stage.final_dir, MANIFEST, "config"), (stage.partial_dir, IN_PROGRESS, "settings"))
    others = [
        d for d, marker, key in records if d.is_dir() and any(d.iterdir()) and not same_import(d, marker, key, source)
    ]
    held = sorted({p.name for d in others for p in d.iterdir()})
    if held:
        stage.refuse_to_replace(
            held,
            f"{', '.join(held[:6])}{' ...' if len(held) > 6 else ''} (not written by an import of {source})",
            force,
        )


def run(cfg: ImportConfig, run_dir: Path, force: bool = False) -> dict[str, Any]:
    # A folder in a store is read from a local copy; the stages record its objects by URL and ETag.
    folder, run_dir = (copy_of(cfg.source) if is_url(cfg.source) else Path(cfg.source)), Path(run_dir)
    layout = RunLayout(run_dir)
    model_cfg, tokenizer, weights = check_folder(folder)
    arch = architecture(model_cfg)

    def named(path: Path) -> Path | str:
        return f"{cfg.source.rstrip('/')}/{path.relative_to(folder).as_posix()}" if is_url(cfg.source) else path

    files = [named(p) for p in (folder / CONFIG, folder / TOKENIZER_JSON, *weights)]
    tok_inputs = [named(folder / name) for name in (*FOLDER_FILES, *ORIGIN_FILES) if present(folder / name)]
    tok_stage = Stage(run_dir, TOKENIZER, {"import": cfg}, inputs=tok_inputs)
    tok_done = tok_stage.up_to_date(force)
    # The train stage's Stage hashes the weights and needs a finished tokenizer stage: made once, when it can be.
    stage = Stage(run_dir, TRAIN, {"import": cfg}, inputs=files, upstream=[TOKENIZER]) if tok_done else None
    if stage and (done := stage.up_to_date(force, lambda m: f"{m['counts']['params']:,} params from {folder}")):
        return done
    # Every folder this call replaces is checked before either is written (a bare Stage: its folders only).
    for replaced in ([] if tok_done else [tok_stage]) + [stage or Stage(run_dir, TRAIN, {"import": cfg}, inputs=[])]:
        refuse_other_work(replaced, cfg.source, force)
    model_cfg, plan = plan_import(folder, model_cfg, weights)  # a damaged file stops here, before the run is written
    if not tok_done:
        tok_stage.begin()
        outputs = tokenizer.save(tok_stage.dir / layout.tokenizer_json.name)
        tok_stage.finish(
            outputs,
            {
                "vocab_size": tokenizer.vocab_size,
                "imported_from": str(folder),
                "kind": tokenizer.kind,
                "encoder": tokenizer.encoder_name,
                "boundaries": {"bos": tokenizer.bos_id, "eos": tokenizer.eot_id, "pad": tokenizer.pad_id},
            },
            (
                f"vocab {tokenizer.vocab_size:,}, imported from {folder}, encoded with {tokenizer.encoder_name}\n"
                f"each document: {tokenizer.describe()}"
            ),
        )
        stage = Stage(run_dir, TRAIN, {"import": cfg}, inputs=files, upstream=[TOKENIZER])
    assert stage is not None
    stage.begin()
    outputs = write_checkpoint(stage.dir / layout.checkpoint.name, model_cfg, plan)
    section = yaml.safe_dump(
        {"model": {k: v for k, v in model_cfg.model_dump(mode="json").items() if v is not None}}, sort_keys=False
    )
    summary = (
        f"{arch} with {count_params(model_cfg):,} params imported from {folder} into {layout.checkpoint}\n"
        f"continued pretraining: train.init_from: {layout.checkpoint}, tokenizer.from_run: {run_dir}, and this "
        f"model section:\n{section}"
    )
    counts = {"params": count_params(model_cfg), "architecture": arch, "imported_from": str(folder)}
    return stage.finish(outputs, counts, summary, extra={"model": model_cfg.model_dump(mode="json")})
