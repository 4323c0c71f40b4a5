"""Write image shards: encode every source image, pack stored zips with a KCIMG1 index.

``write_images`` is the whole job (what ``kohakuclip-write-images`` runs): sources in order,
``workers`` threads preparing and encoding images (the heavy parts release the GIL), shards of
``per_shard`` images written under a temporary name and renamed when complete, each shard's
manifest rows saved right after it (in the hidden pending folder, with the settings), then
``manifest.parquet`` (one row per stored image), ``skipped.jsonl`` (one line per image left out,
with the reason) and ``encoding.json`` (the settings) beside them.

``part="I/N"`` stores only the I-th contiguous block of the images sorted by origin, into files
named after the part (``write.parts``; its record is ``part-...encoding.json``), so parts run
on many machines fill one folder; ``kohakuclip merge`` then writes the dataset view
(``ray=True`` runs every part as a Ray task and merges them: ``write.ray_launcher``). With
``resume=True`` a run (or part) whose record says it finished is kept as it is; an unfinished
one keeps its finished shards and encodes only the images they do not hold (those skipped
before them are tried again, so the skip log comes out whole). ``out_dir`` may be a URL prefix:
the run is built in a local staging folder and each shard uploaded once finished
(``write.upload``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
from collections import Counter, deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from kohakuclip._cpus import usable_cpus
from kohakuclip._progress import progress_bar
from kohakuclip.formats import ENCODING_FILE, IMAGE_CODECS, IMAGE_MANIFEST_SCHEMA, INDEX_MEMBER
from kohakuclip.storage.image_index import encode_image_index, image_records
from kohakuclip.storage.remote import is_store_failure
from kohakuclip.storage.zip import ZipWriter
from kohakuclip.write._atomic import (
    TEMP_SUFFIX,
    PendingFile,
    naming,
    replacing,
    write_atomically,
)
from kohakuclip.write.image_codecs import (
    INDEX_CODEC,
    Encoded,
    check_codec,
    encode_pixels,
)
from kohakuclip.write.image_prepare import Backend, ImageSkip, prepare
from kohakuclip.write.image_sources import SourceImage, iter_sources
from kohakuclip.write.parts import OutputNames, Part, earlier_run, left_to_do
from kohakuclip.write.shards import check_ray_options
from kohakuclip.write.upload import Output, WriteError, check_staging, output

__all__ = [
    "EncodedImage",
    "WriteSummary",
    "check_options",
    "encode_image",
    "pack_images",
    "write_images",
]


@dataclass(frozen=True)
class EncodedImage:
    """One image ready to pack (``pack_images``).

    Attributes:
        data: the encoded bytes.
        codec: the stored format (a name in ``formats.IMAGE_CODECS``).
        color: ``formats.COLOR_*`` flags.
        suffix: the member name's suffix (``.jpg``, ...).
        width: stored width.
        height: stored height.
        source_width: the upright source's width.
        source_height: the upright source's height.
        source_size: bytes of the source file.
    """

    data: bytes
    codec: str
    color: int
    suffix: str
    width: int
    height: int
    source_width: int
    source_height: int
    source_size: int


def encode_image(
    source: bytes | str | os.PathLike[str],
    *,
    codec: str = "jpeg",
    quality: int = 70,
    max_short: int = 512,
    min_short: int = 0,
    jpeg_encoder: str = "tuned",
    backend: Backend = "native",
) -> EncodedImage:
    """Prepare (orient, flatten, resize) and encode one image, as ``write_images`` stores it.

    Args:
        source: the image file's path, or its bytes.
        codec: the stored format: ``jpeg``, ``avif`` (or ``av1``), ``jxl`` or ``webp``.
        quality: encoder quality, 0-100.
        max_short: cap on the short side (0: none), never upscaled.
        min_short: an image whose short side is smaller is skipped.
        jpeg_encoder: ``tuned``, ``turbo`` or ``jpegli`` (see ``write_images``).
        backend: ``native`` or ``pillow`` decoding and resizing.

    Raises:
        ImageSkip: an image that would not be stored (``reason`` "too small", "corrupt" or
            "empty").
    """
    codec = check_options(quality, max_short, min_short, codec, jpeg_encoder)
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    else:
        with open(source, "rb") as f:
            data = f.read()
    prepared = prepare(data, max_short, min_short, backend)
    encoded: Encoded = encode_pixels(prepared.pixels, codec, quality, jpeg_encoder)
    height, width = prepared.pixels.shape[:2]
    return EncodedImage(
        encoded.data,
        encoded.codec,
        encoded.color,
        encoded.suffix,
        width,
        height,
        prepared.source_width,
        prepared.source_height,
        len(data),
    )


def check_options(
    quality: int, max_short: int, min_short: int, codec: str, jpeg_encoder: str
) -> str:
    """The stored codec's name; ValueError for a setting no encoder takes."""
    if not 0 <= quality <= 100:
        raise ValueError(f"quality must be in 0..100, got {quality}")
    if max_short < 0 or min_short < 0:
        raise ValueError(f"max_short and min_short must be >= 0, got {max_short}, {min_short}")
    return check_codec(codec, jpeg_encoder)


class _ShardWriter:
    """One zip shard being written under a temporary name."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._out = PendingFile(path)  # committed by finish, discarded by abort
        self._zip = ZipWriter(self._out.file)
        self._rows: list[tuple[int, int, int, int, int, int]] = []
        self._names: set[str] = set()

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, key: str, image: EncodedImage) -> str:
        """Store one image; returns its member name (made unique within the shard)."""
        name = key + image.suffix
        n = 1
        while name in self._names or name == INDEX_MEMBER:
            name = f"{key}_{n}{image.suffix}"
            n += 1
        self._names.add(name)
        with naming(self.path):
            offset = self._zip.add(name, image.data)
        codec = IMAGE_CODECS.index(image.codec)
        self._rows.append((offset, len(image.data), image.width, image.height, codec, image.color))
        return name

    def finish(self) -> None:
        """Append the index as the last member, close, rename into place."""
        records = image_records(len(self._rows))
        for i, (offset, size, width, height, codec, color) in enumerate(self._rows):
            records[i] = (offset, size, width, height, codec, color, b"\0\0")
        with naming(self.path):
            self._zip.add(INDEX_MEMBER, encode_image_index(records))
            self._zip.close()
        self._out.commit()

    def abort(self) -> None:
        """Drop the shard being written."""
        with contextlib.suppress(Exception):  # the temporary file is deleted either way
            self._zip.close()
        self._out.discard()


def pack_images(
    path: str | os.PathLike[str], images: Iterable[tuple[str, EncodedImage]]
) -> list[str]:
    """Write one shard (a stored zip with its KCIMG1 index) of encoded images.

    Args:
        path: the shard file; written under a temporary name and renamed when complete.
        images: ``(key, image)`` pairs, ``image`` from ``encode_image``; the member is the key
            with the codec's suffix (``_1``, ``_2``, ... before it for a repeated key).

    Returns:
        The member names, in order.
    """
    writer = _ShardWriter(os.fspath(path))
    try:
        names = [writer.add(key, image) for key, image in images]
        writer.finish()
    except BaseException:
        writer.abort()
        raise
    return names


@dataclass
class WriteSummary:
    """What a ``write_images`` job produced.

    Attributes:
        out_dir: the output folder (or URL prefix).
        shards: the shard files (URLs) of the run (part).
        images: images stored by the run (part), in the shards a resumed one kept too.
        skipped: images left out (listed in ``skipped.jsonl``).
        stored_bytes: bytes of the stored images.
        source_bytes: bytes of their sources.
    """

    out_dir: str
    shards: list[str] = field(default_factory=list)
    images: int = 0
    skipped: int = 0
    stored_bytes: int = 0
    source_bytes: int = 0


@dataclass(frozen=True)
class _Settings:
    codec: str
    quality: int
    max_short: int
    min_short: int
    jpeg_encoder: str
    backend: str
    per_shard: int


def _clean_key(key: str) -> str:
    while key.startswith(("./", "/")):
        key = key[2:] if key.startswith("./") else key[1:]
    return key or "image"


def _job(item: SourceImage, s: _Settings) -> EncodedImage | ImageSkip:
    try:
        data = item.read()
    except OSError as e:
        if is_store_failure(e):
            raise  # not the image's fault: a resumed run must retry it
        return ImageSkip("unreadable", str(e))
    try:
        return encode_image(
            data,
            codec=s.codec,
            quality=s.quality,
            max_short=s.max_short,
            min_short=s.min_short,
            jpeg_encoder=s.jpeg_encoder,
            backend=s.backend,  # type: ignore[arg-type]
        )
    except ImageSkip as skip:
        return skip
    except (ValueError, OSError, RuntimeError) as e:  # an encoder refusing this picture
        return ImageSkip("encode failed", f"{type(e).__name__}: {e}")


def _in_order(
    items: Iterator[SourceImage], settings: _Settings, workers: int
) -> Generator[tuple[SourceImage, EncodedImage | ImageSkip]]:
    """Encode on ``workers`` threads, yielding results in source order (bounded look-ahead);
    closing it early drops the images not started yet."""
    pool = ThreadPoolExecutor(workers, thread_name_prefix="kohakuclip-img")
    try:
        pending: deque[tuple[SourceImage, Future[EncodedImage | ImageSkip]]] = deque()
        for item in items:
            pending.append((item, pool.submit(_job, item, settings)))
            if len(pending) >= 4 * workers:
                done, future = pending.popleft()
                yield done, future.result()
        while pending:
            done, future = pending.popleft()
            yield done, future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def write_images(
    out_dir: str | os.PathLike[str],
    sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    quality: int = 70,
    max_short: int = 512,
    min_short: int = 384,
    per_shard: int = 10000,
    workers: int | None = None,
    codec: str = "jpeg",
    jpeg_encoder: str = "tuned",
    backend: Backend = "native",
    progress: bool = True,
    part: Part | str | None = None,
    resume: bool = False,
    staging: str | os.PathLike[str] | None = None,
    ray: bool = False,
    ray_parts: int | None = None,
) -> WriteSummary:
    """Encode every image of ``sources`` into stored zip shards (KCIMG1 index) in ``out_dir``,
    with ``manifest.parquet``, ``skipped.jsonl`` and ``encoding.json`` beside them.

    Args:
        out_dir: the output folder, or a URL prefix (``s3://bucket/prefix/`` ...): built in
            ``staging``, each shard uploaded once finished, the sidecars last (``write.upload``).
        sources: image files, folders (with ``.txt`` / ``.json`` sidecars), tars, zips; or
            their URLs (a prefix ending in ``/`` taken as a folder; see ``write.image_sources``);
            one of them alone, or several.
        quality: encoder quality, 0-100.
        max_short: cap on the short side (0: none), never upscaled.
        min_short: images whose short side is smaller are skipped.
        per_shard: images per shard.
        workers: encoding threads (default: the usable CPUs; with ``ray``: per task, default 1).
        codec: the stored format: ``jpeg``, ``avif`` (raw AV1 OBUs of an intra frame; ``av1``
            names it too), ``jxl`` (``kohakuclip[jxl]``) or ``webp``.
        jpeg_encoder: ``tuned`` (smallest at equal quality), ``turbo`` (fastest) or ``jpegli``
            (4:2:0 only, ``kohakuclip[jpegli]``).
        backend: ``native`` or ``pillow`` decoding and resizing.
        progress: show a progress bar.
        part: ``"I/N"`` or a ``Part``: store only the I-th of N contiguous blocks of the images
            sorted by origin, into files named after the part (``merge`` joins the parts).
        resume: continue an earlier run (part): one that finished is kept as it is, an
            unfinished one keeps its finished shards (of a URL output: those in the bucket,
            whatever ``staging``).
        staging: the local folder a URL output is built in (default: a temporary folder,
            removed afterwards; not with ``ray``: each task stages its part on its node).
        ray: run the job as Ray tasks, one per part, on the cluster ``RAY_ADDRESS`` names (or a
            local Ray), then ``merge`` them (``write.ray_launcher``); needs ``kohakuclip[ray]``.
        ray_parts: parts (tasks) for ``ray`` (default: the cluster's CPUs / ``workers``).

    Raises:
        WriteError: ``out_dir`` holds an earlier run (without ``resume``, or with other
            settings).
        ValueError: an invalid setting, or a codec whose package is missing.
        ObjectStoreError: a URL output that cannot be listed or written, a source URL whose
            store cannot be reached or that names no object.
    """
    codec = check_options(quality, max_short, min_short, codec, jpeg_encoder)
    if per_shard < 1:
        raise ValueError(f"per_shard must be >= 1, got {per_shard}")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if backend not in ("native", "pillow"):
        raise ValueError(f"unknown backend {backend!r}; one of native, pillow")
    out = os.fspath(out_dir)
    stage = os.fspath(staging) if staging is not None else None
    check_staging(out, stage)
    check_ray_options(ray, part, ray_parts, stage)
    settings = _Settings(codec, quality, max_short, min_short, jpeg_encoder, backend, per_shard)
    job = _ImageJob(settings, workers)
    if isinstance(sources, str | os.PathLike):
        sources = [sources]
    if ray:
        from kohakuclip.write.ray_launcher import write_images_on_ray

        return write_images_on_ray(out, list(sources), job, resume, progress, ray_parts)
    parsed = Part.parse(part) if part is not None else None
    return job.write(out, sources, parsed, resume, progress, stage)


@dataclass(frozen=True)
class _ImageJob:
    """The settings of one ``write_images`` job, shared by all of its parts (picklable: a Ray
    task gets a copy, ``write.ray_launcher``)."""

    settings: _Settings
    workers: int | None

    def write(
        self,
        out: str,
        sources: Iterable[str | os.PathLike[str]],
        part: Part | None,
        resume: bool,
        progress: bool,
        staging: str | None = None,
        on_item: Callable[[], None] | None = None,
    ) -> WriteSummary:
        """Write the whole job (``part`` None) or one part of it into ``out``: a folder, or a
        URL prefix built in ``staging`` (None: a temporary folder) and uploaded shard by
        shard. ``on_item`` is called after each image stored or skipped (Ray's progress)."""
        names = OutputNames(part)
        # every path checked (a part's images listed and selected) before the output is touched
        items = iter_sources(list(sources), part)
        run = (self.settings, names, self.workers or usable_cpus(), progress, resume, on_item)
        with output(out, staging, names, resume) as target:
            return _write_run(target, items, *run)


def _write_run(
    target: Output,
    items: Iterator[SourceImage],
    settings: _Settings,
    names: OutputNames,
    workers: int,
    progress: bool,
    resume: bool,
    on_item: Callable[[], None] | None,
) -> WriteSummary:
    """The run (part) ``names`` into ``target``'s folder: refused over another run, kept when
    it finished (``resume``), else written after the shards an unfinished one kept."""
    out = target.folder
    if os.path.exists(out) and not os.path.isdir(out):
        raise WriteError(f"{out}: exists and is not a folder")
    os.makedirs(out, exist_ok=True)
    if names.part is not None:
        _check_parts(target, names.part, settings)  # items: the part's only (iter_sources)
    _refuse_video_run(out)
    if resume:
        finished = _finished(target, names, settings)
        if finished is not None:
            _drop_pending(out, names)  # left by a kill after the record: stale
            return finished
    else:
        _refuse_earlier(out, names)
    summary, done = (
        _kept_shards(target, names, settings) if resume else (WriteSummary(target.name), Counter())
    )
    _clear(out, names, [os.path.basename(p) for p in summary.shards])
    todo = left_to_do(items, done, lambda item: item.origin)
    _encode(target, todo, settings, names, workers, progress, summary, on_item)
    target.drain()  # the pending files the last uploads send are removed next
    _finish_run(out, names, settings, summary)
    return summary


def _encode(
    target: Output,
    items: Iterator[SourceImage],
    settings: _Settings,
    names: OutputNames,
    workers: int,
    progress: bool,
    summary: WriteSummary,
    on_item: Callable[[], None] | None,
) -> None:
    """Encode ``items`` and pack them into shards after those in ``summary`` (which counts
    them); the skip log is renamed into place when every item is done. ``on_item`` is called
    after each item."""
    out = target.folder
    with (
        replacing(os.path.join(out, names.skipped)) as skipped,
        progress_bar(unit="img", disable=not progress, desc="images") as bar,
        contextlib.closing(_in_order(items, settings, workers)) as results,
    ):
        shard: _ShardWriter | None = None
        making = ""  # the shard being opened: an interrupt may land before ``shard`` is set
        rows: list[dict[str, Any]] = []
        try:
            for item, result in results:
                bar.update(1)
                if on_item is not None:
                    on_item()
                if isinstance(result, ImageSkip):
                    line = {"source": item.origin, "key": item.key, "reason": result.reason}
                    line["detail"] = result.detail
                    skipped.write((json.dumps(line, ensure_ascii=False) + "\n").encode())
                    summary.skipped += 1
                    continue
                if shard is None:
                    making = os.path.join(out, names.shard(len(summary.shards), "zip"))
                    shard = _ShardWriter(making)
                index = len(shard)
                member = shard.add(_clean_key(item.key), result)
                rows.append(_manifest_row(shard.path, index, item, member, result))
                summary.images += 1
                summary.stored_bytes += len(result.data)
                summary.source_bytes += result.source_size
                if len(shard) == settings.per_shard:
                    summary.shards.append(_close_shard(shard, rows, target, names, settings))
                    shard = None
            if shard is not None:
                summary.shards.append(_close_shard(shard, rows, target, names, settings))
                shard = None
        except BaseException:
            if shard is not None:
                shard.abort()
            elif making:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(making + TEMP_SUFFIX)
            raise


@contextlib.contextmanager
def _manifest_writer(file: BinaryIO) -> Iterator[pq.ParquetWriter]:
    """A manifest writer into ``file``, closed (its footer written) when the block ends; also
    when it raises, quietly, as ``file`` is then discarded (left open, the writer would try to
    close itself when collected, into a closed file)."""
    writer = pq.ParquetWriter(file, IMAGE_MANIFEST_SCHEMA)
    try:
        yield writer
    except BaseException:
        with contextlib.suppress(OSError):
            writer.close()
        raise
    writer.close()


def _check_parts(target: Output, part: Part, settings: _Settings) -> None:
    """Refuse to add a part to an output (a folder, or a URL prefix) where other parts split
    the job otherwise, or used other settings."""
    mine = asdict(settings)
    out = target.name
    records = target.read_beside(
        lambda name: name.startswith("part-") and name.endswith("." + ENCODING_FILE)
    )
    for name, data in records.items():
        other = json.loads(data)
        if other.get("parts") != part.count:
            theirs = other.get("parts")
            raise ValueError(f"{out}: {name} is one of {theirs} parts, not {part.count}")
        changed = [k for k, v in mine.items() if other.get(k) != v]
        if changed:
            raise ValueError(f"{out}: {name} was written with other {', '.join(changed)}")


def _refuse_video_run(out: str) -> None:
    """Refuse a folder where the video writer keeps a run (its ``encoding.json``, written
    first, says so): neither resuming nor starting over may touch its shards."""
    record = os.path.join(out, ENCODING_FILE)
    if not os.path.isfile(record):
        return
    try:
        with open(record, encoding="utf-8") as f:
            kept = json.load(f)
    except ValueError as e:
        raise WriteError(f"{record}: not a valid {ENCODING_FILE} ({e})") from None
    if isinstance(kept, dict) and "index_codec" not in kept:
        raise WriteError(f"{out}: holds the video writer's run ({record}); choose another folder")


def _refuse_earlier(out: str, names: OutputNames) -> None:
    """Without ``resume``, refuse a folder holding an earlier run's (part's) files, or, for a
    whole run, any writer's (``parts.earlier_run``): they would be overwritten."""
    found = earlier_run(os.listdir(out), names.part)
    if found is not None:
        what = "an earlier run" + ("" if names.part is None else f" of part {names.part}")
        raise WriteError(
            f"{out}: holds {what} ({found}); pass resume=True (--resume) to continue it, "
            "or choose another folder"
        )


def _finished(target: Output, names: OutputNames, settings: _Settings) -> WriteSummary | None:
    """The summary of a run (part) whose record says it finished and whose shards are kept;
    WriteError when it finished with other settings."""
    record = os.path.join(target.folder, names.record)
    if not os.path.isfile(record):
        return None
    with open(record, encoding="utf-8") as f:
        done = json.load(f)
    _refuse_other_settings(target, done, settings)
    shards = done.get("shards", [])
    manifest = os.path.join(target.folder, names.manifest)
    if not os.path.isfile(manifest) or not all(target.has_shard(n) for n in shards):
        return None
    return WriteSummary(
        target.name,
        [target.path_of(n) for n in shards],
        int(done.get("images", 0)),
        int(done.get("skipped", 0)),
        int(done.get("stored_bytes", 0)),
        int(done.get("source_bytes", 0)),
    )


def _refuse_other_settings(target: Output, recorded: dict[str, Any], settings: _Settings) -> None:
    """WriteError naming the settings that differ from those an earlier run recorded."""
    changed = [k for k, v in asdict(settings).items() if recorded.get(k) != v]
    if changed:
        raise WriteError(f"{target.name}: cannot resume with different {', '.join(changed)}")


def _kept_shards(
    target: Output, names: OutputNames, settings: _Settings
) -> tuple[WriteSummary, Counter[str]]:
    """The finished shards an unfinished run (part) left: from shard 0 on, while each has its
    manifest rows in the pending folder and is kept (in the folder, or in the bucket). Their
    summary and the sources they hold (none when the pending folder holds no settings);
    WriteError when it holds other settings."""
    out = target.folder
    summary, done = WriteSummary(target.name), Counter[str]()
    path = os.path.join(out, names.pending_settings)
    if not os.path.isfile(path):
        return summary, done
    with open(path, encoding="utf-8") as f:
        _refuse_other_settings(target, json.load(f), settings)
    for number in itertools.count():
        name = names.shard(number, "zip")
        rows = os.path.join(out, names.pending_rows(name))
        if not (os.path.isfile(rows) and target.has_shard(name)):
            break
        table = pq.read_table(rows, columns=["source", "bytes", "source_bytes"])
        summary.shards.append(target.path_of(name))
        summary.images += table.num_rows
        summary.stored_bytes += sum(table.column("bytes").to_pylist())
        summary.source_bytes += sum(table.column("source_bytes").to_pylist())
        done.update(table.column("source").to_pylist())  # a source given twice: twice
    return summary, done


def _clear(out: str, names: OutputNames, kept: list[str]) -> None:
    """Remove what an earlier, unfinished attempt of this run (part) left but its ``kept``
    shards: files half-written, its other shards, its record; with no shard kept, its pending
    folder too (the run starts over)."""
    pattern = names.shard_pattern("zip")
    for name in os.listdir(out):
        if names.temporary(name) or (pattern.match(name) and name not in kept):
            os.remove(os.path.join(out, name))
    record = os.path.join(out, names.record)
    if os.path.isfile(record):
        os.remove(record)
    if not kept:
        _drop_pending(out, names)


def _drop_pending(out: str, names: OutputNames) -> None:
    """Remove the run's pending folder, if any: once the record is written, ``merge`` takes
    a pending folder to mean the run did not finish."""
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(os.path.join(out, names.pending))


def _manifest_row(
    shard_path: str, index: int, item: SourceImage, member: str, image: EncodedImage
) -> dict[str, Any]:
    return {
        "shard": os.path.basename(shard_path),
        "index": index,
        "key": os.path.splitext(member)[0],
        "member": member,
        "bytes": len(image.data),
        "source_bytes": image.source_size,
        "width": image.width,
        "height": image.height,
        "source_width": image.source_width,
        "source_height": image.source_height,
        "native_res": (image.width, image.height) == (image.source_width, image.source_height),
        "caption": item.caption,
        "meta": item.meta,
        "source": item.origin,
    }


def _close_shard(
    shard: _ShardWriter,
    rows: list[dict[str, Any]],
    target: Output,
    names: OutputNames,
    settings: _Settings,
) -> str:
    """Finish ``shard``, save its manifest ``rows`` (and, beside the first, the settings) in
    the pending folder, and hand them to the output (a URL output uploads them); returns where
    the shard is."""
    shard.finish()
    name = os.path.basename(shard.path)
    _save_pending(target.folder, names, name, rows, settings)
    target.publish(name, [names.pending_settings, names.pending_rows(name)])
    rows.clear()
    return target.path_of(name)


def _save_pending(
    out: str, names: OutputNames, shard: str, rows: list[dict[str, Any]], settings: _Settings
) -> None:
    """The finished ``shard``'s manifest ``rows`` in the pending folder, with the settings
    (once) that ``_kept_shards`` checks a resumed run against."""
    os.makedirs(os.path.join(out, names.pending), exist_ok=True)
    kept = os.path.join(out, names.pending_settings)
    if not os.path.exists(kept):
        write_atomically(kept, json.dumps(asdict(settings), indent=2).encode())
    path = os.path.join(out, names.pending_rows(shard))
    with replacing(path) as f, naming(path):
        pq.write_table(pa.Table.from_pylist(rows, schema=IMAGE_MANIFEST_SCHEMA), f)


def _finish_run(out: str, names: OutputNames, settings: _Settings, summary: WriteSummary) -> None:
    """The run's manifest (from its shards' pending rows), then its record (which says it
    finished); the pending folder is then removed."""
    _write_manifest(out, names, summary.shards)
    record = _encoding_record(settings, summary, names.part)
    text = json.dumps(record, indent=2) + "\n"
    write_atomically(os.path.join(out, names.record), text.encode())
    shutil.rmtree(os.path.join(out, names.pending), ignore_errors=True)


def _write_manifest(out: str, names: OutputNames, shards: list[str]) -> None:
    """The run's manifest from its ``shards``' pending rows, in order (a row group each)."""
    with (
        replacing(os.path.join(out, names.manifest)) as f,
        _manifest_writer(f) as manifest,
    ):
        for shard in shards:
            rows = os.path.join(out, names.pending_rows(os.path.basename(shard)))
            manifest.write_table(pq.read_table(rows, schema=IMAGE_MANIFEST_SCHEMA))


def _encoding_record(
    settings: _Settings, summary: WriteSummary, part: Part | None
) -> dict[str, Any]:
    import PIL
    import simplejpeg

    from kohakuclip import __version__

    record: dict[str, Any] = asdict(settings)
    record["index_codec"] = INDEX_CODEC[settings.codec]
    record["jpeg"] = {
        "subsampling": "4:2:0" if settings.jpeg_encoder == "jpegli" else "4:4:4",
        "baseline": True,
    }
    record["resize"] = "lanczos3, short side capped, never upscaled"
    record["versions"] = {
        "kohakuclip": __version__,
        "pillow": PIL.__version__,
        "simplejpeg": simplejpeg.__version__,
    }
    record["images"] = summary.images
    record["skipped"] = summary.skipped
    record["stored_bytes"] = summary.stored_bytes
    record["source_bytes"] = summary.source_bytes
    if part is not None:
        record["part"] = part.index
        record["parts"] = part.count
    record["shards"] = [os.path.basename(p) for p in summary.shards]
    return record
