"""kiln.core.tokenshards: the .bin/.idx pair, written and read back, and every way it can be damaged."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.core.errors import FatalError
from kiln.core.tokenshards import HEADER, TokenShard, TokenShardWriter, dtype_for, open_split


def write(prefix, docs, vocab_size):
    writer = TokenShardWriter(prefix, vocab_size)
    for ids in docs:
        writer.add(ids)
    writer.close()
    return writer


DOCS = [[5, 17, 3, 0], [999, 0], [0], [1, 2, 3, 4, 5, 6, 0]]


def test_dtype_boundary():
    assert dtype_for(65_536) == np.uint16  # ids 0..65535 fit
    assert dtype_for(65_537) == np.uint32
    assert dtype_for(1_000, "uint32") == np.uint32 and dtype_for(65_536, "uint16") == np.uint16
    with pytest.raises(FatalError, match="uint16 holds 65,536\\); set tokenize.dtype=uint32"):
        dtype_for(65_537, "uint16")


def test_ids_beyond_uint16_in_a_uint16_shard_are_refused(tmp_path):
    with pytest.raises(FatalError, match="a uint16 shard cannot hold a vocabulary of 70,000 ids"):
        TokenShardWriter(tmp_path / "a", vocab_size=70_000, dtype=np.uint16)
    writer = TokenShardWriter(tmp_path / "b", vocab_size=65_536, dtype=np.uint16)
    with pytest.raises(FatalError, match="token id 65,536 does not fit a uint16 shard.*set tokenize.dtype=uint32"):
        writer.add([1, 65_536, 0])


def test_append_copies_documents(tmp_path):
    write(tmp_path / "a", DOCS[:2], vocab_size=1000)
    write(tmp_path / "b", DOCS[2:], vocab_size=1000)
    writer = TokenShardWriter(tmp_path / "ab", vocab_size=1000)
    for part in ("a", "b"):
        writer.append(TokenShard(tmp_path / part))
    writer.close()
    write(tmp_path / "whole", DOCS, vocab_size=1000)
    assert (tmp_path / "ab.bin").read_bytes() == (tmp_path / "whole.bin").read_bytes()
    assert (tmp_path / "ab.idx").read_bytes() == (tmp_path / "whole.idx").read_bytes()


def test_uint16_round_trip_and_format(tmp_path):
    prefix = tmp_path / "train"
    writer = write(prefix, DOCS, vocab_size=1000)
    assert writer.n_tokens == 14
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.bin", "train.idx"]  # no temp files left

    raw_bin = (tmp_path / "train.bin").read_bytes()
    assert raw_bin == np.array([t for d in DOCS for t in d], dtype="<u2").tobytes()
    raw_idx = (tmp_path / "train.idx").read_bytes()
    assert HEADER.size == 48
    offsets = np.array([0, 4, 6, 7, 14], dtype="<u8")
    assert struct.unpack_from("<8sIIQQQQ", raw_idx) == (
        b"KILNIDX\x00",
        2,
        2,
        4,
        14,
        xxhash.xxh64(raw_bin).intdigest(),
        xxhash.xxh64(offsets.tobytes()).intdigest(),
    )
    assert raw_idx[48:] == offsets.tobytes()

    shard = TokenShard(prefix, verify=True)
    assert shard.dtype == np.uint16
    assert len(shard) == 14 and shard.n_docs == 4
    assert [shard.document(i).tolist() for i in range(4)] == DOCS


def test_uint32_round_trip(tmp_path):
    docs = [[70_000, 65_536, 0], [65_535, 1, 0]]
    write(tmp_path / "val", docs, vocab_size=70_001)
    shard = TokenShard(tmp_path / "val", verify=True)
    assert shard.dtype == np.uint32
    assert (tmp_path / "val.bin").stat().st_size == 4 * 6
    assert [shard.document(i).tolist() for i in range(2)] == docs


@settings(max_examples=50, deadline=None)
@given(vocab=st.sampled_from([300, 65_536, 100_000]), data=st.data())
def test_round_trip_property(tmp_path_factory, vocab, data):
    docs = data.draw(st.lists(st.lists(st.integers(0, vocab - 1), max_size=30), max_size=8))
    prefix = tmp_path_factory.mktemp("shard") / "train"
    write(prefix, docs, vocab)
    shard = TokenShard(prefix, verify=True)
    assert shard.n_docs == len(docs)
    assert [shard.document(i).tolist() for i in range(len(docs))] == docs


@pytest.mark.parametrize("bad", [[1, 1000], [-1, 5]])
def test_ids_outside_vocab_are_rejected(tmp_path, bad):
    writer = TokenShardWriter(tmp_path / "train", vocab_size=1000)
    writer.add([1, 2, 999])
    with pytest.raises(FatalError, match="outside vocab of 1000"):
        writer.add(bad)
    assert (writer.n_docs, writer.n_tokens) == (1, 3)  # the rejected document was not recorded
    writer.close()
    assert TokenShard(tmp_path / "train").document(0).tolist() == [1, 2, 999]


def test_empty_shard(tmp_path):
    write(tmp_path / "val", [], vocab_size=1000)
    shard = TokenShard(tmp_path / "val", verify=True)
    assert len(shard) == 0 and shard.n_docs == 0 and shard.tokens.size == 0
    assert (tmp_path / "val.bin").stat().st_size == 0


def test_empty_document(tmp_path):
    write(tmp_path / "val", [[], [7, 0]], vocab_size=1000)
    shard = TokenShard(tmp_path / "val", verify=True)
    assert shard.n_docs == 2
    assert shard.document(0).tolist() == [] and shard.document(1).tolist() == [7, 0]


@pytest.fixture
def shard_prefix(tmp_path):
    write(tmp_path / "train", DOCS, vocab_size=1000)
    return tmp_path / "train"


def test_truncated_bin_is_fatal(shard_prefix):
    bin_path = shard_prefix.with_suffix(".bin")
    bin_path.write_bytes(bin_path.read_bytes()[:-2])
    with pytest.raises(FatalError, match="the pair does not match"):
        TokenShard(shard_prefix)


def test_index_with_wrong_length_is_fatal(shard_prefix):
    idx = shard_prefix.with_suffix(".idx")
    idx.write_bytes(idx.read_bytes() + b"\x00" * 8)
    with pytest.raises(FatalError, match="expected 88 for 4 documents"):
        TokenShard(shard_prefix)


def test_index_shorter_than_header_is_fatal(shard_prefix):
    idx = shard_prefix.with_suffix(".idx")
    idx.write_bytes(idx.read_bytes()[:20])
    with pytest.raises(FatalError, match="shorter than its header"):
        TokenShard(shard_prefix)


def test_bad_magic_is_fatal(shard_prefix):
    idx = shard_prefix.with_suffix(".idx")
    idx.write_bytes(b"NOTKILN\x00" + idx.read_bytes()[8:])
    with pytest.raises(FatalError, match="not a kiln token index"):
        TokenShard(shard_prefix)


def test_wrong_version_is_fatal(shard_prefix):
    idx = shard_prefix.with_suffix(".idx")
    raw = bytearray(idx.read_bytes())
    raw[8:12] = struct.pack("<I", 1)
    idx.write_bytes(bytes(raw))
    with pytest.raises(FatalError, match="version 1\\); rerun `kiln tokenize --force`"):
        TokenShard(shard_prefix)


def test_modified_bin_is_fatal_on_open(shard_prefix):
    bin_path = shard_prefix.with_suffix(".bin")
    raw = bytearray(bin_path.read_bytes())
    raw[0] ^= 0xFF  # same size, different content
    bin_path.write_bytes(bytes(raw))
    with pytest.raises(FatalError, match="checksum does not match its index"):
        TokenShard(shard_prefix)
    assert (
        TokenShard(shard_prefix, verify=False).document(0)[0] == 5 ^ 0xFF
    )  # only an explicit opt-out trusts the sizes


def test_modified_offsets_are_fatal_on_open(shard_prefix):
    idx = shard_prefix.with_suffix(".idx")
    raw = bytearray(idx.read_bytes())
    raw[48 + 8] = 3  # document 0 now ends at token 3 instead of 4: same size, wrong boundaries
    idx.write_bytes(bytes(raw))
    with pytest.raises(FatalError, match="document offsets do not match their checksum"):
        TokenShard(shard_prefix)


def test_missing_half_of_the_pair_is_fatal(shard_prefix):
    shard_prefix.with_suffix(".idx").unlink()
    with pytest.raises(FatalError, match="pair incomplete"):
        TokenShard(shard_prefix)


def test_open_split(tmp_path):
    for source in ("code", "prose"):
        (tmp_path / source).mkdir()
        for split in ("train", "val"):
            write(tmp_path / source / split, [[1, 0]] if split == "train" else [[2, 3, 0]], vocab_size=10)
    val = open_split(tmp_path, "val", verify=True)
    assert sorted(val) == ["code", "prose"]
    assert val["prose"].document(0).tolist() == [2, 3, 0]
    with pytest.raises(FatalError, match="no test token shards"):
        open_split(tmp_path, "test")
