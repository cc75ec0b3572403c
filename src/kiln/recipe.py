"""The recipe: one YAML file with a section per stage, validated before any work starts.

`load_recipe` reads a file, an object in a store (`s3://bucket/runs/r/recipe.yaml`, the resolved
recipe a run keeps) or a name shipped in recipes/, applies `--set a.b=value` overrides to a copy,
and validates everything at once. Every problem is reported in one ConfigError naming the key
path, the bad value and what is allowed; a key no section declares is named with the keys allowed
there, never with its value (a credential put in the recipe by mistake stays out of logs).
The run name is one folder under runs_dir, and a runs_dir in a store is a URL whose parts are
taken as written (no `..`, `.` or empty parts, which a store keeps as literal key parts).
Not handled here: running stages (kiln.stages) or writing manifests (kiln.core.manifest).
"""

from __future__ import annotations

import copy
import json
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from kiln.core.config import Section
from kiln.core.errors import ConfigError
from kiln.core.executors.slurm import SlurmConfig
from kiln.core.mirror import mirror_of
from kiln.core.storage import READ_ONLY_SCHEMES, SCHEMES, StorageConfig, is_url, read_bytes, read_text
from kiln.curate.config import CurateConfig
from kiln.curate.quality.config import QualityConfig
from kiln.evaluate.config import EvalConfig, ExportConfig, GenerateConfig
from kiln.mix.config import MixConfig
from kiln.model.config import ModelConfig
from kiln.tokenize.config import TokenizeConfig, TokenizerConfig
from kiln.train.config import TrainConfig
from kiln.train.parallel import ParallelConfig, data_ranks

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"
# One folder name that no shell, store or OS reads as anything else: no separator, no `.`/`..`, no hidden folder.
RUN_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")


def check_run_name(name: str) -> str:
    """`name` when it names one folder directly under runs_dir; ValueError naming the rule otherwise."""
    if not RUN_NAME.fullmatch(name):
        raise ValueError(
            f"name {name!r}: not a run name; a run is one folder under runs_dir, named with letters, digits, _, - "
            "and . (not first), e.g. demo or web-2024.10"
        )
    return name


def check_store_location(key: str, location: str) -> str:
    """A location where a run is written: a local path as it is, or a store URL with a bucket and
    no `..`, `.` or empty parts (a store takes `s3://b/../x` as the key `../x`, not as `s3://x`),
    trailing slashes dropped. ValueError naming the key and the rule; a URL carrying credentials
    is refused without being repeated."""
    scheme, sep, rest = location.partition("://")
    if not sep:
        return location
    if "@" in rest.split("/", 1)[0]:
        raise ValueError(
            f"{key}: a URL with credentials in it (before '@'); give them through the environment or "
            "storage.profile, never in the recipe"
        )
    if scheme.lower() == "file":
        plain = rest if rest.startswith("/") else "the path itself"
        raise ValueError(f"{key} {location!r}: file:// URLs are not read as paths; give the plain path ({plain})")
    if scheme.lower() not in SCHEMES:
        raise ValueError(
            f"{key} {location!r}: {scheme}:// is not a store kiln reaches; give a local folder or an s3://, gs:// "
            "or az:// location"
        )
    if scheme.lower() in READ_ONLY_SCHEMES:
        raise ValueError(
            f"{key} {location!r}: {scheme}:// locations are read only; give {key} a local folder or an s3://, "
            "gs:// or az:// location"
        )
    parts = rest.rstrip("/").split("/")
    if not parts[0]:
        raise ValueError(f"{key} {location!r}: no bucket; give {scheme}://BUCKET/PATH, e.g. {scheme}://my-bucket/runs")
    bad = [p for i, p in enumerate(parts) if p in (".", "..") or (i and not p)]
    if bad:
        raise ValueError(
            f"{key} {location!r}: the path part {bad[0]!r} (stores take every part as written, so nothing is "
            f"resolved); write the location without empty, '.' or '..' parts"
        )
    return f"{scheme}://{rest.rstrip('/')}"


class Recipe(Section):
    name: str = Field(
        description=(
            "Run name; stages write under <runs_dir>/<name>/: one folder name of letters, digits, _, - and . (not "
            "first)."
        )
    )
    runs_dir: str = Field(
        default="runs",
        description=(
            "Folder holding run directories: a local path, or a store URL (s3://bucket/runs, gs://, az://) worked "
            "on through a local mirror under $KILN_CACHE (default ~/.cache/kiln)."
        ),
    )
    curate: CurateConfig = Field(default_factory=CurateConfig, description="Reading and cleaning raw text.")
    quality: QualityConfig = Field(
        default_factory=QualityConfig,
        description="Reference text and training of the model-based quality filters (`kiln quality`).",
    )
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig, description="Training the BPE tokenizer.")
    tokenize: TokenizeConfig = Field(
        default_factory=TokenizeConfig, description="Encoding curated text to token shards."
    )
    mix: MixConfig = Field(default_factory=MixConfig, description="Drawing training sequences from sources.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The decoder's shape.")
    train: TrainConfig = Field(
        default_factory=TrainConfig,
        description="Training: length, batch, seed; optim, schedule, precision and checkpoint sub-sections.",
    )
    slurm: SlurmConfig = Field(
        default_factory=SlurmConfig,
        description="The Slurm cluster of the stages whose executor.kind is slurm (partition, time, CPUs, setup).",
    )
    storage: StorageConfig = Field(
        default_factory=StorageConfig,
        description=(
            "Reaching object stores (an S3-compatible endpoint, region, profile); credentials stay in the environment."
        ),
    )
    parallel: ParallelConfig = Field(
        default_factory=ParallelConfig,
        description=(
            "How the processes torchrun starts share the model: DDP replicas, FSDP2 shards, tensor and pipeline "
            "parallelism, on one device mesh."
        ),
    )
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Validation loss, perplexity, bits per byte.")
    generate: GenerateConfig = Field(
        default_factory=GenerateConfig, description="Sampling text from the trained model."
    )
    export: ExportConfig = Field(
        default_factory=ExportConfig, description="Writing the trained model as a Hugging Face folder."
    )

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        return check_run_name(name)

    @field_validator("runs_dir")
    @classmethod
    def _runs_dir(cls, runs_dir: str) -> str:
        return check_store_location("runs_dir", runs_dir)

    @model_validator(mode="after")
    def _cross_section(self) -> Recipe:
        if self.export.out is not None:  # the other place a run writes to (`kiln export OUT`)
            check_store_location("export.out", self.export.out)
        if self.train.seq_len > self.model.max_seq_len:
            raise ValueError(
                f"train.seq_len ({self.train.seq_len}) exceeds model.max_seq_len ({self.model.max_seq_len})"
            )
        if self.eval.seq_len is not None and self.eval.seq_len > self.model.max_seq_len:
            raise ValueError(f"eval.seq_len ({self.eval.seq_len}) exceeds model.max_seq_len ({self.model.max_seq_len})")
        # With tokenizer.from_run the tokenizer section's vocab_size is unused: the train stage checks the real one.
        trains_one = self.tokenizer.from_run is None
        if trains_one and self.model.vocab_size is not None and self.model.vocab_size < self.tokenizer.vocab_size:
            raise ValueError(
                f"model.vocab_size ({self.model.vocab_size}) is below tokenizer.vocab_size "
                f"({self.tokenizer.vocab_size})"
            )
        if self.mix.weights is not None:
            known = {i.source for i in self.curate.inputs}
            unknown = sorted(set(self.mix.weights) - known)
            if unknown and None not in known:  # an input without a source names them from its data
                raise ValueError(
                    f"mix.weights names sources {unknown} that curate.inputs does not define ({sorted(known)})"
                )
        return self

    @property
    def run_dir(self) -> Path:
        """The run's folder: for runs_dir on a store, its local mirror (kiln.core.mirror)."""
        return (mirror_of(self.runs_dir) if is_url(self.runs_dir) else Path(self.runs_dir)) / self.name


def resolve_recipe_path(recipe: str) -> Path:
    """A path to a YAML file, or the name of a recipe shipped in recipes/ (e.g. `demo`)."""
    path = Path(recipe)
    if path.is_file():
        return path
    for candidate in (Path("recipes") / f"{recipe}.yaml", RECIPES_DIR / f"{recipe}.yaml"):
        if candidate.is_file():
            return candidate
    shipped = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")) if RECIPES_DIR.is_dir() else []
    raise ConfigError(
        f"recipe {recipe!r}: no such file, and no shipped recipe of that name (shipped: {', '.join(shipped) or 'none'})"
    )


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one `section.key=value` to nested dicts. The value is YAML, except for a key that takes
    text (str, a Literal of strings, either or None): there it is the text as given, so that
    `--set generate.prompt=def main(argv):` is that prompt, not a YAML mapping. Such a value written
    whole as one YAML quoted string is unquoted (`'null'` is the text null), and a YAML null (null,
    Null, NULL, ~) of a key that may be None is None."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {assignment!r}: expected section.key=value, e.g. --set train.optim.lr=3e-4")
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {key.strip()}: {part!r} is a value, not a section")
        node = child
    annotation = _annotation(parts)
    if raw.strip() and annotation is not None and _takes_text_only(annotation):
        quoted = _quoted(raw)
        if quoted is not None:
            node[parts[-1]] = quoted
        elif raw.strip() in YAML_NULLS and type(None) in typing.get_args(annotation):
            node[parts[-1]] = None
        else:
            node[parts[-1]] = raw
        return
    try:
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError as e:
        if not _declared(parts):  # validation refuses the key by name; its value (a secret?) is never quoted
            node[parts[-1]] = raw
            return
        raise ConfigError(f"--set {assignment!r}: the value is not valid YAML ({e})") from None


def literal_override(key: str, text: str) -> str:
    """`key=value` that apply_override reads back as exactly `text`, whatever it holds (quotes,
    `: `, a leading #, line breaks, characters YAML cannot hold raw): one escaped double-quoted string."""
    return key + "=" + yaml.safe_dump(text, default_style='"', width=math.inf).rstrip()


YAML_NULLS = frozenset({"null", "Null", "NULL", "~"})


def _quoted(raw: str) -> str | None:
    """The text a value written whole as one YAML quoted string means (`'it''s'` -> it's); None otherwise."""
    text = raw.strip()
    if text[:1] not in ("'", '"'):
        return None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    # subtle: `'a' # note` is a quoted string and a comment; only a string ending where the value ends counts.
    if isinstance(node, yaml.ScalarNode) and node.style == text[0] and node.end_mark.index == len(text):
        return str(node.value)
    return None


def _declared(parts: list[str]) -> bool:
    """Whether a section declares the recipe key `parts`: every part a field of the section above it, down
    to a field that is not a section (a list or a mapping such as mix.weights, whose items are its own)."""
    model: type[BaseModel] | None = Recipe
    for part in parts:
        if model is None:
            return True
        field = model.model_fields.get(part)
        if field is None:
            return False
        model = _model_in(field.annotation)
    return True


def _annotation(parts: list[str]) -> Any:
    """The declared type of the recipe key `parts` (e.g. generate.prompt); None for a key no section declares."""
    model: type[BaseModel] = Recipe
    for part in parts[:-1]:
        field = model.model_fields.get(part)
        inner = _model_in(field.annotation) if field is not None else None
        if inner is None:
            return None
        model = inner
    field = model.model_fields.get(parts[-1])
    return field.annotation if field is not None else None


def _takes_text_only(annotation: Any) -> bool:
    """Whether every value of this type but None is text: str, a Literal of strings, a union of them (and None)."""
    members = (
        typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else (annotation,)
    )
    kinds = [
        typing.get_args(m)[0] if typing.get_origin(m) is typing.Annotated else m for m in members if m is not type(None)
    ]
    return bool(kinds) and all(
        k is str or (typing.get_origin(k) is Literal and all(isinstance(v, str) for v in typing.get_args(k)))
        for k in kinds
    )


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error (plain YAML keeps the last
    silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[tuple[type, Any], int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor`: its keys may be overridden here, which is the point of it
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            marker = (type(key), key)  # 1 and true are different keys
            try:
                repeated = marker in seen
            except TypeError:
                continue  # an unhashable key: the safe constructor reports it
            if repeated:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    (
                        f"key {key!r} is given twice in one mapping (lines {seen[marker] + 1} and "
                        f"{key_node.start_mark.line + 1}); YAML would keep only the last"
                    ),
                    key_node.start_mark,
                )
            seen[marker] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def load_recipe(recipe: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """A recipe file, store URL (read from the store, reached as the environment says: the recipe's own
    storage section applies only once it is read) or shipped name, with overrides applied; None starts
    from every default."""
    if recipe is None:
        data, origin = {}, "defaults"
    else:
        origin = str(recipe) if is_url(recipe) else str(resolve_recipe_path(str(recipe)))
        try:
            # noqa: S506 (a SafeLoader)
            data = yaml.load(read_text(origin), Loader=UniqueKeyLoader) or {}
        except FileNotFoundError:  # a URL: a path was found by resolve_recipe_path
            raise ConfigError(
                f"recipe {origin}: no such object; give the URL of a recipe YAML (a run in a store keeps its "
                "resolved recipe as <runs_dir>/<name>/recipe.yaml)"
            ) from None
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"recipe {origin}: not UTF-8 text (byte {e.start}: {e.object[e.start : e.start + 1]!r}); save it as "
                "UTF-8"
            ) from None
        except yaml.YAMLError as e:
            raise ConfigError(f"recipe {origin}: not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(
                f"recipe {origin}: the top level must be a mapping of sections, got {type(data).__name__}"
            )
        data = copy.deepcopy(data)
    for assignment in overrides:
        apply_override(data, assignment)
    return validate_recipe(with_checkpoint_model(data), origin=origin)


def with_checkpoint_model(data: dict[str, Any]) -> dict[str, Any]:
    """The recipe, with the model section of train.init_from's checkpoint where it continues one and
    has no model section of its own (an imported model: its section is what `kiln import-hf` read)."""
    train = data.get("train")
    init_from = train.get("init_from") if isinstance(train, dict) else None
    text = None
    if isinstance(init_from, str) and "model" not in data:
        if is_url(init_from):  # a checkpoint in a store: its config.json alone, not its weights
            found = read_bytes(f"{init_from.rstrip('/')}/config.json")
            text = found[0].decode("utf-8", "replace") if found else None
        elif (Path(init_from) / "config.json").is_file():
            text = (Path(init_from) / "config.json").read_text(encoding="utf-8")
    if text is None:
        return data  # a missing checkpoint is named by the train stage, which reads it
    try:
        model = json.loads(text)["model"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return data  # not a kiln checkpoint config: the train stage names what is wrong with it
    return data | {"model": {k: v for k, v in model.items() if v is not None}}


def validate_recipe(data: dict[str, Any], origin: str = "recipe") -> Recipe:
    try:
        # The train section's batch arithmetic counts data ranks, which the parallel section decides.
        return Recipe.model_validate(data, context={"data_ranks": data_ranks(data.get("parallel"))})
    except ValidationError as e:
        errors = e.errors()
        # Pydantic also fails a container (e.g. "tuple should have at least 1 item") when an item
        # inside it failed; report only the innermost errors.
        inner = [
            err
            for err in errors
            if not any(len(o["loc"]) > len(err["loc"]) and o["loc"][: len(err["loc"])] == err["loc"] for o in errors)
        ]
        lines = [_describe(err) for err in inner]
        raise ConfigError(f"{origin}: {len(lines)} problem(s):\n  " + "\n  ".join(lines)) from None


def _describe(err: dict[str, Any]) -> str:
    # Pydantic appends the union branch or validator name to loc; keep only real keys.
    loc = (
        ".".join(str(p) for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))) or "(top level)"
    )
    if err["type"] == "extra_forbidden":
        # subtle: never the value: a key kiln does not know may hold anything (a secret key put under storage).
        allowed = _allowed_keys(err["loc"][:-1])
        return f"{loc}: unknown key; allowed keys here: {', '.join(allowed)}"
    if err["type"] == "value_error":
        said = err["msg"].removeprefix("Value error, ")
        # A cross-section check (no key of its own) or a message that starts with its key (`runs_dir 's3://...':
        # ...`) names the keys itself: not prefixed again.
        return said if loc == "(top level)" or said.startswith((f"{loc} ", f"{loc}:")) else f"{loc}: {said}"
    if err["loc"][:1] == ("storage",):  # how a store is reached: a value pasted there may be a credential
        return f"{loc}: {err['msg'].lower()}"
    return f"{loc}: {err['msg'].lower()}; got {err.get('input')!r}"


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = Recipe
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        inner = _model_in(field.annotation)
        if inner is None:
            return []
        model = inner
    return sorted(model.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def recipe_to_yaml(recipe: Recipe) -> str:
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
