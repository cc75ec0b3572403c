"""The `eval`, `generate` and `export` recipe sections.

`eval` is the validation scorer's settings (kiln.model.config.ScoringConfig, shared with the
trainer's monitoring evaluations) plus where and in what precision the eval stage runs the model.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kiln.core.config import Section
from kiln.model.config import PrecisionConfig, ScoringConfig


class ProbeConfig(Section):
    documents_per_source: int = Field(
        default=2,
        ge=0,
        description=(
            "Held-out documents per source in the probe set (the first of each validation split): each scored, and "
            "its first prompt_tokens continued."
        ),
    )
    prompts: list[str] = Field(
        default_factory=list, description="More prompts the probe continues (greedy) besides the documents' beginnings."
    )
    prompt_tokens: int = Field(default=24, ge=1, description="Tokens of each probe document given as a prompt.")
    max_new_tokens: int = Field(default=32, ge=1, description="Tokens each probe prompt is continued by.")


class EvalConfig(ScoringConfig):
    NOT_HASHED = ScoringConfig.NOT_HASHED | {"probe"}  # the probe set is the trainer's, not the eval stage's
    precision: PrecisionConfig = Field(
        default_factory=PrecisionConfig,
        description="Device and matmul precision of the eval stage (auto: bf16 autocast on cuda, fp32 on cpu).",
    )
    data: list[str] = Field(
        default_factory=list,
        description=(
            "Also score these text, JSONL or Parquet files (read as curate reads them, tokenized with the run's "
            "tokenizer): loss, perplexity and bits per byte per file and per `source` field."
        ),
    )
    tasks: list[str] = Field(
        default_factory=list,
        description=(
            "Multiple-choice task files (JSONL: context or query, choices, label) scored zero-shot by log-likelihood; "
            "results per task (file name without .jsonl) in the eval manifest."
        ),
    )
    probe: ProbeConfig = Field(
        default_factory=ProbeConfig,
        description=(
            "The probe set the trainer scores every train.probe_every steps (document losses and greedy continuations "
            "in metrics.jsonl, kind probe)."
        ),
    )
    task_delimiter: str = Field(
        default=" ",
        description="Text between a task's context and each choice (lm-evaluation-harness's target_delimiter).",
    )

    def scoring(self) -> ScoringConfig:
        """The scoring settings alone: what the trainer's monitoring evaluations take."""
        return ScoringConfig.model_validate(self.model_dump(include=set(ScoringConfig.model_fields)))


class GenerateConfig(Section):
    prompt: str = Field(default="def ", description="Text the sample continues.")
    max_new_tokens: int = Field(default=80, ge=1, description="Tokens to generate (stops early at end of document).")
    temperature: float = Field(default=0.8, ge=0, description="Softmax temperature; 0 means greedy.")
    top_k: int | None = Field(default=50, ge=1, description="Keep only the k most likely tokens; None disables.")
    top_p: float | None = Field(
        default=0.95,
        gt=0,
        le=1,
        description="Nucleus sampling: keep the smallest set with this much probability; None disables.",
    )
    min_p: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description=(
            "Drop tokens whose probability is below min_p times the most likely token's (after top-k and top-p); None "
            "disables."
        ),
    )
    repetition_penalty: float = Field(
        default=1.0,
        gt=0,
        description=(
            "Divide the positive logits (multiply the negative ones) of tokens already in the prompt or the "
            "completion by this; 1 disables."
        ),
    )
    stop: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list,
        description="Stop a completion at the first of these strings (not included in the output).",
    )
    seed: int = Field(default=0, description="Sampling seed (one generator draws for the whole batch).")
    prompt_file: str | None = Field(
        default=None,
        description=(
            "Complete every prompt of this file (JSONL with a `prompt` field, or text with one prompt per line) into "
            "generate/samples.jsonl; None: generate.prompt only."
        ),
    )
    batch_size: int = Field(default=8, ge=1, description="Prompts decoded together (left-padded to one length).")
    use_cache: bool = Field(
        default=True,
        description=(
            "Decode with a KV cache (one position per new token); false reruns the model on the whole context for "
            "every token."
        ),
    )
    precision: PrecisionConfig = Field(
        default_factory=PrecisionConfig,
        description="Device and matmul precision of sampling (auto: bf16 autocast on cuda, fp32 on cpu).",
    )


class ExportConfig(Section):
    NOT_HASHED = frozenset({"out"})  # where a copy goes changes no file of the export
    format: Literal["hf"] = Field(
        default="hf",
        description=(
            "hf: a Hugging Face transformers folder (config.json, model.safetensors or its shards with an index, "
            "tokenizer, generation config, model card)."
        ),
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32", description="Weight dtype of the exported safetensors (kiln trains fp32 master weights)."
    )
    max_shard_mb: float = Field(
        default=5000,
        gt=0,
        description=(
            "Largest safetensors file in MB (1e6 bytes, in export.dtype); a larger model is cut into "
            "model-0000i-of-0000N.safetensors files plus model.safetensors.index.json, as transformers shards at 5 GB."
        ),
    )
    out: str | None = Field(
        default=None,
        description="Also copy the exported folder here (`kiln export OUT`); None: only export/hf/ in the run.",
    )


class ImportConfig(Section):
    source: str = Field(
        description=(
            "A Hugging Face model folder (config.json, safetensors weights, kiln's tokenizer.json) to import as a "
            "kiln run."
        )
    )
