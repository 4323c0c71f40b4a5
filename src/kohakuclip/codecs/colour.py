"""The colour matrix and range of a stored video: from the container, else from the bitstream,
else the usual guess by size.

A ``colr`` box (mp4) is read by ``mp4.moov``. Files without one often still declare their
matrix and range inside the stream (H.264 / HEVC VUI, AV1's sequence header, as encoders write
them): ``stream_colour`` decodes the first sample with PyAV and reads what the decoder
took from it. Sources that declare nothing anywhere are taken as BT.709 from 720p up and BT.601
below (``guessed_colorspace``), by readers and writers alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, cast

from kohakuclip.codecs.annexb import to_annexb

__all__ = [
    "HD_LONG_SIDE",
    "HD_SHORT_SIDE",
    "MATRIX_NAMES",
    "completed_colour",
    "guessed_colorspace",
    "is_hd",
    "stream_colour",
]

MATRIX_NAMES: dict[int, Literal["bt601", "bt709"]] = {1: "bt709", 5: "bt601", 6: "bt601"}
"""ISO/IEC 23091-2 (and AVColorSpace) matrix coefficients the readers convert: BT.709,
BT.470BG and SMPTE 170M (both BT.601)."""

HD_SHORT_SIDE = 720
HD_LONG_SIDE = 1280
_FULL_RANGE, _LIMITED_RANGE = 2, 1  # AVColorRange


def is_hd(width: int, height: int) -> bool:
    """The usual guess for untagged video: HD (BT.709) from 720p up, SD (BT.601) below."""
    return min(width, height) >= HD_SHORT_SIDE or max(width, height) >= HD_LONG_SIDE


def guessed_colorspace(width: int, height: int) -> Literal["bt601", "bt709"]:
    """The matrix of a video that declares none (``is_hd``)."""
    return "bt709" if is_hd(width, height) else "bt601"


def stream_colour(
    codec: str, prefix: bytes, sample: bytes | memoryview, nal_length_size: int
) -> tuple[Literal["bt601", "bt709"] | None, bool | None]:
    """The matrix and full-range flag the bitstream declares, from its first (key) sample.

    Args:
        codec: ``h264``, ``hevc`` or ``av1`` (any other gives ``(None, None)``).
        prefix: the track's parameter sets (Annex B; AV1: its configuration OBUs).
        sample: the first sample as stored (length-prefixed NAL units; AV1: OBUs).
        nal_length_size: the NAL length field size of H.264 / HEVC samples.

    Returns:
        ``(matrix, full_range)``; each None where the stream does not say (or does not decode).
    """
    import av

    try:
        if codec in ("h264", "hevc"):
            packet, name = prefix + to_annexb(sample, nal_length_size), codec
        elif codec == "av1":
            packet, name = prefix + bytes(sample), "libdav1d"
        else:
            return None, None
        context = cast(av.VideoCodecContext, av.CodecContext.create(name, "r"))
        frames = [*context.decode(av.Packet(packet)), *context.decode(None)]
    except (av.error.FFmpegError, ValueError):  # AnnexBError is a ValueError
        return None, None
    if not frames:
        return None, None
    frame = frames[0]
    matrix = MATRIX_NAMES.get(int(frame.colorspace))
    declared = int(frame.color_range)
    return matrix, (declared == _FULL_RANGE) if declared in (_FULL_RANGE, _LIMITED_RANGE) else None


def completed_colour(
    matrix: Literal["bt601", "bt709"] | None,
    full_range: bool | None,
    size: tuple[int, int],
    codec: str,
    prefix: bytes,
    first_sample: Callable[[], bytes | memoryview],
    nal_length_size: int,
) -> tuple[Literal["bt601", "bt709"], bool]:
    """The container's matrix and range, each completed from the stream where the container is
    silent (``stream_colour``), else by the size guess and limited range: what readers of raw
    files and the packer's index both record.

    Args:
        matrix: the ``colr`` box's matrix, or None.
        full_range: the ``colr`` box's range flag, or None (no box, or a QuickTime ``nclc``).
        size: the stored (width, height), for the guess.
        codec: as for ``stream_colour``.
        prefix: as for ``stream_colour``.
        first_sample: returns the first sample as stored; called only when the box is silent.
        nal_length_size: as for ``stream_colour``.

    Returns:
        ``(matrix, full_range)``.
    """
    if matrix is None or full_range is None:
        declared = stream_colour(codec, prefix, first_sample(), nal_length_size)
        matrix = declared[0] if matrix is None else matrix
        full_range = declared[1] if full_range is None else full_range
    return matrix or guessed_colorspace(*size), bool(full_range)
