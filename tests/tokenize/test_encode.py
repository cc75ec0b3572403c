"""kiln.tokenize.encode.run: curated shards -> per-source train/val token shards."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hf_tokenizers import save as save_hf_tokenizer

from kiln.core.docshards import list_shards, read_shard
from kiln.core.document import Document
from kiln.core.errors import FatalError
from kiln.core.manifest import MANIFEST
from kiln.core.split import is_heldout
from kiln.core.tokenshards import DOC_SCORES, TokenShard, doc_scores, open_split, read_scores
from kiln.text.fim import restore
from kiln.text.hf_tokenizer import HfTokenizer
from kiln.text.specials import EOT
from kiln.text.tokenizer import KilnTokenizer
from kiln.tokenize import encode as encode_module
from kiln.tokenize.config import TokenizeConfig, TokenizerConfig
from kiln.tokenize.encode import DONE, PartWriter, bounded, join
from kiln.tokenize.encode import run as encode
from kiln.tokenize.train import run as train_tokenizer

TOKENIZER = TokenizerConfig(vocab_size=600, sample_mb=5.0, heldout_fraction=0.2, heldout_mb=1.0)
CFG = TokenizeConfig(val_fraction=0.2, batch_docs=7)  # small batches: several flushes per source


def configured(**changes) -> TokenizeConfig:
    """CFG with changes, validated like a recipe (nested sections included)."""
    return TokenizeConfig.model_validate({**CFG.model_dump(), **changes})


@pytest.fixture(scope="module")
def tokenized_run(curated_run, tmp_path_factory) -> Path:
    run_dir = Path(shutil.copytree(curated_run, tmp_path_factory.mktemp("tokenized") / "run"))
    train_tokenizer(TOKENIZER, run_dir)
    return run_dir


@pytest.fixture
def run_dir(tokenized_run, tmp_path) -> Path:
    return Path(shutil.copytree(tokenized_run, tmp_path / "run"))


def curated_by_source(run_dir: Path) -> dict[str, list]:
    docs: dict[str, list] = {}
    for shard in list_shards(run_dir / "curate" / "shards"):
        for d in read_shard(shard):
            docs.setdefault(d.source, []).append(d)
    return docs


def test_encode(run_dir):
    manifest = encode(CFG, run_dir)
    tok = KilnTokenizer.load(run_dir / "tokenizer" / "tokenizer.json")
    stage_dir = run_dir / "tokenize"
    docs = curated_by_source(run_dir)
    assert sorted(docs) == ["code", "prose"]
    assert not any(EOT in d.text for ds in docs.values() for d in ds)  # so EOT can only be our separator

    counts = manifest["counts"]
    assert counts["vocab_size"] == 600 and counts["dtype"] == "uint16"
    assert counts["encoder"] == tok.encoder_name == "splintr"  # what the tasks encoded with
    for source, source_docs in docs.items():
        val_ids = [d.id for d in source_docs if is_heldout(d.id, CFG.val_fraction)]
        assert (stage_dir / source / "val_ids.txt").read_text(encoding="utf-8").splitlines() == val_ids
        for split in ("train", "val"):
            expected = [d for d in source_docs if is_heldout(d.id, CFG.val_fraction) == (split == "val")]
            assert expected, f"{source}/{split} is empty; the test would prove nothing"
            shard = TokenShard(stage_dir / source / split, verify=True)
            assert shard.n_docs == len(expected)
            for i, d in enumerate(expected):
                ids = shard.document(i).tolist()
                assert ids[-1] == tok.eot_id
                assert tok.eot_id not in ids[:-1]
                assert tok.decode(ids[:-1]) == d.text  # the curated text comes back exactly
            # The curation scores a curriculum orders by, one row per document (NaN where absent).
            scores = read_scores(stage_dir / source / split, shard.n_docs)
            expected_scores = np.array([doc_scores(d.meta) for d in expected], dtype=np.float32)
            assert np.array_equal(np.stack([scores[k] for k in DOC_SCORES], axis=1), expected_scores, equal_nan=True)
            stats = counts["per_source"][source][split]
            n_bytes = sum(len(d.text.encode()) for d in expected)
            language = "code" if source == "code" else "und"  # the language step is off: no meta.language
            assert stats == {
                "docs": len(expected),
                "tokens": len(shard),
                "bytes": n_bytes,
                "fim_docs": 0,
                "languages": {language: {"docs": len(expected), "tokens": len(shard), "bytes": n_bytes}},
            }

    per = counts["per_source"].values()
    assert counts["train_tokens"] == sum(s["train"]["tokens"] for s in per)
    assert counts["val_tokens"] == sum(s["val"]["tokens"] for s in per)
    assert counts["train_docs"] + counts["val_docs"] == sum(len(v) for v in docs.values())
    assert sorted(o["path"] for o in manifest["outputs"]) == sorted(
        [
            f"{s}/{split}.{ext}"
            for s in ("code", "prose")
            for split in ("train", "val")
            for ext in ("bin", "idx", "scores.npy")
        ]
        + ["code/val_ids.txt", "prose/val_ids.txt"]
    )
    assert set(manifest["upstream"]) == {"curate", "tokenizer"}
    assert {s: sh.n_docs for s, sh in open_split(stage_dir, "val", verify=True).items()} == {
        s: counts["per_source"][s]["val"]["docs"] for s in ("code", "prose")
    }


def test_batch_size_does_not_change_the_shards(run_dir, tmp_path):
    encode(CFG, run_dir)
    small = {p.relative_to(run_dir / "tokenize"): p.read_bytes() for p in (run_dir / "tokenize").glob("*/*.*")}
    # batch_docs is a speed setting: without force the stage is (rightly) up to date.
    assert (
        encode(CFG.model_copy(update={"batch_docs": 1000}), run_dir)["finished_at"]
        == json.loads((run_dir / "tokenize" / MANIFEST).read_text())["finished_at"]
    )
    encode(CFG.model_copy(update={"batch_docs": 1000}), run_dir, force=True)
    large = {p.relative_to(run_dir / "tokenize"): p.read_bytes() for p in (run_dir / "tokenize").glob("*/*.*")}
    assert len(small) == 14 and small == large  # 2 sources x (2 x (shard pair + scores) + val_ids.txt)


def test_rerun_is_skipped_and_upstream_change_redoes(run_dir):
    inline = configured(
        executor={"workers": 1}
    )  # one process: a tokenizer cached from the first run must not leak into the redo
    first = encode(inline, run_dir)
    manifest_bytes = (run_dir / "tokenize" / MANIFEST).read_bytes()
    marker = run_dir / "tokenize" / "marker"
    marker.write_text("begin() would delete me")

    assert encode(inline, run_dir) == first
    assert (run_dir / "tokenize" / MANIFEST).read_bytes() == manifest_bytes and marker.exists()

    encode(inline, run_dir, force=True)
    assert not marker.exists()

    marker.write_text("x")
    train_tokenizer(TOKENIZER.model_copy(update={"vocab_size": 650}), run_dir)  # the tokenizer was redone
    redone = encode(inline, run_dir)
    assert not marker.exists()
    assert redone["counts"]["vocab_size"] == 650
    assert redone["counts"]["train_tokens"] < first["counts"]["train_tokens"]  # more merges, fewer tokens


def test_missing_curate_stage_is_fatal(tmp_path):
    with pytest.raises(FatalError, match="curate: no manifest.json; run that stage first"):
        encode(CFG, tmp_path / "run")


def test_missing_tokenizer_stage_is_fatal(tokenized_run, tmp_path):
    only_curate = tmp_path / "run"
    shutil.copytree(tokenized_run / "curate", only_curate / "curate")
    with pytest.raises(FatalError, match="tokenizer: no manifest.json"):
        encode(CFG, only_curate)


def test_no_validation_documents_is_fatal(run_dir):
    with pytest.raises(FatalError, match=r"no document fell in the validation split at tokenize.val_fraction=1e-09"):
        encode(CFG.model_copy(update={"val_fraction": 1e-9}), run_dir)
    assert not (run_dir / "tokenize" / MANIFEST).exists()


def shard_bytes(run_dir: Path) -> dict[Path, bytes]:
    return {p.relative_to(run_dir / "tokenize"): p.read_bytes() for p in sorted((run_dir / "tokenize").glob("*/*.*"))}


def test_workers_and_executors_give_identical_shards(run_dir, ray_local, monkeypatch):
    encode(configured(executor={"workers": 1}), run_dir)
    one = shard_bytes(run_dir)
    assert not (run_dir / "tokenize" / ".parts").exists()  # the per-shard parts are joined, then removed
    used: list[str] = []
    real_threads, real_build = encode_module.ThreadExecutor, encode_module.build_executor
    monkeypatch.setattr(encode_module, "ThreadExecutor", lambda n: used.append("threads") or real_threads(n))
    monkeypatch.setattr(encode_module, "build_executor", lambda *a: used.append("executor") or real_build(*a))
    encode(configured(executor={"workers": 2}), run_dir, force=True)  # a small corpus: threads of this process
    assert shard_bytes(run_dir) == one
    monkeypatch.setattr(encode_module, "INLINE_BYTES_PER_WORKER", 0)  # as for a large one: worker processes
    encode(configured(executor={"workers": 2}), run_dir, force=True)
    assert shard_bytes(run_dir) == one and used == ["threads", "executor"]
    encode(configured(executor={"kind": "ray", "workers": 2}), run_dir, force=True)
    assert shard_bytes(run_dir) == one


def test_interrupted_run_resumes_per_shard(run_dir, tmp_path, monkeypatch):
    clean = Path(shutil.copytree(run_dir, tmp_path / "clean"))
    encode(CFG, clean)
    shards = list_shards(run_dir / "curate" / "shards")
    assert len(shards) >= 4

    real_read = encode_module.read_shard

    def crash_on_third(path):
        if path == shards[2]:
            raise KeyboardInterrupt("killed")
        return real_read(path)

    monkeypatch.setattr(encode_module, "read_shard", crash_on_third)
    inline = configured(executor={"workers": 1})  # tasks run in this process, in shard order
    with pytest.raises(KeyboardInterrupt):
        encode(inline, run_dir)
    parts = run_dir / "tokenize.partial" / ".parts"  # an interrupted stage keeps its work beside the finished one
    finished = {p.parent.name: p.stat().st_mtime_ns for p in parts.glob("*/stats.json")}
    assert sorted(finished) == [s.name.removesuffix(".jsonl.zst") for s in shards[:2]]

    monkeypatch.setattr(encode_module, "read_shard", real_read)
    encode(inline, run_dir)
    assert shard_bytes(run_dir) == shard_bytes(clean)  # same result as a run never interrupted
    log = (run_dir / "tokenize" / MANIFEST).read_text()
    assert json.loads(log)["counts"] == json.loads((clean / "tokenize" / MANIFEST).read_text())["counts"]


def test_finished_tasks_are_not_redone(run_dir, monkeypatch):
    inline = configured(executor={"workers": 1})
    shards = list_shards(run_dir / "curate" / "shards")
    read: list[Path] = []
    real_read = encode_module.read_shard

    def fail_last(path):
        read.append(path)
        if path == shards[-1] and len(read) == len(shards):
            raise KeyboardInterrupt("killed")
        return real_read(path)

    monkeypatch.setattr(encode_module, "read_shard", fail_last)
    with pytest.raises(KeyboardInterrupt):
        encode(inline, run_dir)
    encode(inline, run_dir)
    assert read == shards + [shards[-1]]  # the resumed run read only the shard that had not finished


def test_uint32_shards_on_request(run_dir):
    manifest = encode(CFG.model_copy(update={"dtype": "uint32"}), run_dir)
    assert manifest["counts"]["dtype"] == "uint32"
    shard = TokenShard(run_dir / "tokenize" / "code" / "train")
    assert shard.dtype == np.uint32 and (run_dir / "tokenize" / "code" / "train.bin").stat().st_size == 4 * len(shard)


def test_tokenizer_from_another_tool_is_fatal(run_dir):
    (run_dir / "tokenizer" / "kiln_tokenizer.json").unlink()
    with pytest.raises(FatalError, match="kiln_tokenizer.json"):
        encode(CFG, run_dir)


def test_a_cut_or_deleted_curated_shard_is_refused_before_any_work(run_dir):
    shards = list_shards(run_dir / "curate" / "shards")
    with open(shards[0], "r+b") as f:
        f.truncate(100)
    with pytest.raises(FatalError, match=rf"{shards[0].name} changed after the curate stage wrote it \(100 bytes now"):
        encode(configured(), run_dir)
    shards[0].unlink()  # still listed in curate's manifest: reported, never silently left out
    with pytest.raises(FatalError, match=rf"input files missing: .*{shards[0].name}"):
        encode(configured(), run_dir)
    assert not (run_dir / "tokenize.partial").exists() and not (run_dir / "tokenize").exists()


def test_fim_rearranges_train_documents_of_the_chosen_sources_only(run_dir):
    counts = encode(configured(fim={"rate": 1.0, "spm_rate": 0.5, "sources": ["code"]}), run_dir)["counts"]
    tok = KilnTokenizer.load(run_dir / "tokenizer" / "tokenizer.json")
    prefix_id, middle_id, suffix_id = tok.fim_ids
    docs = curated_by_source(run_dir)
    layouts = set()
    for source in ("code", "prose"):
        for split in ("train", "val"):
            expected = [d for d in docs[source] if is_heldout(d.id, CFG.val_fraction) == (split == "val")]
            shard = TokenShard(run_dir / "tokenize" / source / split)
            for i, d in enumerate(expected):
                ids = shard.document(i).tolist()[:-1]  # without end-of-document
                if source == "code" and split == "train":
                    layouts.add("psm" if ids[0] == prefix_id else "spm")
                    assert tok.decode(restore(ids, prefix_id, middle_id, suffix_id)) == d.text  # exactly reversible
                else:
                    assert not set(ids) & {prefix_id, middle_id, suffix_id} and tok.decode(ids) == d.text
    assert layouts == {"psm", "spm"}
    # val_fim: every validation document of the FIM sources, rearranged; none for the others.
    val_code = [d for d in docs["code"] if is_heldout(d.id, CFG.val_fraction)]
    val_fim = TokenShard(run_dir / "tokenize" / "code" / "val_fim")
    assert val_fim.n_docs == len(val_code) == counts["per_source"]["code"]["val_fim"]["fim_docs"]
    for i, d in enumerate(val_code):
        assert tok.decode(restore(val_fim.document(i).tolist()[:-1], prefix_id, middle_id, suffix_id)) == d.text
    assert (
        not (run_dir / "tokenize" / "prose" / "val_fim.bin").exists() and "val_fim" not in counts["per_source"]["prose"]
    )
    code_train = counts["per_source"]["code"]["train"]
    assert (
        counts["fim_docs"] == code_train["fim_docs"] == code_train["docs"]
        and counts["per_source"]["prose"]["train"]["fim_docs"] == 0
    )


def test_boundaries_hand_worked():
    ids, lengths = np.array([5, 6, 7], dtype=np.uint32), np.array([2, 1])
    flat, out_lengths = bounded(ids, lengths, bos=1, eos=0)
    assert flat.tolist() == [1, 5, 6, 0, 1, 7, 0] and out_lengths.tolist() == [4, 3]
    flat, out_lengths = bounded(ids, lengths, bos=None, eos=0)
    assert flat.tolist() == [5, 6, 0, 7, 0] and out_lengths.tolist() == [3, 2]
    flat, out_lengths = bounded(np.array([], dtype=np.uint32), np.array([0]), bos=1, eos=0)
    assert flat.tolist() == [1, 0] and out_lengths.tolist() == [2]


@pytest.mark.parametrize("kind", ["kiln", "llama2"])
def test_each_written_document_is_the_tokenizers_document(tokenized_run, tmp_path, kind):
    """Through the flat batch path, each document is tokenizer.document(text): bos where the model has one
    (llama2's <s>), the text with special spellings as text, then eos."""
    if kind == "kiln":
        tok = KilnTokenizer.load(tokenized_run / "tokenizer" / "tokenizer.json")
    else:
        folder = save_hf_tokenizer(kind, tmp_path / kind)
        tok = HfTokenizer({p.name: p.read_bytes() for p in folder.iterdir() if p.suffix == ".json"}, str(folder))
    texts = ["def f(x):\n    return x", "", "a <|endoftext|> b </s> <s>", "Grüße 東京 🙂", "end."]
    docs = [Document(f"d{i}", t, "code") for i, t in enumerate(texts * 4)]
    out = tmp_path / "part"
    out.mkdir()
    part = PartWriter(out, tok, 0.5, np.dtype(np.uint16), None)
    part.add(docs)
    part.close()
    for split in ("train", "val"):
        expected = [d for d in docs if is_heldout(d.id, 0.5) == (split == "val")]
        assert expected, f"{split} is empty; the test would prove nothing"
        shard = TokenShard(out / split, verify=True)
        assert [shard.document(i).tolist() for i in range(shard.n_docs)] == [tok.document(d.text) for d in expected]
        assert part.stats[split]["tokens"] == len(shard)


def test_tokens_are_counted_per_language_and_joined(tokenized_run, tmp_path):
    """Each split counts documents, tokens and bytes per meta.language (code and und without one); the join sums
    the parts, and a part without the counts (an older kiln's) leaves the split's languages unknown."""
    tok = KilnTokenizer.load(tokenized_run / "tokenizer" / "tokenizer.json")
    texts = {"en": "The cat sat on the mat.", "fr": "Le chat est assis.", "und": "Grüße", "code": "x = 1"}
    labelled = ("en", "fr")  # the documents curation labelled; und and code have no meta.language
    docs = [
        Document(
            f"d{i}-{lang}", text, "code" if lang == "code" else "web", {"language": lang} if lang in labelled else {}
        )
        for i in range(6)
        for lang, text in texts.items()
    ]
    parts = []
    for k in range(2):
        out = tmp_path / f"part{k}"
        out.mkdir()
        part = PartWriter(out, tok, 0.0, np.dtype(np.uint16), None)
        part.add(docs)
        part.close()
        (out / DONE).write_text(json.dumps(part.stats))
        parts.append(out)
    one = {lang: len(tok.document(t)) for lang, t in texts.items()}
    assert part.stats["train"]["languages"] == {
        lang: {"docs": 6, "tokens": 6 * one[lang], "bytes": 6 * len(t.encode())} for lang, t in texts.items()
    }
    joined = join(parts, tmp_path / "web", tok.vocab_size, np.dtype(np.uint16), ("train", "val"))
    assert joined["train"]["languages"]["fr"] == {"docs": 12, "tokens": 12 * one["fr"], "bytes": 12 * 18}
    assert sum(v["tokens"] for v in joined["train"]["languages"].values()) == joined["train"]["tokens"]
    assert joined["val"]["languages"] == {}
    older = json.loads((parts[1] / DONE).read_text())
    del older["train"]["languages"]
    (parts[1] / DONE).write_text(json.dumps(older))
    rejoined = join(parts, tmp_path / "web2", tok.vocab_size, np.dtype(np.uint16), ("train", "val"))
    assert "languages" not in rejoined["train"]
