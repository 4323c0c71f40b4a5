"""The on-disk layouts of formats.py: the versioned index framing (one reader of it, for buffers
and ranged reads alike) and the manifest schema family, old files included."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kohakuclip import Reader, pack
from kohakuclip.errors import KohakuClipError
from kohakuclip.formats import (
    FRAME_RECORD,
    IMAGE_INDEX_MAGIC,
    IMAGE_MANIFEST_SCHEMA,
    INDEX_MEMBER,
    INDEX_VERSION,
    MANIFEST_FILE,
    VIDEO_INDEX_MAGIC,
    VIDEO_MANIFEST_SCHEMA,
    IndexFormatError,
    decode_index,
    encode_index,
    manifest_table,
    read_index_header,
)
from kohakuclip.storage.image_manifest import ImageManifest
from kohakuclip.storage.zip import find_zip_member
from tests.media import VideoSpec, make_video

MAGIC = b"TEST01\0\0"
RECORD = np.dtype([("a", "<u8"), ("b", "<u4"), ("c", "<u4")])


def framed(header: dict, records: np.ndarray, magic: bytes = MAGIC) -> bytes:
    """The framing written by hand from its spec (formats.py's docstring), not by encode_index."""
    body = json.dumps(header, separators=(",", ":")).encode()
    head = magic + len(body).to_bytes(8, "little") + body
    return head + b"\0" * (-len(head) % 8) + records.tobytes()


def records(n: int) -> np.ndarray:
    out = np.zeros(n, RECORD)
    out["a"], out["b"], out["c"] = np.arange(n) * 7, np.arange(n) + 1, 3
    return out


def test_encode_index_writes_the_spec_framing_with_a_version() -> None:
    table = records(5)
    data = encode_index(MAGIC, {"x": [1, 2]}, table)
    assert data == framed({"version": INDEX_VERSION, "x": [1, 2]}, table)
    header, parsed = decode_index(data, MAGIC, RECORD)
    assert header == {"version": INDEX_VERSION, "x": [1, 2]}
    np.testing.assert_array_equal(parsed, table)


@pytest.mark.parametrize("header_bytes", [10, 5000, 20000])
def test_ranged_reads_parse_like_the_buffer(header_bytes: int) -> None:
    """A header shorter and longer than the first read: the same result as the whole buffer,
    in one read when it fits and two when it does not."""
    table = records(11)
    data = framed({"pad": "p" * header_bytes}, table)
    asked: list[tuple[int, int]] = []

    def read(at: int, n: int) -> bytes:
        asked.append((at, n))
        return data[at : at + n]

    head = read_index_header(read, MAGIC, len(data), "shard.zip")
    assert head.version == 1 and head.header == {"pad": "p" * header_bytes}
    np.testing.assert_array_equal(np.frombuffer(data[head.records :], RECORD), table)
    assert len(asked) == (1 if header_bytes + 40 <= 4096 else 2)
    np.testing.assert_array_equal(decode_index(data, MAGIC, RECORD)[1], table)


def test_an_unversioned_header_is_version_1() -> None:
    head = read_index_header(lambda at, n: framed({"a": 1}, records(1))[at : at + n], MAGIC)
    assert (head.version, head.header) == (1, {"a": 1})


@pytest.mark.parametrize(
    ("version", "message"),
    [
        (
            INDEX_VERSION + 1,
            f"TEST01 version {INDEX_VERSION + 1} is newer than this kohakuclip reads",
        ),
        ("2", "bad TEST01 version '2'"),
        (0, "bad TEST01 version 0"),
        (True, "bad TEST01 version True"),
    ],
)
def test_a_newer_or_bad_version_is_refused(version: object, message: str) -> None:
    data = framed({"version": version}, records(2))
    with pytest.raises(IndexFormatError, match=f"^shard.zip:{INDEX_MEMBER}: {message}"):
        decode_index(data, MAGIC, RECORD, f"shard.zip:{INDEX_MEMBER}")
    assert issubclass(IndexFormatError, KohakuClipError)


def test_bad_framing_names_the_member() -> None:
    data = framed({"a": 1}, records(2))
    cases = {
        b"NOTIT\0\0\0" + data[8:]: "not a TEST01 index",
        data[:12]: "not a TEST01 index",
        data[:20]: "truncated index header",
        data[:16] + b"{nope" + data[21:]: "index header is not JSON",
        framed([1, 2], records(0)): "index header is not a JSON object",  # type: ignore[arg-type]
        data[:-3]: "index records are not a multiple of 16 bytes",
    }
    for bad, message in cases.items():
        with pytest.raises(IndexFormatError, match=f"^s.zip:idx: {message}"):
            decode_index(bad, MAGIC, RECORD, "s.zip:idx")


@pytest.fixture(scope="module")
def shard(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("formats") / "shard.zip")
    pack(path, [("a.mp4", make_video(VideoSpec(width=64, height=48, frames=6)))])
    return path


def _index_member(path: str) -> tuple[int, bytes]:
    member = find_zip_member(path, INDEX_MEMBER)
    assert member is not None
    with open(path, "rb") as f:
        f.seek(member.offset)
        return member.offset, f.read(member.size)


def test_our_shards_carry_the_version_first(shard: str) -> None:
    _, raw = _index_member(shard)
    head = read_index_header(lambda at, n: raw[at : at + n], VIDEO_INDEX_MAGIC)
    assert next(iter(head.header)) == "version" and head.version == INDEX_VERSION
    assert (len(raw) - head.records) % FRAME_RECORD.itemsize == 0


def test_reader_refuses_a_shard_from_a_newer_kohakuclip(shard: str, tmp_path) -> None:
    """The catalog's ranged header read checks the version too, and names the shard."""
    offset, raw = _index_member(shard)
    newer = raw.replace(b'"version":1', f'"version":{INDEX_VERSION + 1}'.encode(), 1)
    assert newer != raw and len(newer) == len(raw)
    with open(shard, "rb") as f:
        data = bytearray(f.read())
    data[offset : offset + len(raw)] = newer
    path = tmp_path / "newer.zip"
    path.write_bytes(bytes(data))
    with Reader(shard, size=32) as reader:
        assert len(reader) == 1
    with pytest.raises(KohakuClipError, match=rf"newer\.zip:{INDEX_MEMBER}: KCIDX1 version 2"):
        Reader(str(path), size=32, skip=False)


def test_the_manifest_schemas_are_one_family() -> None:
    video, image = VIDEO_MANIFEST_SCHEMA, IMAGE_MANIFEST_SCHEMA
    shared = [f for f in video if f.name in image.names]
    assert [f.name for f in shared] == [
        *("shard", "index", "member", "source", "width", "height", "source_width"),
        *("source_height", "bytes", "source_bytes", "caption", "meta"),
    ]
    assert all(image.field(f.name).type == f.type for f in shared)
    assert video.field("index").type == pa.int64()


def test_manifests_written_before_the_family_are_still_read(tmp_path) -> None:
    """An image manifest with the old names (json, stored_size, source_size) and a video one with
    an int32 index read in today's names and types."""
    old_image = pa.table(
        {
            "shard": ["s.zip", "s.zip"],
            "index": pa.array([1, 0], pa.int64()),
            "key": ["b", "a"],
            "stored_size": [10, 20],
            "source_size": [30, 40],
            "caption": ["second", "first"],
            "json": ['{"label": 3}', "not json"],
        }
    )
    pq.write_table(old_image, tmp_path / MANIFEST_FILE)
    manifest = ImageManifest()
    shard = os.path.join(tmp_path, "s.zip")
    first = {"index": 0, "key": "a", "caption": "first", "meta": "not json"}
    assert manifest.lookup(shard, 0) == first
    assert manifest.lookup(shard, 1) == {**first, "index": 1, "key": "b", "caption": "second",
                                         "meta": {"label": 3}}  # fmt: skip
    renamed = manifest_table(old_image).column_names
    assert renamed == ["shard", "index", "key", "bytes", "source_bytes", "caption", "meta"]
    old_video = pa.table({"shard": ["v.zip"], "index": pa.array([0], pa.int32()), "meta": [None]})
    new_video = pa.Table.from_pylist([{"shard": "w.zip", "index": 0}], schema=VIDEO_MANIFEST_SCHEMA)
    both = pa.concat_tables([manifest_table(old_video), new_video], promote_options="default")
    assert both.schema.field("index").type == pa.int64()
    assert both.column("shard").to_pylist() == ["v.zip", "w.zip"]


def test_another_readers_index_says_which_reader_takes_it() -> None:
    """A video shard given to the image reader (and the reverse) is named as such, not as a
    damaged index."""
    video = encode_index(VIDEO_INDEX_MAGIC, {"videos": []}, np.zeros(0, np.uint8))
    image = encode_index(IMAGE_INDEX_MAGIC, {"images": 0}, np.zeros(0, np.uint8))
    where = "s.zip:__index__.bin"
    for data, wanted, hint in (
        (video, IMAGE_INDEX_MAGIC, "a video shard's: read it with Reader"),
        (image, VIDEO_INDEX_MAGIC, "an image shard's: read it with ImageReader"),
        (b"\0" * 64, VIDEO_INDEX_MAGIC, "bad magic or truncated"),
        (video[:10], VIDEO_INDEX_MAGIC, "bad magic or truncated"),  # its own, cut short
    ):
        with pytest.raises(IndexFormatError, match=rf"s\.zip:__index__\.bin: not a .*\({hint}\)"):
            read_index_header(lambda at, n, d=data: d[at : at + n], wanted, None, where)


def test_video_entries_from_json_are_slotted_and_share_repeated_strings() -> None:
    """A reader keeps one entry per video of its sources: no per-instance dict, and the strings
    of videos encoded alike kept once (a parsed JSON header gives each its own copies)."""
    import json

    from kohakuclip.formats import VideoEntry

    text = json.dumps(
        [
            {"member": f"v{i}.mp4", "row": i, "n": 4, "fps": 24.0, "h": 48, "w": 64,
             "codec": "av1", "prefix": "0a0b0000000" + "4" * 20, "colorspace": "bt709"}
            for i in range(2)
        ]
    )  # fmt: skip
    a, b = (VideoEntry.from_json(obj) for obj in json.loads(text))
    assert not hasattr(a, "__dict__")
    assert a.prefix is b.prefix and a.codec is b.codec and a.colorspace is b.colorspace
    assert VideoEntry.from_json(a.to_json()) == a
