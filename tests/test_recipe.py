"""kiln.recipe: loading, --set overrides, and ConfigError messages that name key, value and rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.core.errors import ConfigError
from kiln.core.storage import StorageConfig
from kiln.recipe import RECIPES_DIR, apply_override, literal_override, load_recipe, validate_recipe
from kiln.train.config import TrainConfig


def write_recipe(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text, encoding="utf-8")
    return path


MINIMAL = """\
name: tiny
runs_dir: {runs}
curate:
  length: {{min_chars: 50}}
  inputs:
    - {{source: web, format: text, path: "data/*.txt"}}
    - {{source: books, format: text, path: "books/**/*.md"}}
model:
  d_model: 64
  n_heads: 4
  max_seq_len: 128
train:
  steps: 10
  schedule: {{warmup_steps: 2}}
  seq_len: 128
"""


def load_error(recipe: str | Path, overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_recipe(recipe, overrides)
    return str(info.value)


def test_load_recipe_from_yaml_file(tmp_path):
    path = write_recipe(tmp_path, MINIMAL.format(runs=tmp_path / "runs"))
    recipe = load_recipe(path)
    assert recipe.name == "tiny"
    assert recipe.run_dir == tmp_path / "runs" / "tiny"
    assert [(i.source, i.format, i.path) for i in recipe.curate.inputs] == [
        ("web", "text", "data/*.txt"),
        ("books", "text", "books/**/*.md"),
    ]
    assert recipe.curate.length.min_chars == 50
    assert recipe.curate.length.max_chars == 1_000_000  # omitted keys take their defaults
    assert recipe.curate.gopher_quality.enabled  # omitted sections too
    assert recipe.model.d_model == 64 and recipe.model.head_width == 16
    assert recipe.train.seq_len == 128
    assert recipe.eval.seq_len is None  # None: eval uses the window the checkpoint was trained with


def contains(big, small) -> bool:
    """Every key and value of `small` appears in `big` (lists item by item)."""
    if isinstance(small, dict):
        return isinstance(big, dict) and all(k in big and contains(big[k], v) for k, v in small.items())
    if isinstance(small, list):
        return isinstance(big, list) and len(big) == len(small) and all(contains(b, x) for b, x in zip(big, small))
    return big == small


def test_load_shipped_demo_by_name():
    path = RECIPES_DIR / "demo.yaml"
    raw = yaml.safe_load(path.read_text())
    recipe = load_recipe("demo")
    assert recipe.name == "demo"
    assert contains(recipe.model_dump(mode="json"), raw)  # every key in the file made it through
    assert [i.source for i in recipe.curate.inputs] == [i["source"] for i in raw["curate"]["inputs"]]
    assert recipe.train.seq_len <= recipe.model.max_seq_len


def test_overrides_are_yaml_typed_and_nested(tmp_path):
    path = write_recipe(tmp_path, MINIMAL.format(runs=tmp_path / "runs"))
    recipe = load_recipe(
        path,
        [
            "train.optim.lr=0.001",
            "train.steps=20",
            "model.tie_embeddings=true",
            "train.optim.grad_clip=null",
            "mix.weights.web=2.5",  # creates the nested mapping
            "mix.weights.books=1",
            "generate.prompt=Once upon a time",
            "eval.seq_len=64",
            " curate.length.min_chars = 75 ",  # spaces around key and value are tolerated
        ],
    )
    assert recipe.train.optim.lr == 0.001 and isinstance(recipe.train.optim.lr, float)
    assert recipe.train.steps == 20
    assert recipe.model.tie_embeddings is True
    assert recipe.train.optim.grad_clip is None
    assert recipe.train.schedule.warmup_steps == 2  # the sibling key in the file is kept
    assert recipe.mix.weights == {"web": 2.5, "books": 1.0}
    assert recipe.generate.prompt == "Once upon a time"
    assert recipe.eval.seq_len == 64
    assert recipe.curate.length.min_chars == 75


def test_override_does_not_touch_the_file(tmp_path):
    path = write_recipe(tmp_path, MINIMAL.format(runs=tmp_path / "runs"))
    before = path.read_bytes()
    assert load_recipe(path, ["train.steps=99"]).train.steps == 99
    assert path.read_bytes() == before
    assert load_recipe(path).train.steps == 10


def test_scientific_notation_override_becomes_float():
    # PyYAML reads "3e-4" as a string (YAML 1.1 wants a dot); pydantic's lax float parsing accepts it,
    # which keeps the example printed in apply_override's own error message working.
    assert load_recipe("demo", ["train.optim.lr=3e-4"]).train.optim.lr == pytest.approx(3e-4)


def test_apply_override_on_plain_dicts():
    data: dict = {"train": {"lr": 0.1}}
    apply_override(data, "train.lr=0.5")
    apply_override(data, "a.b.c=[1, two, 3.0]")
    apply_override(data, "a.b.d={x: 1}")
    apply_override(data, "train.name=")  # empty value stays the empty string
    assert data == {"train": {"lr": 0.5, "name": ""}, "a": {"b": {"c": [1, "two", 3.0], "d": {"x": 1}}}}


@pytest.mark.parametrize(
    ("value", "prompt"),
    [
        ("def main(argv):", "def main(argv):"),  # YAML: the mapping {'def main(argv)': None}
        ("[1, 2]", "[1, 2]"),  # a list
        ("12", "12"),
        ("0x10", "0x10"),
        ("true", "true"),
        ("null", "null"),  # an int (16 in YAML), a bool, a null
        ("x: [", "x: ["),
        ("- a", "- a"),  # not YAML at all; a sequence
        ("a # b", "a # b"),
        (" x ", " x "),
        ("a\n  b", "a\n  b"),  # YAML would drop the comment, the spaces, the line break
        ("'x'", "x"),
        ("'it''s'", "it's"),
        ('"tab\\there"', "tab\there"),  # one YAML quoted string: unquoted
        ("'a' # note", "'a' # note"),
        ("'a' 'b'", "'a' 'b'"),  # more than one quoted string: the text
    ],
)
def test_a_key_that_takes_text_takes_the_value_as_given(value, prompt):
    assert load_recipe("demo", [f"generate.prompt={value}"]).generate.prompt == prompt


def test_text_keys_keep_yaml_null_and_choices_and_other_keys_keep_yaml():
    # A key that may be None still reads YAML's nulls; one that may not takes them as text.
    assert load_recipe("demo", ["generate.prompt_file=null"]).generate.prompt_file is None
    assert load_recipe("demo", ["train.init_from=~"]).train.init_from is None
    assert load_recipe("demo", ["generate.prompt_file='null'"]).generate.prompt_file == "null"
    assert load_recipe("demo", ["generate.prompt_file=notes.txt # a"]).generate.prompt_file == "notes.txt # a"
    # A Literal of strings is text too, still checked against its choices (YAML 1.1 read `no` as false).
    assert "train.precision.device: input should be 'auto', 'cpu' or 'cuda'; got 'no'" in load_error(
        "demo", ["train.precision.device=no"]
    )
    assert load_recipe("demo", ["train.precision.device=cpu"]).train.precision.device == "cpu"
    # Keys of other types read YAML as before: a number, a mapping, a union with a mapping.
    recipe = load_recipe("demo", ["train.steps=0x10", "mix.weights={code: 2}", "train.objective={clm: 1, mlm: 1}"])
    assert (recipe.train.steps, recipe.mix.weights, recipe.train.objective) == (
        16,
        {"code": 2.0},
        {"clm": 1.0, "mlm": 1.0},
    )


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_text_arrives_unchanged(text):
    # --set: any text but one written whole as a YAML quoted string (that one is unquoted);
    # literal_override (kiln generate --prompt): any text at all.
    if text.strip()[:1] not in ("'", '"'):
        assert load_recipe(None, ["name=x", f"generate.prompt={text}"]).generate.prompt == text
    assert load_recipe(None, ["name=x", literal_override("generate.prompt", text)]).generate.prompt == text


@pytest.mark.parametrize("assignment", ["train.lr", "", "=3", "  =3"])
def test_override_without_key_or_equals_is_rejected(assignment):
    with pytest.raises(ConfigError) as info:
        apply_override({}, assignment)
    message = str(info.value)
    assert repr(assignment) in message
    assert "expected section.key=value" in message


def test_override_through_a_value_is_rejected():
    message = load_error("demo", ["train.steps.x=1"])
    assert "--set train.steps.x: 'steps' is a value, not a section" in message


def test_override_with_invalid_yaml_value():
    message = load_error("demo", ["train.steps=[1, 2"])
    assert "train.steps=[1, 2" in message
    assert "not valid YAML" in message


def test_unknown_key_names_path_and_lists_allowed_keys():
    message = load_error("demo", ["train.lrr=0.1"])
    assert "1 problem(s)" in message
    line = next(l for l in message.splitlines() if "train.lrr" in l)
    assert "unknown key" in line
    assert "0.1" not in line  # the key, never its value
    allowed = [a.strip() for a in line.split("allowed keys here:")[1].split(", ")]
    assert allowed == sorted(TrainConfig.model_fields)  # the train section's keys, not another section's
    assert {"optim", "schedule", "steps", "seq_len", "global_batch_tokens"} <= set(allowed)


def test_unknown_top_level_key_lists_sections(tmp_path):
    path = write_recipe(tmp_path, "name: x\ntrian: {steps: 3}\n")
    message = load_error(path, [])
    assert "trian: unknown key" in message
    for section in ("curate", "eval", "generate", "mix", "model", "name", "runs_dir", "tokenize", "tokenizer", "train"):
        assert section in message.split("allowed keys here:")[1]


def test_unknown_key_inside_an_input_lists_input_keys(tmp_path):
    path = write_recipe(
        tmp_path, "name: x\ncurate:\n  inputs:\n    - {source: a, format: text, path: 'x/*', glob: '*.txt'}\n"
    )
    message = load_error(path, [])
    line = next(l for l in message.splitlines() if "glob" in l)
    assert line.strip().startswith("curate.inputs.0.glob: unknown key")
    assert line.endswith(
        "allowed keys here: code, extractor, format, id_field, locales, path, source, source_field, text_field"
    )


def test_wrong_type_names_path_and_bad_value():
    message = load_error("demo", ["train.steps=many"])
    assert "train.steps:" in message
    assert "valid integer" in message
    assert "'many'" in message


def test_wrong_literal_lists_choices():
    message = load_error("demo", ["train.precision.device=tpu"])
    assert "train.precision.device:" in message and "'tpu'" in message
    assert "'auto', 'cpu' or 'cuda'" in message


@pytest.mark.parametrize(
    ("override", "path", "rule"),
    [
        ("train.optim.lr=-1", "train.optim.lr", "greater than 0"),
        ("train.optim.lr=2", "train.optim.lr", "less than or equal to 1"),
        ("tokenize.val_fraction=1.5", "tokenize.val_fraction", "less than 1"),
        ("curate.max_total_mb=0", "curate.max_total_mb", "greater than 0"),
        ("tokenizer.vocab_size=100", "tokenizer", "vocab_size 100 leaves no room for merges"),
    ],
)
def test_out_of_range_value_names_path_and_rule(override, path, rule):
    message = load_error("demo", [override])
    line = next(l.strip() for l in message.splitlines() if l.strip().startswith(path + ":"))
    assert rule in line
    assert override.split("=", 1)[1] in line  # the bad value is quoted back


def test_section_validator_error_names_section():
    message = load_error(
        "demo", ["train.steps=300", "train.schedule.warmup_fraction=null", "train.schedule.warmup_steps=300"]
    )
    assert "train: schedule.warmup_steps (300) must be below steps (300)" in message


def test_shipped_recipes_warm_up_over_a_share_of_any_step_count():
    # `--set train.steps=40` on the demo stopped at "warmup_steps (40) must be below steps (40)".
    assert load_recipe("demo").train.warmup_steps == 40  # its 450 steps keep their 40 warmup steps
    assert load_recipe("demo", ["train.steps=40"]).train.warmup_steps == 4
    for name in ("continued", "curriculum", "fim-code", "span-corruption"):
        cfg = load_recipe(name).train
        assert cfg.warmup_steps == cfg.steps // 10, name  # what their warmup_steps were
        assert load_recipe(name, ["train.steps=20"]).train.warmup_steps == 2, name
    # An absolute warmup on top of the recipe's fraction says which one to drop.
    message = load_error("demo", ["train.schedule.warmup_steps=5"])
    assert "train.schedule: warmup_steps (5) and warmup_fraction (0.089) are both set; keep one" in message
    assert "--set train.schedule.warmup_fraction=null" in message


def test_old_train_keys_name_their_new_home():
    message = load_error("demo", ["train.lr=1e-3", "train.checkpoint_every=50"])
    assert "train: train.lr moved to train.optim.lr; train.checkpoint_every moved to train.checkpoint.every" in message
    assert "train.precision is a section now: use train.precision.dtype=bf16" in load_error(
        "demo", ["train.precision=bf16"]
    )
    assert "train.grad_accum_steps is replaced by train.global_batch_tokens" in load_error(
        "demo", ["train.grad_accum_steps=2"]
    )


def test_demo_batch_is_one_micro_batch_and_a_global_batch_must_divide():
    train = load_recipe("demo").train
    assert train.global_batch_tokens == 4096 == 16 * 256 and train.grad_accum_steps == 1
    assert load_recipe("demo", ["train.seq_len=128"]).train.grad_accum_steps == 2  # same tokens per step
    message = load_error("demo", ["train.seq_len=100"])
    assert (
        "train: global_batch_tokens (4096) is not a multiple of micro_batch_size * seq_len * data-parallel ranks "
        "(16 * 100 * 1 = 1600)"
    ) in message


def test_cross_section_seq_len_exceeds_model():
    message = load_error("demo", ["model.max_seq_len=128"])
    assert "train.seq_len (256) exceeds model.max_seq_len (128)" in message


def test_cross_section_eval_seq_len_and_vocab():
    assert "eval.seq_len (300) exceeds model.max_seq_len (256)" in load_error("demo", ["eval.seq_len=300"])
    assert "model.vocab_size (1000) is below tokenizer.vocab_size (8192)" in load_error(
        "demo", ["model.vocab_size=1000"]
    )


def test_cross_section_mix_weights_unknown_source():
    message = load_error("demo", ["mix.weights.web=1", "mix.weights.code=1"])
    assert "mix.weights names sources ['web']" in message
    assert "['code', 'docs', 'prose']" in message


def test_all_problems_reported_at_once():
    message = load_error("demo", ["train.lrr=1", "model.d_model=abc", "tokenize.val_fraction=0"])
    assert "3 problem(s)" in message
    for path in ("train.lrr", "model.d_model", "tokenize.val_fraction"):
        assert path in message


def test_unknown_recipe_name_lists_shipped(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./recipes here; only the shipped folder is searched
    with pytest.raises(ConfigError) as info:
        load_recipe("nosuch")
    message = str(info.value)
    assert "'nosuch'" in message
    assert (
        "shipped: continued, continued-open, curriculum, demo, fim-code, multilingual, open-replay, span-corruption"
        in message
    )


def test_recipe_that_is_not_a_mapping(tmp_path):
    path = write_recipe(tmp_path, "- just\n- a list\n")
    assert "top level must be a mapping" in load_error(path, [])


def test_recipe_that_is_not_yaml(tmp_path):
    path = write_recipe(tmp_path, "name: [unclosed\n")
    assert "not valid YAML" in load_error(path, [])


def test_validate_recipe_names_origin():
    with pytest.raises(ConfigError) as info:
        validate_recipe({"name": "x", "train": {"steps": 0}}, origin="my-origin")
    assert str(info.value).startswith("my-origin: 1 problem(s)")
    assert "train.steps: input should be greater than or equal to 1; got 0" in str(info.value)


def test_bad_input_item_is_one_problem(tmp_path):
    path = write_recipe(tmp_path, "name: x\ncurate:\n  inputs:\n    - {source: a, format: bogus}\n")
    message = load_error(path, [])
    assert "curate.inputs.0.format" in message
    assert "1 problem(s)" in message
    assert "at least 1 item" not in message


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("curate.max_total_mb=.inf", "curate.max_total_mb: input should be a finite number"),
        ("generate.temperature=.nan", "generate.temperature: input should be a finite number"),
        ("mix.weights={code: -1}", "mix: weights.code is -1.0; it must be >= 0"),
        ("mix.weights={code: 0, prose: 0}", "give no source a positive weight"),
        ("mix.weights={code: 1.0e+308, prose: 1.0e+308}", "sum to infinity"),
    ],
)
def test_non_finite_and_negative_values_are_refused(override, fragment):
    assert fragment in load_error("demo", [override])


def test_a_key_given_twice_is_an_error_naming_it(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("name: twice\ntrain:\n  steps: 10\n  seq_len: 64\n  steps: 20\n")
    with pytest.raises(ConfigError, match=r"key 'steps' is given twice in one mapping \(lines 3 and 5\)"):
        load_recipe(path)


def test_merge_keys_may_override_and_other_yaml_errors_stay_config_errors(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text(
        "name: merge\ncurate:\n  sources:\n    docs: &loose\n      c4: {enabled: false}\n      fineweb: {enabled: "
        "false}\n    prose:\n      <<: *loose\n      c4: {enabled: true}\n"
    )
    cfg = load_recipe(path).curate
    assert cfg.for_source("prose").c4.enabled is True and cfg.for_source("prose").fineweb.enabled is False
    path.write_text("name: keys\ntrain: {1: a, true: b}\n")  # two different keys, then refused by the schema
    with pytest.raises(ConfigError, match="problem"):
        load_recipe(path)
    path.write_text("name: unhashable\n? [a, b]\n: 1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_recipe(path)


def test_yaml_anchors_still_share_a_mapping(tmp_path):
    path = tmp_path / "anchors.yaml"
    path.write_text(
        "name: anchors\ncurate:\n  sources:\n    docs: &loose\n      c4: {enabled: false}\n    prose: *loose\n"
    )
    assert load_recipe(path).curate.for_source("prose").c4.enabled is False


@pytest.mark.parametrize(
    "assignment", ["curate.length.min_chars=true", "train.steps=false", "curate.pii.max_hits=true"]
)
def test_a_boolean_for_a_number_is_an_error_naming_the_key(assignment):
    key = assignment.split("=")[0].rsplit(".", 1)[1]
    with pytest.raises(ConfigError, match=rf"{key}: got (true|false), a yes/no value"):
        load_recipe("demo", [assignment])
    load_recipe("demo", ["curate.pii.enabled=false"])  # a yes/no setting takes one


def test_a_recipe_that_is_not_utf8_is_one_clear_error(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.yaml: not UTF-8 text \(byte 9"):
        load_recipe(path)


SECRET = "SECRETXYZ"


def test_a_refused_key_is_named_never_its_value(tmp_path):
    # A credential put in the recipe or a --set by mistake is refused without landing on stderr.
    path = write_recipe(
        tmp_path,
        f"name: x\nstorage:\n  aws_secret_access_key: {SECRET}\n  credentials: {{token: {SECRET}}}\n"
        f"train: {{api_key: {SECRET}}}\n",
    )
    message = load_error(path, [])
    assert "3 problem(s)" in message and SECRET not in message
    for key in ("storage.aws_secret_access_key", "storage.credentials", "train.api_key"):
        assert f"{key}: unknown key; allowed keys here: " in message
    assert f"allowed keys here: {', '.join(sorted(StorageConfig.model_fields))}" in message
    overrides = [f"storage.secret={SECRET}", f"storage.key=[{SECRET}", f"nosection.token={SECRET}: x"]
    message = load_error("demo", overrides)  # unparsable YAML of an unknown key too: refused by the key
    assert "3 problem(s)" in message and SECRET not in message
    assert "storage.secret: unknown key" in message and "nosection: unknown key" in message
    message = load_error("demo", [f"storage.anonymous={SECRET}"])  # a known key of the section: its rule only
    assert "storage.anonymous: input should be a valid boolean" in message and SECRET not in message


@pytest.mark.parametrize("name", ["..", ".", "", ".hidden", "a/b", "../x", "a\\b", "x\ny", "tab\there", "nul\x00"])
def test_a_run_name_that_is_not_one_folder_is_refused(tmp_path, name):
    expected = f"name {name!r}: not a run name; a run is one folder under runs_dir"
    assert expected in load_error("demo", [f"name={name}"])
    assert expected in load_error(write_recipe(tmp_path, yaml.safe_dump({"name": name})), [])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet="./\\-_a \n\x00", max_size=4)))
def test_an_accepted_run_name_is_a_direct_child_of_runs_dir(name):
    try:
        recipe = validate_recipe({"name": name, "runs_dir": "/nonexistent/runs"})
    except ConfigError:
        return
    runs = Path("/nonexistent/runs")
    assert recipe.run_dir == runs / name and (runs / name).resolve().parent == runs
    assert os.path.normpath(f"runs/{name}") == f"runs/{name}" and "\\" not in name


def test_run_names_as_people_write_them_are_accepted():
    for name in ("demo", "web-2024.10", "a..b", "_x", "-x", "2024"):
        assert validate_recipe({"name": name}).name == name


@pytest.mark.parametrize(
    ("runs_dir", "rule"),
    [
        ("s3://bucket/../x", "the path part '..'"),
        ("s3://bucket/./x", "the path part '.'"),
        ("s3://bucket//x", "the path part ''"),
        ("s3://../x", "the path part '..'"),
        ("s3://", "no bucket; give s3://BUCKET/PATH"),
        ("s3:///runs", "no bucket"),
        ("file:///tmp/runs", "file:// URLs are not read as paths; give the plain path (/tmp/runs)"),
        ("ftp://host/runs", "ftp:// is not a store kiln reaches"),
        ("https://example.org/runs", "https:// locations are read only"),
    ],
)
def test_a_runs_dir_url_with_parts_a_store_takes_literally_is_refused(runs_dir, rule):
    message = load_error("demo", [f"runs_dir={runs_dir}"])
    assert f"1 problem(s):\n  runs_dir {runs_dir!r}: {rule}" in message


def test_export_out_is_checked_as_runs_dir_is():
    message = load_error("demo", ["export.out=s3://bucket/models/../x"])
    assert "1 problem(s):\n  export.out 's3://bucket/models/../x': the path part '..'" in message
    assert load_recipe("demo", ["export.out=s3://bucket/models/x/"]).export.out == "s3://bucket/models/x/"


def test_a_runs_dir_url_loses_only_its_trailing_slash_and_never_shows_credentials():
    assert load_recipe("demo", ["runs_dir=s3://bucket/runs/"]).runs_dir == "s3://bucket/runs"
    assert load_recipe("demo", ["runs_dir=local/runs/../runs"]).runs_dir == "local/runs/../runs"  # a path resolves
    message = load_error("demo", [f"runs_dir=s3://AKIAKEY:{SECRET}@bucket/runs"])
    assert "runs_dir: a URL with credentials in it" in message and SECRET not in message and "AKIAKEY" not in message
