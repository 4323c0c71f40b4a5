"""``ImageReader``: batches of cropped images from shards, archives and folders, decoded on a
persistent thread pool straight into one uint8 array."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from time import thread_time
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np

from kohakuclip.decode import avcodec_found
from kohakuclip.decode.image import (
    ImageDecoder,
    dct_denominator,
    output_shape,
    scaled_window,
    sniff_codec,
    stored_color,
)
from kohakuclip.decode.pixels import Crop, OutputMode, yuv_to_rgb_matrix
from kohakuclip.errors import KohakuClipError
from kohakuclip.plan_types import ClipPlan, GopRead
from kohakuclip.read._reader_base import (
    ReaderBase,
    Sources,
    merged_seconds,
    renamed,
    shown_sources,
)
from kohakuclip.read.image_crop import image_crop
from kohakuclip.read.pool import OwnedPool, Pending, Task
from kohakuclip.read.seeding import generator
from kohakuclip.storage.cache import BlockCache
from kohakuclip.storage.files import FileCache
from kohakuclip.storage.image_catalog import ImageCatalog
from kohakuclip.storage.image_listing import ImageSourceError
from kohakuclip.storage.image_resolve import ImageLocation
from kohakuclip.storage.remote import ObjectStoreError

if TYPE_CHECKING:
    from kohakuclip.decode._avcodec import Codec
    from kohakuclip.decode._clips import AvcodecClips, Dav1dClips, ShareTables

__all__ = ["ImageBatch", "ImageInfo", "ImageReadError", "ImageReader"]


ImageCropMode = Literal["random", "center", "resized"]


class ImageReadError(KohakuClipError, RuntimeError):
    """An image that could not be read; the message names the source and member."""


@dataclass(frozen=True)
class ImageInfo:
    """What the reader knows about one image."""

    width: int  # stored size
    height: int
    codec: str  # formats.IMAGE_CODECS name, or "other" (decoded by Pillow)
    size: int  # bytes in the source (for a deflated zip member: compressed)
    source: str
    member: str  # gulp sources: the video id
    frame: int | None = None  # gulp sources: the frame within the video
    meta: dict[str, Any] = field(default_factory=dict)  # caption and sidecar, or gulp meta_data


@dataclass
class ImageBatch:
    """Decoded images and what was done to them."""

    image: np.ndarray  # uint8 [N, 3, S, S] (rgb) or [N, S*S + 2*ceil(S/2)^2] (yuv modes)
    items: list[int]  # the image ids
    crops: np.ndarray  # int32 [N, 4]: x, y, w, h of the window in stored pixels
    flips: np.ndarray  # bool [N, 2]: horizontal, vertical
    colorspaces: list[str]  # per image: "rgb" (rgb mode), else the planes' "bt601" | "bt709"
    full_range: np.ndarray  # bool [N]: the planes are full range (yuv modes)
    mode: OutputMode = "rgb"  # what kohakuclip.torch.yuv_to_rgb needs
    item_keys: list[int] | None = None  # per image, the key of its crop and flips (submit)

    ids = renamed("ids", "items")

    @property
    def video(self) -> np.ndarray:
        """The pixels under the name the batch datasets share with clip batches."""
        return self.image


_MATRICES = {(c, f): yuv_to_rgb_matrix(c, f) for c in ("bt601", "bt709") for f in (False, True)}
_JPEG_MAX_SIDE = 65535  # a JPEG frame header's 16-bit width and height
_GRAY_PLANE_SIDE = 8192  # gray JPEGs larger than this (after the DCT shrink) take the PyAV path
_WEBP_ROW, _PNG_ROW = 4, 5  # their decoders' rows in the "avcodec" driver, after JPEG's four
_COMPILED_GROUP = 64  # images per compiled call: bounds the files of a folder open at once


def _compiled_codec(codec: str) -> bool:
    """Whether images of ``codec`` can take a compiled decoder here (its library found)."""
    if codec in ("jpeg", "webp", "png"):
        return avcodec_found()
    if codec == "av1":
        from kohakuclip.decode._dav1d import library

        return library() is not None
    return False


def _picture_plan(offset: int, size: int) -> ClipPlan:
    """One stored picture as a one-packet clip plan."""
    return ClipPlan([GopRead(offset, size, [(((0, size),), 0)])], {0: [0]}, 1, 1)


class _ImageWorker:
    """Per-thread state: the Python-path decoder and the compiled decoders, made on first use:
    libavcodec's JPEG (one per DCT scaling), WebP and PNG decoders, and libdav1d (AV1
    images)."""

    def __init__(self, size: int, mode: OutputMode, yuv_size: int) -> None:
        self.decoder = ImageDecoder(size, mode, yuv_size)
        self._compiled: dict[str, AvcodecClips | Dav1dClips] = {}
        self.seconds = {"read": 0.0, "decode": 0.0}  # the Python path (pixels within decode)

    def stage_seconds(self) -> dict[str, float]:
        """Thread CPU seconds per stage: the compiled calls and the Python path."""
        compiled = [driver.stage_seconds() for driver in self._compiled.values()]
        return merged_seconds(self.seconds, *compiled)

    def compiled(self, library: str) -> AvcodecClips | Dav1dClips:
        """The compiled decoder of ``library`` ("avcodec": JPEG at its DCT scalings, rows
        0-3, WebP, row 4, and PNG, row 5; "dav1d": AV1)."""
        driver = self._compiled.get(library)
        if driver is None:
            from kohakuclip.decode._clips import AvcodecClips, Dav1dClips

            if library == "dav1d":
                driver = Dav1dClips()
            else:
                jpeg: list[tuple[Codec, int]] = [("mjpeg", lowres) for lowres in range(4)]
                driver = AvcodecClips([*jpeg, ("webp", 0), ("png", 0)])
            self._compiled[library] = driver
        return driver


class ImageReader(ReaderBase[int, ImageBatch]):
    """Reads batches of images from KCIMG1 shards, plain zips (stored or deflated), tars,
    folder trees and GulpIO directories (one image per stored frame).

    Each image is cropped (``crop``: "random" or "center" short-side square, or "resized":
    RandomResizedCrop with ``scale`` and ``ratio``), resized to ``size``, flipped with
    probabilities ``hflip`` / ``vflip``, and written into one uint8 batch: planar RGB, or 4:2:0
    YUV planes for ``kohakuclip.torch.yuv_to_rgb`` to finish on the GPU ("yuv_resized": resized
    to ``size`` and flipped; "yuv": the window at stored resolution in the top-left of a
    ``yuv_size`` square, unflipped, so windows must fit in it). JPEG is shrunk in the DCT when
    the window allows (``dct_scale``; not in "yuv" mode). Decoding runs on ``threads`` threads;
    every random choice of a batch comes from its seed. Sources may be URLs (``s3://``,
    ``gs://``, ``az://``, ``http(s)://``, ``file://``; a URL ending in ``/`` lists the zip
    shards or images under it), read by ranged GETs.

    Args:
        sources: image shards, plain zips, tars, folder trees, GulpIO directories, a dataset
            view folder, or URLs; one or a sequence.
        size: output side in pixels (>= 2).
        threads: decoding threads (default 1; the ``kohakuclip.torch`` datasets share the
            usable CPUs by default).
        crop: ``random`` or ``center`` short-side square, or ``resized`` (RandomResizedCrop).
        scale: ``resized``: the range of the crop's area over the image's.
        ratio: ``resized``: the range of the crop's aspect ratio.
        hflip: probability of a horizontal flip per image.
        vflip: probability of a vertical flip per image.
        mode: ``rgb``, ``yuv_resized`` or ``yuv`` (see above).
        dct_scale: let JPEG decode at 1/4 or 1/8 scale when the window allows.
        seed: seeds ``sample`` and batches read without a seed (None: fresh entropy, another
            draw each run).
        yuv_size: ``yuv`` mode's square (>= 2).
        use_index: read a KCIMG1 shard's index member (False: list the zip).
        open_files: at most this many archive files held open.
        storage_options: keywords of the object store (as ``Reader``).
        cache_dir: a node-local block cache of what is fetched from URLs (as ``Reader``).
        cache_size: about the most bytes ``cache_dir`` holds (default 64 GiB).
    """

    _noun = "image"
    _catalog: ImageCatalog

    def __init__(
        self,
        sources: Sources,
        *,
        size: int = 256,
        threads: int = 1,
        crop: ImageCropMode = "random",
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        hflip: float = 0.0,
        vflip: float = 0.0,
        mode: OutputMode = "rgb",
        dct_scale: bool = True,
        seed: int | None = None,
        yuv_size: int = 512,
        use_index: bool = True,
        open_files: int = 4096,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_size: int = 64 << 30,
    ) -> None:
        super().__init__(
            size=size,
            mode=mode,
            threads=threads,
            crop=crop,
            crops=ImageCropMode,
            hflip=hflip,
            vflip=vflip,
            seed=seed,
        )
        if not isinstance(yuv_size, int) or yuv_size < 2:
            raise ValueError(f"yuv_size must be an int >= 2, got {yuv_size!r}")
        if not 0 < scale[0] <= scale[1] <= 1:
            raise ValueError(f"scale must satisfy 0 < min <= max <= 1, got {scale}")
        if not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"ratio must satisfy 0 < min <= max, got {ratio}")
        self.scale, self.ratio = (
            (float(scale[0]), float(scale[1])),
            (float(ratio[0]), float(ratio[1])),
        )
        self.dct_scale = dct_scale
        self.yuv_size = yuv_size
        cache = BlockCache(os.fspath(cache_dir), cache_size) if cache_dir else None
        self._catalog = ImageCatalog(self._paths(sources), use_index, storage_options, cache)
        if not len(self._catalog):
            raise ImageSourceError(f"{shown_sources(self._paths(sources))}: no images found")
        self._files = FileCache(open_files)
        # threads, decoders and descriptors end with close() or when the reader is collected
        self._pool = OwnedPool(self, threads, self._files.close)

    # -- catalog -----------------------------------------------------------------------------
    def info(self, image_id: int) -> ImageInfo:
        """Stored size, codec, bytes, source, member and metadata of one image (plain and gulp
        sources: the size read from the image's header).

        Args:
            image_id: the image id, in ``[0, len(reader))``.
        """
        image_id = self._check_id(image_id)
        loc = self._catalog.locate(image_id)
        width, height, codec = loc.width, loc.height, loc.codec
        if not codec or not width:
            _, files = self._ensure_process()
            try:
                data = ImageCatalog.read(loc, files)
                codec = codec or sniff_codec(data)
                width, height = ImageDecoder(2, "rgb").probe(data, codec)
            except (KohakuClipError, OSError) as e:
                reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
                raise ImageReadError(f"{self._where(image_id, loc)}: {reason}") from None
        size = loc.size if loc.size >= 0 else os.path.getsize(loc.path)  # local folder files
        record = self.metadata(image_id)
        meta = _as_dict(record["meta"])
        if record["caption"] is not None and "caption" not in meta:
            meta = {"caption": record["caption"], **meta}
        return ImageInfo(
            width,
            height,
            codec,
            size,
            self._catalog.source(image_id),
            self._catalog.member(image_id),
            self._catalog.frame(image_id),
            meta,
        )

    def metadata(self, image_id: int) -> dict[str, Any]:
        """``key``, ``caption`` and ``meta`` of one image, None where unknown: from the
        writer's manifest.parquet beside a shard (``meta``: the parsed json sidecar), or for a
        gulp frame its video's id and first meta_data dict (labels, fps ...).

        Args:
            image_id: the image id, in ``[0, len(reader))``.
        """
        return self._catalog.metadata(self._check_id(image_id))

    def origin(self, image_id: int) -> tuple[str, int]:
        """(source path, position in that source) of one image: for an indexed shard, the
        ``index`` of its manifest row.

        Args:
            image_id: the image id, in ``[0, len(reader))``.
        """
        image_id = self._check_id(image_id)
        return self._catalog.source(image_id), self._catalog.position(image_id)

    def sample(self, n: int, seed: int | None = None) -> list[int]:
        """``n`` image ids drawn uniformly (with replacement).

        Args:
            n: number of ids.
            seed: draws from this seed (None: the reader's generator).
        """
        rng = np.random.default_rng(seed) if seed is not None else self._rng
        return rng.integers(0, len(self), size=n).tolist()

    # -- reading -----------------------------------------------------------------------------
    def batch_shape(self, n_items: int) -> tuple[int, ...]:
        """Shape of the ``image`` array of a batch of ``n_items`` images.

        Args:
            n_items: images in the batch.
        """
        return (n_items, *output_shape(self.size, self.mode, self.yuv_size))

    def _forked(self) -> None:
        self._files.ensure_process()

    def _make_worker(self) -> Callable[[], _ImageWorker]:
        return partial(_ImageWorker, self.size, self.mode, self.yuv_size)

    def _file_cache(self) -> FileCache:
        return self._files

    def submit(
        self,
        items: Sequence[int],
        out: np.ndarray | None = None,
        seed: int | None = None,
        item_keys: Sequence[int] | None = None,
    ) -> Pending[ImageBatch]:
        """Queue a batch for decoding; returns at once.

        Args:
            items: the image ids of the batch.
            out: receives the pixels (optional; shape ``batch_shape``, uint8, C-contiguous).
            seed: image ``i`` takes its crop and flips from ``(seed, i)`` (drawn when None).
            item_keys: one int in ``[0, 2**64)`` per image: image ``i`` takes its crop and flips
                from ``item_keys[i]`` alone, whatever its position (``seed`` is then unused).
        """
        clean = [self._check_id(i) for i in items]
        if not clean:
            raise ValueError("a batch needs at least one image")
        out = self._buffers.batch(out, self.batch_shape(len(clean)))
        batch = ImageBatch(image=out, items=clean, **self._records(len(clean), item_keys))
        return self._dispatch(batch, len(clean), seed)

    def _tasks(
        self, batch: ImageBatch, shares: list[list[int]], seed: int, files: FileCache
    ) -> list[Task]:
        return [self._share_task(batch, s, seed, files) for s in shares]

    def _share_task(self, batch: ImageBatch, share: list[int], seed: int, files: FileCache) -> Any:
        """One thread's part of a batch: what the compiled path takes (JPEG, WebP, PNG, AV1)
        goes through compiled libavcodec / libdav1d, one call
        per ``_COMPILED_GROUP`` images (no GIL inside), the rest one by one. The first failing
        image's error is raised once the others are written."""

        def run(worker: _ImageWorker) -> None:
            errors: dict[int, BaseException] = {}
            later: dict[int, bytes | None] = {}
            for k in range(0, len(share), _COMPILED_GROUP):
                group = share[k : k + _COMPILED_GROUP]
                self._decode_compiled(worker, batch, group, seed, files, errors, later)

            def read_one(i: int) -> None:
                self._read_one(worker, batch, i, seed, files, later.pop(i))  # bytes freed when read

            self._finish_share(batch, list(later), read_one, errors)

        return run

    def _decode_compiled(
        self,
        worker: _ImageWorker,
        batch: ImageBatch,
        group: list[int],
        seed: int,
        files: FileCache,
        errors: dict[int, BaseException],
        later: dict[int, bytes | None],
    ) -> None:
        """Decode what the compiled path takes of ``group`` in one call; add the rest to
        ``later`` (for the Python path, with their bytes when they were fetched from object
        storage already) and failures to ``errors``. The files of a folder's images are open
        only while their group decodes."""
        from kohakuclip.decode import _clips  # numba loads with the first batch

        with ExitStack() as descriptors:
            tables: dict[str, ShareTables] = {}  # per compiled library: "avcodec", "dav1d"
            stored: dict[int, int] = {}  # position -> bytes the compiled path reads
            retried: set[int] = set()  # positions whose failures the Python path judges
            probed, fetched = self._probe_sizes(batch, group, files, descriptors)
            for i in group:
                try:
                    stored[i], retry = self._add_image(
                        batch, i, seed, files, descriptors, tables, probed.get(i), fetched.get(i)
                    )
                    if retry:
                        retried.add(i)
                except _NotCompiled:
                    later[i] = _body(fetched, i)
                except Exception as e:
                    errors[i] = e
            ready = {f.key: f.data for f in fetched.values() if f.key is not None}
            image = batch.image.reshape(len(batch.items), 1, -1)
            for library, share_tables in tables.items():
                try:
                    share_tables.fetch(ready)
                except ObjectStoreError:  # each image tries alone: local ones read, errors named
                    for i in share_tables.slots:
                        later[i] = _body(fetched, i)
                    continue
                status = worker.compiled(library).run(share_tables, image)
                for i, (code, detail, _) in zip(share_tables.slots, status.tolist()):
                    if code == _clips.OK:
                        self._add_counts(images=1, bytes_read=stored[i])
                    elif code == _clips.UNSUPPORTED_FORMAT or i in retried:
                        later[i] = _body(fetched, i)
                    else:
                        errors[i] = ImageReadError(_clips.describe(code, detail))

    def _item_error(self, batch: ImageBatch, i: int, error: BaseException) -> Exception:
        image_id = batch.items[i]
        where = self._where(image_id)
        return ImageReadError(f"{where}: {error}")

    def _geometry(
        self, batch: ImageBatch, i: int, seed: int, width: int, height: int
    ) -> tuple[Crop, bool, bool]:
        """Image ``i``'s crop and flips (from its own seeded draw), recorded in the batch."""
        rng = generator(seed, i) if batch.item_keys is None else generator(batch.item_keys[i])
        crop = image_crop(self.crop, width, height, rng, self.scale, self.ratio)
        hflip = bool(rng.random() < self.hflip)
        vflip = bool(rng.random() < self.vflip)
        batch.crops[i] = (crop.x, crop.y, crop.w, crop.h)
        batch.flips[i] = (hflip, vflip)
        return crop, hflip, vflip

    def _probe_sizes(
        self, batch: ImageBatch, share: list[int], files: FileCache, descriptors: ExitStack
    ) -> tuple[dict[int, _Header], dict[int, _Fetched]]:
        """Size, descriptor and stored bytes of the share's images whose source records no size
        (tar and plain zip members, gulp frames, image files in folders, locally or in object
        storage) and that are JPEGs the compiled path decodes, read from their headers in
        compiled calls (files of a folder are opened there too, and closed when ``descriptors``
        closes; objects are fetched first, and deflated zip members inflated, and their bytes
        returned by position, whatever they hold: both paths take them from there)."""
        if not (self._compiled and avcodec_found()):
            return {}, {}
        from kohakuclip.decode._inflate import zlib_found

        members: list[tuple[int, int, int, int]] = []  # (position, fd, offset, size)
        loose: list[tuple[int, str]] = []  # (position, path)
        remote: list[tuple[int, ImageLocation]] = []
        deflated: list[tuple[int, ImageLocation, int]] = []  # (position, location, fd)
        for i in share:
            try:
                loc = self._catalog.locate(batch.items[i])
                if loc.width != 0 or loc.codec not in ("", "jpeg", "png"):
                    continue
                if loc.compressed:
                    if loc.size > 0 and zlib_found():
                        local = loc.remote is None
                        fd = descriptors.enter_context(files.open(loc.path)) if local else -1
                        deflated.append((i, loc, fd))
                elif loc.remote is not None and loc.size > 0:
                    remote.append((i, loc))
                elif loc.remote is None and loc.size > 0:
                    fd = descriptors.enter_context(files.open(loc.path))
                    members.append((i, fd, loc.offset, loc.size))
                elif loc.remote is None and loc.size < 0 and loc.offset == 0:
                    loose.append((i, loc.path))
            except Exception:  # the other paths meet it again, and report it per image
                continue
        from kohakuclip.decode import _clips

        found: dict[int, _Header] = {}
        if members:
            positions, fds, offsets, sizes = zip(*members, strict=True)
            sized = _clips.picture_sizes(fds, offsets, sizes).tolist()
            for i, fd, size, (w, h, codec) in zip(positions, fds, sizes, sized, strict=True):
                found[i] = _Header(w, h, fd, size, _clips.PROBED_CODECS[codec])
        if loose:
            opened = _clips.open_picture_files([path for _, path in loose]).tolist()
            descriptors.callback(_clips.close_files, [row[2] for row in opened if row[2] >= 0])
            for (i, _), (w, h, fd, size, codec) in zip(loose, opened, strict=True):
                found[i] = _Header(w, h, fd, size, _clips.PROBED_CODECS[codec])
        fetched = self._probe_fetched(remote, deflated, found) if remote or deflated else {}
        headers = {
            i: header
            for i, header in found.items()
            if 0 < header.width <= _JPEG_MAX_SIDE and 0 < header.height <= _JPEG_MAX_SIDE
        }
        return headers, fetched

    @staticmethod
    def _probe_fetched(
        remote: list[tuple[int, ImageLocation]],
        deflated: list[tuple[int, ImageLocation, int]],
        found: dict[int, _Header],
    ) -> dict[int, _Fetched]:
        """Fetch the stored and deflated images in object storage (one round of concurrent
        ranged reads), inflate the deflated ones (local or fetched) and size all of them from
        their bytes into ``found``, in compiled calls; returns the bytes by position (inflated
        for deflated members). What fails to fetch or inflate is left to the Python path, which
        reports it."""
        from kohakuclip.decode import _clips
        from kohakuclip.storage.remote import gather_into

        wanted = []
        for loc in [loc for _, loc in remote] + [loc for _, loc, _ in deflated]:
            if loc.remote is not None:
                wanted.append((loc.remote, loc.offset, loc.offset + loc.size))
        try:
            buffer, starts = gather_into(wanted) if wanted else (np.zeros(0, np.uint8), [])
        except ObjectStoreError:
            deflated = [d for d in deflated if d[1].remote is None]
            remote, buffer, starts = [], np.zeros(0, np.uint8), []
        fetched: dict[int, _Fetched] = {}
        if remote:
            stored = len(remote)
            sizes = [loc.size for _, loc in remote]
            sized = _clips.picture_sizes([-1] * stored, starts[:stored], sizes, buffer).tolist()
            for (i, loc), (obj, offset, _), start, (w, h, codec) in zip(
                remote, wanted[:stored], starts[:stored], sized, strict=True
            ):
                found[i] = _Header(w, h, -1, loc.size, _clips.PROBED_CODECS[codec])
                fetched[i] = _Fetched(
                    (obj.url, offset, loc.size), buffer[start : start + loc.size].data
                )
        if deflated:
            fetched.update(_inflated(deflated, buffer, starts[len(remote) :], found))
        return fetched

    def _add_image(
        self,
        batch: ImageBatch,
        i: int,
        seed: int,
        files: FileCache,
        descriptors: ExitStack,
        tables: dict[str, ShareTables],
        probed: _Header | None = None,
        fetched: _Fetched | None = None,
    ) -> tuple[int, bool]:
        """Plan image ``i`` into the compiled tables of its codec's library (``tables``: JPEG
        and WebP through libavcodec, AV1 through libdav1d; made when first needed); returns
        the bytes it reads, and whether a failure there goes to the Python path to be judged
        (images sized from their headers, not an index; WebP and PNG, which Pillow may still
        read).
        Raises _NotCompiled for what the Python path takes (other codecs, deflated members not
        inflated already, sizes neither in the index nor ``probed`` from the JPEG's header).
        ``fetched``: its bytes from the probe (inflated ones are handed to the tables)."""
        loc = self._catalog.locate(batch.items[i])
        width, height, size = loc.width, loc.height, loc.size
        if probed is not None:
            width, height, size = probed.width, probed.height, probed.size
        inflated = fetched.data if fetched is not None and fetched.key is None else None
        codec = probed.codec if probed is not None else loc.codec
        stored = size > 0 and (inflated is not None or not loc.compressed) and width > 0
        if not (self._compiled and stored and _compiled_codec(codec)):
            raise _NotCompiled
        if width > _JPEG_MAX_SIDE or height > _JPEG_MAX_SIDE:
            raise ImageReadError(f"damaged index: an image of {width}x{height} pixels")
        crop, hflip, vflip = self._geometry(batch, i, seed, width, height)
        if self.mode == "yuv" and (crop.w > self.yuv_size or crop.h > self.yuv_size):
            raise ValueError(
                f"crop window {crop.w}x{crop.h} exceeds the {self.yuv_size}-pixel yuv window "
                "(use a larger yuv_size, or mode='yuv_resized')"
            )
        scaling = codec == "jpeg" and self.dct_scale and self.mode != "yuv"
        d = dct_denominator(width, height, crop, self.size) if scaling else 1
        window = scaled_window(width, height, crop, d)
        colorspace, full = stored_color(codec, loc.color)
        batch.colorspaces[i] = "rgb" if self.mode == "rgb" else colorspace
        batch.full_range[i] = self.mode != "rgb" and full
        library = "dav1d" if codec == "av1" else "avcodec"
        share_tables = tables.get(library)
        if share_tables is None:
            from kohakuclip.decode._clips import ShareTables

            share_tables = tables[library] = ShareTables(self.mode, self.size, self.yuv_size)
        if loc.remote is not None or inflated is not None:
            fd = -1
        elif probed is not None:
            fd = probed.fd
        else:
            fd = descriptors.enter_context(files.open(loc.path))
        share_tables.add(
            i,
            fd,
            _picture_plan(loc.offset, size),
            window,
            (hflip, vflip),
            _MATRICES[colorspace, full],
            decoder={"webp": _WEBP_ROW, "png": _PNG_ROW}.get(codec, d.bit_length() - 1),
            remote=loc.remote if inflated is None else None,
            picture=(-(-width // d), -(-height // d)),
            data=inflated,
        )
        if codec in ("jpeg", "png"):
            # the 128-filled chroma plane of gray pictures, sized from the index but bounded: a
            # damaged index must not allocate gigabytes (a larger gray picture takes PyAV)
            shrunk = [min(-(-side // d), _GRAY_PLANE_SIDE) for side in (height, width)]
            gray = share_tables.gray
            share_tables.gray = (max(gray[0], shrunk[0]), max(gray[1], shrunk[1]))
        retry = probed is not None or codec in ("webp", "png")
        return (size if inflated is None else loc.size), retry

    def _where(self, image_id: int, loc: ImageLocation | None = None) -> str:
        """How an error names the image: ``ImageCatalog.where``, or where a shard too broken
        to list has it (``loc``, else located here), or its source and position there."""
        try:
            return self._catalog.where(image_id)
        except Exception:
            pass
        try:
            return (loc or self._catalog.locate(image_id)).where
        except Exception:
            catalog = self._catalog
            return f"{catalog.source(image_id)}: image {catalog.position(image_id)}"

    def _read_one(
        self,
        worker: _ImageWorker,
        batch: ImageBatch,
        i: int,
        seed: int,
        files: FileCache,
        data: bytes | None = None,
    ) -> None:
        """One image through PyAV, libdav1d or Pillow (``data``: its bytes, when fetched or
        inflated already)."""
        decoder, seconds = worker.decoder, worker.seconds
        loc = self._catalog.locate(batch.items[i])
        start = thread_time()
        if data is None:
            data = ImageCatalog.read(loc, files)
        read = thread_time()
        seconds["read"] += read - start
        codec, width, height = loc.codec, loc.width, loc.height
        if not codec or not width:
            codec = codec or sniff_codec(data)
            width, height = decoder.probe(data, codec)
        crop, hflip, vflip = self._geometry(batch, i, seed, width, height)
        batch.colorspaces[i], batch.full_range[i] = decoder.write(
            data, codec, loc.color, width, height, crop, hflip, vflip, self.dct_scale,
            batch.image[i],
        )  # fmt: skip
        seconds["decode"] += thread_time() - read
        self._add_counts(images=1, bytes_read=len(data))

    def stats(self) -> dict[str, float]:
        """Counters since creation: images written and their stored bytes read, and CPU seconds
        per stage summed over threads (``seconds_read``, ``_decode``, ``_pixels``: resize +
        convert + flips of the compiled path; the other paths count their pixels in
        ``_decode``)."""
        return self._counters(("images", "bytes_read"))


class _NotCompiled(Exception):
    """An image the compiled path does not take."""


class _Fetched(NamedTuple):
    """An image's bytes from the probe: fetched from object storage, with their key for
    ``ShareTables.fetch`` (URL, offset, size), or inflated from a deflated zip member (no
    key: handed to the tables as they are)."""

    key: tuple[str, int, int] | None
    data: memoryview


def _inflated(
    deflated: list[tuple[int, ImageLocation, int]],
    source: np.ndarray,
    starts: list[int],
    found: dict[int, _Header],
) -> dict[int, _Fetched]:
    """Deflated zip members inflated (read with ``pread`` from their descriptor, or, for those
    in object storage, from ``source`` at ``starts``, in order) and sized into ``found``, in
    compiled calls; their inflated bytes by position. Members that fail are left out."""
    from kohakuclip.decode import _clips
    from kohakuclip.decode._inflate import inflate_members

    fetched_at = iter(starts)
    offsets = [loc.offset if loc.remote is None else next(fetched_at) for _, loc, _ in deflated]
    data, table = inflate_members(
        [fd for _, _, fd in deflated], offsets, [loc.size for _, loc, _ in deflated], source
    )
    done = [(i, int(start), int(length)) for (i, _, _), (start, length) in zip(
        deflated, table.tolist(), strict=True) if length > 0]  # fmt: skip
    if not done:
        return {}
    sized = _clips.picture_sizes([-1] * len(done), [d[1] for d in done], [d[2] for d in done], data)
    inflated: dict[int, _Fetched] = {}
    for (i, start, length), (w, h, codec) in zip(done, sized.tolist(), strict=True):
        found[i] = _Header(w, h, -1, length, _clips.PROBED_CODECS[codec])
        inflated[i] = _Fetched(None, data[start : start + length].data)
    return inflated


def _body(fetched: dict[int, _Fetched], i: int) -> bytes | None:
    """Image ``i``'s fetched (or inflated) bytes as a copy (none: neither), so that the
    probe's buffer can go."""
    return bytes(fetched[i].data) if i in fetched else None


class _Header(NamedTuple):
    """What the compiled path needs of an image its source gives no size for: the size from
    its JPEG or PNG header, the descriptor to read it from, its stored bytes and its codec."""

    width: int
    height: int
    fd: int
    size: int
    codec: str


def _as_dict(meta: Any) -> dict[str, Any]:
    """Metadata as a dict: a non-object json sidecar goes under "json"."""
    if meta is None:
        return {}
    return dict(meta) if isinstance(meta, dict) else {"json": meta}
