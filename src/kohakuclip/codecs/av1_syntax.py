"""AV1 bitstream syntax: OBUs, the sequence header and frame headers up to ``ref_frame_idx``.

Only what reference tracking needs is parsed (AV1 specification sections 5.3, 5.5 and 5.9.2):
which reference slots a frame reads and writes. ``RefState`` mirrors the decoder's per-slot
``RefValid`` / ``RefFrameType`` / ``RefOrderHint`` (sections 7.20 and 7.21) so that
``show_existing_frame`` of a key frame and ``frame_refs_short_signaling`` (section 7.8) are derived
the way a decoder derives them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from kohakuclip.errors import KohakuClipError

__all__ = [
    "ALL_SLOTS",
    "INTER_FRAME",
    "INTRA_ONLY_FRAME",
    "KEY_FRAME",
    "NUM_REF_FRAMES",
    "OBU_FRAME",
    "OBU_FRAME_HEADER",
    "OBU_PADDING",
    "OBU_REDUNDANT_FRAME_HEADER",
    "OBU_SEQUENCE_HEADER",
    "OBU_TEMPORAL_DELIMITER",
    "OBU_TILE_GROUP",
    "SWITCH_FRAME",
    "Av1ParseError",
    "FrameHeader",
    "OperatingPoint",
    "RefState",
    "SequenceHeader",
    "iter_obus",
    "parse_frame_header",
    "parse_sequence_header",
    "set_frame_refs",
]


class Av1ParseError(KohakuClipError, ValueError):
    """AV1 data that does not parse: truncated or corrupt OBUs or headers."""


OBU_SEQUENCE_HEADER = 1
OBU_TEMPORAL_DELIMITER = 2
OBU_FRAME_HEADER = 3
OBU_TILE_GROUP = 4
OBU_METADATA = 5
OBU_FRAME = 6
OBU_REDUNDANT_FRAME_HEADER = 7
OBU_TILE_LIST = 8
OBU_PADDING = 15

KEY_FRAME = 0
INTER_FRAME = 1
INTRA_ONLY_FRAME = 2
SWITCH_FRAME = 3

NUM_REF_FRAMES = 8
REFS_PER_FRAME = 7
ALL_SLOTS = (1 << NUM_REF_FRAMES) - 1

_SELECT = 2  # SELECT_SCREEN_CONTENT_TOOLS / SELECT_INTEGER_MV
_PRIMARY_REF_NONE = 7


class _Bits:
    """MSB-first bit reader over one OBU payload (the spec's f(n) and uvlc())."""

    __slots__ = ("_left", "_value")

    def __init__(self, data: bytes | memoryview) -> None:
        self._value = int.from_bytes(data, "big")
        self._left = len(data) * 8

    def f(self, n: int) -> int:
        left = self._left - n
        if left < 0:
            raise Av1ParseError("header ends before its last field")
        self._left = left
        return (self._value >> left) & ((1 << n) - 1)

    def uvlc(self) -> int:
        zeros = 0
        while not self.f(1):
            zeros += 1
            if zeros > 32:
                raise Av1ParseError("uvlc value longer than 32 bits")
        if zeros == 32:
            return (1 << 32) - 1
        return self.f(zeros) + (1 << zeros) - 1


class Obu(NamedTuple):
    """One OBU inside a buffer: its type, layer ids and byte ranges (header start, payload)."""

    type: int
    temporal_id: int
    spatial_id: int
    start: int  # first byte of the OBU header
    payload: int  # first byte of the payload
    end: int  # one past the last payload byte


def iter_obus(data: bytes | memoryview) -> Iterator[Obu]:
    """Split a buffer of low-overhead OBUs (an mp4 sample, av1C configOBUs) into OBUs."""
    n = len(data)
    pos = 0
    while pos < n:
        header = data[pos]
        if header & 0x80:
            raise Av1ParseError(f"OBU at byte {pos}: forbidden bit set")
        obu_type = (header >> 3) & 15
        at = pos + 1
        temporal_id = spatial_id = 0
        if header & 4:
            if at >= n:
                raise Av1ParseError(f"OBU at byte {pos}: truncated extension header")
            ext = data[at]
            temporal_id, spatial_id = ext >> 5, (ext >> 3) & 3
            at += 1
        if header & 2:
            size = 0
            for i in range(8):
                if at >= n:
                    raise Av1ParseError(f"OBU at byte {pos}: truncated obu_size")
                byte = data[at]
                at += 1
                size |= (byte & 0x7F) << (7 * i)
                if not byte & 0x80:
                    break
            else:
                raise Av1ParseError(f"OBU at byte {pos}: obu_size longer than 8 bytes")
            end = at + size
            if end > n:
                raise Av1ParseError(
                    f"OBU at byte {pos}: {size} payload bytes announced, {n - at} present"
                )
        else:
            end = n
        yield Obu(obu_type, temporal_id, spatial_id, pos, at, end)
        pos = end


@dataclass(frozen=True)
class OperatingPoint:
    idc: int  # operating_point_idc: temporal (bits 0-7) and spatial (bits 8-11) layers
    decoder_model_present: bool


@dataclass(frozen=True)
class SequenceHeader:
    """The sequence header fields frame-header parsing depends on, plus colour information."""

    profile: int
    still_picture: bool
    reduced_still_picture_header: bool
    max_width: int
    max_height: int
    decoder_model_info_present: bool
    equal_picture_interval: bool
    buffer_removal_time_length: int  # bits, when the decoder model is present
    frame_presentation_time_length: int  # bits, when the decoder model is present
    operating_points: tuple[OperatingPoint, ...]
    frame_id_numbers_present: bool
    frame_id_length: int  # idLen (bits of current_frame_id)
    delta_frame_id_length: int  # bits of delta_frame_id_minus_1
    enable_order_hint: bool
    order_hint_bits: int
    force_screen_content_tools: int  # 0, 1 or 2 (SELECT: signalled per frame)
    force_integer_mv: int  # 0, 1 or 2 (SELECT)
    bit_depth: int
    mono_chrome: bool
    subsampling_x: int
    subsampling_y: int
    color_primaries: int
    transfer_characteristics: int
    matrix_coefficients: int
    full_range: bool
    film_grain_params_present: bool


def parse_sequence_header(payload: bytes | memoryview) -> SequenceHeader:
    """Parse a sequence_header_obu() payload (spec 5.5)."""
    r = _Bits(payload)
    profile = r.f(3)
    still_picture = bool(r.f(1))
    reduced = bool(r.f(1))
    decoder_model = equal_interval = False
    removal_len = presentation_len = 0
    points: list[OperatingPoint] = []
    if reduced:
        r.f(5)  # seq_level_idx[0]
        points.append(OperatingPoint(0, False))
    else:
        if r.f(1):  # timing_info_present_flag
            r.f(32)  # num_units_in_display_tick
            r.f(32)  # time_scale
            equal_interval = bool(r.f(1))
            if equal_interval:
                r.uvlc()  # num_ticks_per_picture_minus_1
            decoder_model = bool(r.f(1))
            if decoder_model:
                delay_len = r.f(5) + 1
                r.f(32)  # num_units_in_decoding_tick
                removal_len = r.f(5) + 1
                presentation_len = r.f(5) + 1
        display_delay = r.f(1)
        for _ in range(r.f(5) + 1):
            idc = r.f(12)
            if r.f(5) > 7:  # seq_level_idx
                r.f(1)  # seq_tier
            present = False
            if decoder_model:
                present = bool(r.f(1))
                if present:
                    r.f(delay_len)  # decoder_buffer_delay
                    r.f(delay_len)  # encoder_buffer_delay
                    r.f(1)  # low_delay_mode_flag
            if display_delay and r.f(1):
                r.f(4)  # initial_display_delay_minus_1
            points.append(OperatingPoint(idc, present))
    width_bits = r.f(4) + 1
    height_bits = r.f(4) + 1
    max_width = r.f(width_bits) + 1
    max_height = r.f(height_bits) + 1
    frame_ids = False if reduced else bool(r.f(1))
    id_len = delta_len = 0
    if frame_ids:
        delta_len = r.f(4) + 2
        id_len = r.f(3) + 1 + delta_len
    r.f(3)  # use_128x128_superblock, enable_filter_intra, enable_intra_edge_filter
    order_hint = False
    order_hint_bits = 0
    screen_tools = integer_mv = _SELECT
    if not reduced:
        r.f(4)  # interintra, masked compound, warped motion, dual filter
        order_hint = bool(r.f(1))
        if order_hint:
            r.f(2)  # enable_jnt_comp, enable_ref_frame_mvs
        screen_tools = _SELECT if r.f(1) else r.f(1)
        if screen_tools > 0:
            integer_mv = _SELECT if r.f(1) else r.f(1)
        if order_hint:
            order_hint_bits = r.f(3) + 1
    r.f(3)  # enable_superres, enable_cdef, enable_restoration
    bit_depth, mono, ssx, ssy, primaries, transfer, matrix, full_range = _color_config(r, profile)
    film_grain = bool(r.f(1))
    return SequenceHeader(
        profile=profile,
        still_picture=still_picture,
        reduced_still_picture_header=reduced,
        max_width=max_width,
        max_height=max_height,
        decoder_model_info_present=decoder_model,
        equal_picture_interval=equal_interval,
        buffer_removal_time_length=removal_len,
        frame_presentation_time_length=presentation_len,
        operating_points=tuple(points),
        frame_id_numbers_present=frame_ids,
        frame_id_length=id_len,
        delta_frame_id_length=delta_len,
        enable_order_hint=order_hint,
        order_hint_bits=order_hint_bits,
        force_screen_content_tools=screen_tools,
        force_integer_mv=integer_mv,
        bit_depth=bit_depth,
        mono_chrome=mono,
        subsampling_x=ssx,
        subsampling_y=ssy,
        color_primaries=primaries,
        transfer_characteristics=transfer,
        matrix_coefficients=matrix,
        full_range=full_range,
        film_grain_params_present=film_grain,
    )


def _color_config(r: _Bits, profile: int) -> tuple[int, bool, int, int, int, int, int, bool]:
    """color_config() (spec 5.5.2): bit depth, mono, subsampling, CICP codes, range."""
    high = r.f(1)
    bit_depth = 10 if high else 8
    if profile == 2 and high and r.f(1):  # twelve_bit
        bit_depth = 12
    mono = False if profile == 1 else bool(r.f(1))
    primaries = transfer = matrix = 2  # unspecified
    if r.f(1):  # color_description_present_flag
        primaries, transfer, matrix = r.f(8), r.f(8), r.f(8)
    if mono:
        return bit_depth, True, 1, 1, primaries, transfer, matrix, bool(r.f(1))
    if (primaries, transfer, matrix) == (1, 13, 0):  # sRGB: 4:4:4, full range
        ssx = ssy = 0
        full_range = True
    else:
        full_range = bool(r.f(1))
        if profile == 0:
            ssx = ssy = 1
        elif profile == 1:
            ssx = ssy = 0
        elif bit_depth == 12:
            ssx = r.f(1)
            ssy = r.f(1) if ssx else 0
        else:
            ssx, ssy = 1, 0
        if ssx and ssy:
            r.f(2)  # chroma_sample_position
    r.f(1)  # separate_uv_delta_q
    return bit_depth, False, ssx, ssy, primaries, transfer, matrix, full_range


@dataclass(slots=True)
class FrameHeader:
    """The reference-relevant part of one uncompressed_header() (spec 5.9.2)."""

    show_existing_frame: bool
    frame_to_show_map_idx: int  # the shown slot, for show_existing_frame
    frame_type: int
    show_frame: bool
    showable_frame: bool
    error_resilient_mode: bool
    order_hint: int
    refresh_frame_flags: int
    ref_frame_idx: tuple[int, ...]  # 7 slots for inter frames, () otherwise
    short_signaling: bool  # ref_frame_idx derived by set_frame_refs() (spec 7.8)
    ref_order_hint: tuple[int, ...] | None  # error-resilient expected order hints per slot


class RefState:
    """The decoder's per-slot reference state that frame-header parsing depends on."""

    __slots__ = ("frame_type", "order_hint", "valid")

    def __init__(self) -> None:
        self.valid = [False] * NUM_REF_FRAMES
        self.frame_type = [KEY_FRAME] * NUM_REF_FRAMES
        self.order_hint = [0] * NUM_REF_FRAMES

    def update(self, hdr: FrameHeader) -> None:
        """Apply a parsed frame's effect on the slots (spec 7.20, and 7.21 for shown keys)."""
        if hdr.show_existing_frame:
            if hdr.frame_type == KEY_FRAME:
                hint = self.order_hint[hdr.frame_to_show_map_idx]
                self.valid = [True] * NUM_REF_FRAMES
                self.frame_type = [KEY_FRAME] * NUM_REF_FRAMES
                self.order_hint = [hint] * NUM_REF_FRAMES
            return
        if hdr.frame_type == KEY_FRAME and hdr.show_frame:
            self.valid = [False] * NUM_REF_FRAMES
            self.order_hint = [0] * NUM_REF_FRAMES
        if hdr.ref_order_hint is not None:
            for i, hint in enumerate(hdr.ref_order_hint):
                if hint != self.order_hint[i]:
                    self.valid[i] = False
                    self.order_hint[i] = hint
        flags = hdr.refresh_frame_flags
        for i in range(NUM_REF_FRAMES):
            if flags >> i & 1:
                self.valid[i] = True
                self.frame_type[i] = hdr.frame_type
                self.order_hint[i] = hdr.order_hint


def parse_frame_header(
    payload: bytes | memoryview,
    seq: SequenceHeader,
    refs: RefState,
    temporal_id: int = 0,
    spatial_id: int = 0,
) -> FrameHeader:
    """Parse the start of a frame_header_obu() / frame_obu() payload, up to ``ref_frame_idx``.

    ``refs`` is the slot state before this frame (it is not modified; call ``refs.update``).
    """
    limit = 320 if seq.decoder_model_info_present else 64  # the bits read come well before
    r = _Bits(payload[:limit] if len(payload) > limit else payload)
    timing = seq.decoder_model_info_present and not seq.equal_picture_interval
    if seq.reduced_still_picture_header:
        frame_type, show_frame, showable, error_resilient = KEY_FRAME, True, False, True
    else:
        if r.f(1):  # show_existing_frame
            slot = r.f(3)
            if timing:
                r.f(seq.frame_presentation_time_length)
            if seq.frame_id_numbers_present:
                r.f(seq.frame_id_length)  # display_frame_id
            frame_type = refs.frame_type[slot]
            refresh = ALL_SLOTS if frame_type == KEY_FRAME else 0
            hint = refs.order_hint[slot]
            return FrameHeader(
                True, slot, frame_type, True, False, False, hint, refresh, (), False, None
            )
        frame_type = r.f(2)
        show_frame = bool(r.f(1))
        if show_frame and timing:
            r.f(seq.frame_presentation_time_length)
        showable = frame_type != KEY_FRAME if show_frame else bool(r.f(1))
        if frame_type == SWITCH_FRAME or (frame_type == KEY_FRAME and show_frame):
            error_resilient = True
        else:
            error_resilient = bool(r.f(1))
    intra = frame_type in (KEY_FRAME, INTRA_ONLY_FRAME)
    r.f(1)  # disable_cdf_update
    screen_tools = seq.force_screen_content_tools
    if screen_tools == _SELECT:
        screen_tools = r.f(1)
    if screen_tools and seq.force_integer_mv == _SELECT:
        r.f(1)  # force_integer_mv
    if seq.frame_id_numbers_present:
        r.f(seq.frame_id_length)  # current_frame_id
    if frame_type != SWITCH_FRAME and not seq.reduced_still_picture_header:
        r.f(1)  # frame_size_override_flag
    order_hint = r.f(seq.order_hint_bits)
    if not (intra or error_resilient):
        r.f(3)  # primary_ref_frame
    if seq.decoder_model_info_present and r.f(1):  # buffer_removal_time_present_flag
        for op in seq.operating_points:
            if op.decoder_model_present:
                in_temporal = op.idc >> temporal_id & 1
                in_spatial = op.idc >> (spatial_id + 8) & 1
                if op.idc == 0 or (in_temporal and in_spatial):
                    r.f(seq.buffer_removal_time_length)
    if frame_type == SWITCH_FRAME or (frame_type == KEY_FRAME and show_frame):
        refresh = ALL_SLOTS
    else:
        refresh = r.f(8)
    ref_hints = [0] * NUM_REF_FRAMES if frame_type == KEY_FRAME and show_frame else refs.order_hint
    ref_order_hint = None
    if (not intra or refresh != ALL_SLOTS) and error_resilient and seq.enable_order_hint:
        ref_order_hint = tuple(r.f(seq.order_hint_bits) for _ in range(NUM_REF_FRAMES))
        ref_hints = list(ref_order_hint)
    ref_frame_idx: tuple[int, ...] = ()
    short = False
    if not intra:
        short = seq.enable_order_hint and bool(r.f(1))
        if short:
            last, gold = r.f(3), r.f(3)
            ref_frame_idx = set_frame_refs(last, gold, ref_hints, order_hint, seq.order_hint_bits)
        explicit = []
        for _ in range(REFS_PER_FRAME):
            if not short:
                explicit.append(r.f(3))
            if seq.frame_id_numbers_present:
                r.f(seq.delta_frame_id_length)  # delta_frame_id_minus_1
        if not short:
            ref_frame_idx = tuple(explicit)
    return FrameHeader(
        False,
        0,
        frame_type,
        show_frame,
        showable,
        error_resilient,
        order_hint,
        refresh,
        ref_frame_idx,
        short,
        ref_order_hint,
    )


def set_frame_refs(
    last_frame_idx: int,
    gold_frame_idx: int,
    ref_order_hint: list[int] | tuple[int, ...],
    order_hint: int,
    order_hint_bits: int,
) -> tuple[int, ...]:
    """ref_frame_idx[0..6] (LAST .. ALTREF) for frame_refs_short_signaling (spec 7.8)."""
    half = 1 << (order_hint_bits - 1)
    cur = half  # curFrameHint

    def shifted(hint: int) -> int:  # curFrameHint + get_relative_dist(hint, OrderHint)
        diff = hint - order_hint
        return cur + (diff & (half - 1)) - (diff & half)

    hints = [shifted(h) for h in ref_order_hint]
    refs = [-1] * REFS_PER_FRAME
    refs[0], refs[3] = last_frame_idx, gold_frame_idx  # LAST_FRAME, GOLDEN_FRAME
    used = [False] * NUM_REF_FRAMES
    used[last_frame_idx] = used[gold_frame_idx] = True

    def pick(backward: bool, latest: bool) -> int:
        best = -1
        for i, hint in enumerate(hints):
            if used[i] or (hint >= cur) != backward:
                continue
            if best < 0 or (hint >= hints[best] if latest else hint < hints[best]):
                best = i
        if best >= 0:
            used[best] = True
        return best

    refs[6] = pick(backward=True, latest=True)  # ALTREF_FRAME: furthest future frame
    refs[4] = pick(backward=True, latest=False)  # BWDREF_FRAME: closest future frame
    refs[5] = pick(backward=True, latest=False)  # ALTREF2_FRAME: next closest future frame
    for ref in (1, 2, 4, 5, 6):  # LAST2, LAST3, BWDREF, ALTREF2, ALTREF: latest past frames
        if refs[ref] < 0:
            refs[ref] = pick(backward=False, latest=True)
    earliest = -1
    for i, hint in enumerate(hints):
        if earliest < 0 or hint < hints[earliest]:
            earliest = i
    return tuple(earliest if ref < 0 else ref for ref in refs)
