"""H.264 / HEVC NAL unit headers: which samples no later picture references.

A decoder can skip such a sample when its frame is not wanted: nothing decoded after it reads
its pixels, and neither codec's picture order count or frame numbering depends on it (H.264
derives both from reference pictures only; HEVC from the previous TemporalId-0 picture that
is not a sub-layer non-reference, RASL or RADL picture).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kohakuclip.codecs.annexb import nal_units

__all__ = ["highest_temporal_id", "is_reference", "keep_sizes"]


_H264_VCL = frozenset(range(1, 6))  # coded slices (5: IDR)
_H264_PARAMETER_SETS = frozenset({7, 8, 13, 15})  # SPS, PPS, SPS extension, subset SPS
_HEVC_SUB_LAYER_NON_REFERENCE = frozenset({0, 2, 4, 6, 8, 10, 12, 14})
"""TRAIL_N, TSA_N, STSA_N, RADL_N, RASL_N, RSV_VCL_N10/12/14."""
_HEVC_PARAMETER_SETS = frozenset({32, 33, 34})  # VPS, SPS, PPS
_HEVC_SPS = 33


def _h264_is_reference(units: list[memoryview]) -> bool:
    has_slice = False
    for unit in units:
        kind = unit[0] & 0x1F
        if kind in _H264_PARAMETER_SETS:
            return True
        if kind in _H264_VCL:
            if unit[0] & 0x60:  # nal_ref_idc
                return True
            has_slice = True
    return not has_slice


def _hevc_is_reference(units: list[memoryview], highest_tid: int) -> bool:
    has_slice = False
    for unit in units:
        if len(unit) < 2:
            continue
        kind = (unit[0] >> 1) & 0x3F
        if kind in _HEVC_PARAMETER_SETS:
            return True
        if kind < 32:
            temporal_id = (unit[1] & 7) - 1
            # A sub-layer non-reference picture may still be referenced by higher sub-layers.
            if kind not in _HEVC_SUB_LAYER_NON_REFERENCE or temporal_id < highest_tid:
                return True
            has_slice = True
    return not has_slice


def is_reference(
    sample: bytes | bytearray | memoryview,
    codec: str,
    nal_length_size: int,
    highest_tid: int = 0,
    where: str = "",
) -> bool:
    """Whether a later picture may reference this length-prefixed sample.

    False only when the sample has slices and every one is non-reference (H.264:
    ``nal_ref_idc == 0``; HEVC: a sub-layer non-reference type in the stream's highest
    sub-layer ``highest_tid``, see ``highest_temporal_id``). Samples carrying parameter sets,
    or no slice at all, count as references.
    """
    units = [unit for unit in nal_units(sample, nal_length_size, where) if len(unit)]
    if codec == "h264":
        return _h264_is_reference(units)
    if codec == "hevc":
        return _hevc_is_reference(units, highest_tid)
    raise ValueError(f"{where or '<sample>'}: is_reference reads h264 or hevc, not {codec!r}")


def highest_temporal_id(parameter_sets: bytes) -> int:
    """HEVC: the highest TemporalId (``sps_max_sub_layers_minus1``) of the first SPS.

    ``parameter_sets`` is Annex B (``Mp4Track.prefix``); 0 when it holds no SPS.
    """
    for unit in parameter_sets.split(b"\x00\x00\x01")[1:]:
        if len(unit) >= 3 and (unit[0] >> 1) & 0x3F == _HEVC_SPS:
            return (unit[2] >> 1) & 7
    return 0


def keep_sizes(
    samples: Sequence[bytes | bytearray | memoryview],
    codec: str,
    nal_length_size: int,
    parameter_sets: bytes,
    keyframes: np.ndarray,
    where: str = "",
) -> np.ndarray:
    """The ``keep`` column of a video: each sample's size, 0 for the non-keyframe samples no
    later picture references (``is_reference``), which a clip that does not want them skips.

    Args:
        samples: the video's length-prefixed samples, in decode order.
        codec: ``h264`` or ``hevc``.
        nal_length_size: bytes of each NAL unit's length prefix.
        parameter_sets: the stream's Annex B parameter sets (HEVC: its highest TemporalId).
        keyframes: bool per sample.
        where: how errors name the video.
    """
    tid = highest_temporal_id(parameter_sets) if codec == "hevc" else 0
    keep = np.array([len(s) for s in samples], np.uint32)
    for i, sample in enumerate(samples):
        if not keyframes[i] and not is_reference(sample, codec, nal_length_size, tid, where):
            keep[i] = 0
    return keep
