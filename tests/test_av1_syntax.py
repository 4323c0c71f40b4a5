"""AV1 syntax parsing: OBUs, sequence headers (checked against FFmpeg's own AV1 parser through
the trace_headers bitstream filter), frame-header prefixes and the short-signalling derivation."""

from __future__ import annotations

import dataclasses

import av
import av.logging
import pytest
from av.bitstream import BitStreamFilterContext
from hypothesis import given, settings
from hypothesis import strategies as st

from kohakuclip.codecs.av1_syntax import (
    INTER_FRAME,
    INTRA_ONLY_FRAME,
    KEY_FRAME,
    OBU_FRAME,
    OBU_PADDING,
    OBU_SEQUENCE_HEADER,
    OBU_TEMPORAL_DELIMITER,
    SWITCH_FRAME,
    Av1ParseError,
    FrameHeader,
    OperatingPoint,
    RefState,
    SequenceHeader,
    iter_obus,
    parse_frame_header,
    parse_sequence_header,
    set_frame_refs,
)


class BitWriter:
    """MSB-first bit writer for building headers field by field, as the spec lists them."""

    def __init__(self) -> None:
        self.bits: list[int] = []

    def put(self, value: int, n: int) -> None:
        assert 0 <= int(value) < (1 << n), (value, n)
        self.bits += [(int(value) >> (n - 1 - i)) & 1 for i in range(n)]

    def uvlc(self, value: int) -> None:
        n = (value + 1).bit_length() - 1
        self.put(0, n)
        self.put(value + 1, n + 1)

    def payload(self, trailing: bool = True) -> bytes:
        bits = list(self.bits)
        if trailing:
            bits.append(1)
        bits += [0] * (-len(bits) % 8)
        return bytes(int("".join(map(str, bits[i : i + 8])), 2) for i in range(0, len(bits), 8))


def obu(obu_type: int, payload: bytes, extension: int | None = None, sized: bool = True) -> bytes:
    head = bytes([obu_type << 3 | (4 if extension is not None else 0) | (2 if sized else 0)])
    if extension is not None:
        head += bytes([extension])
    if sized:
        size, leb = len(payload), bytearray()
        while True:
            leb.append(size & 0x7F | (0x80 if size >= 0x80 else 0))
            size >>= 7
            if not size:
                break
        head += bytes(leb)
    return head + payload


# --- OBUs -----------------------------------------------------------------------------------


def test_iter_obus_sizes_extensions_and_unsized_last():
    big = bytes(range(200))  # obu_size needs two leb128 bytes
    data = (
        obu(OBU_TEMPORAL_DELIMITER, b"")
        + obu(OBU_PADDING, big, extension=(5 << 5) | (2 << 3))
        + obu(OBU_FRAME, b"\x01\x02\x03", sized=False)
    )
    obus = list(iter_obus(data))
    assert [o.type for o in obus] == [OBU_TEMPORAL_DELIMITER, OBU_PADDING, OBU_FRAME]
    td, pad, frame = obus
    assert (td.start, td.payload, td.end) == (0, 2, 2)
    assert (pad.temporal_id, pad.spatial_id) == (5, 2)
    assert data[pad.payload : pad.end] == big and pad.payload == td.end + 4
    assert data[frame.payload : frame.end] == b"\x01\x02\x03" and frame.end == len(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x80\x00", "forbidden bit"),
        (obu(OBU_FRAME, b"abcdef")[:-2], "6 payload bytes announced, 4 present"),
        (bytes([OBU_FRAME << 3 | 2]) + b"\x85", "truncated obu_size"),
        (bytes([OBU_FRAME << 3 | 2]) + b"\x80" * 9, "longer than 8 bytes"),
        (bytes([OBU_FRAME << 3 | 4]), "truncated extension"),
    ],
)
def test_iter_obus_rejects_corrupt_data(data, message):
    with pytest.raises(Av1ParseError, match=message):
        list(iter_obus(data))


# --- sequence headers -----------------------------------------------------------------------


@st.composite
def sequence_headers(draw) -> tuple[bytes, SequenceHeader]:
    """A random valid sequence_header_obu() payload and the fields it encodes."""
    w = BitWriter()
    b = st.booleans()
    profile = draw(st.integers(0, 2))
    reduced = draw(b)
    still = reduced or draw(b)
    w.put(profile, 3)
    w.put(still, 1)
    w.put(reduced, 1)
    decoder_model = equal = False
    removal = presentation = 0
    points = []
    if reduced:
        w.put(draw(st.integers(0, 31)), 5)
        points.append(OperatingPoint(0, False))
    else:
        timing = draw(b)
        w.put(timing, 1)
        if timing:
            w.put(draw(st.integers(1, 2**32 - 1)), 32)
            w.put(draw(st.integers(1, 2**32 - 1)), 32)
            equal = draw(b)
            w.put(equal, 1)
            if equal:
                w.uvlc(draw(st.integers(0, 2**32 - 2)))
            decoder_model = draw(b)
            w.put(decoder_model, 1)
            if decoder_model:
                delay = draw(st.integers(1, 32))
                removal, presentation = draw(st.integers(1, 32)), draw(st.integers(1, 32))
                w.put(delay - 1, 5)
                w.put(draw(st.integers(1, 2**32 - 1)), 32)
                w.put(removal - 1, 5)
                w.put(presentation - 1, 5)
        display_delay = draw(b)
        w.put(display_delay, 1)
        count = draw(st.integers(1, 4))
        w.put(count - 1, 5)
        for _ in range(count):
            idc, level = draw(st.integers(0, 4095)), draw(st.integers(0, 31))
            w.put(idc, 12)
            w.put(level, 5)
            if level > 7:
                w.put(draw(b), 1)
            present = decoder_model and draw(b)
            if decoder_model:
                w.put(present, 1)
                if present:
                    w.put(draw(st.integers(0, 2**delay - 1)), delay)
                    w.put(draw(st.integers(0, 2**delay - 1)), delay)
                    w.put(draw(b), 1)
            if display_delay:
                has = draw(b)
                w.put(has, 1)
                if has:
                    w.put(draw(st.integers(0, 15)), 4)
            points.append(OperatingPoint(idc, present))
    width_bits, height_bits = draw(st.integers(1, 16)), draw(st.integers(1, 16))
    max_w, max_h = draw(st.integers(1, 2**width_bits)), draw(st.integers(1, 2**height_bits))
    w.put(width_bits - 1, 4)
    w.put(height_bits - 1, 4)
    w.put(max_w - 1, width_bits)
    w.put(max_h - 1, height_bits)
    frame_ids = not reduced and draw(b)
    id_len = delta_len = 0
    if not reduced:
        w.put(frame_ids, 1)
    if frame_ids:
        delta_len = draw(st.integers(2, 14))
        id_len = draw(st.integers(delta_len + 1, min(16, delta_len + 8)))
        w.put(delta_len - 2, 4)
        w.put(id_len - delta_len - 1, 3)
    w.put(draw(st.integers(0, 7)), 3)
    order_hint, order_bits, sct, imv = False, 0, 2, 2
    if not reduced:
        w.put(draw(st.integers(0, 15)), 4)
        order_hint = draw(b)
        w.put(order_hint, 1)
        if order_hint:
            w.put(draw(st.integers(0, 3)), 2)
        sct = draw(st.integers(0, 2))
        w.put(sct == 2, 1)
        if sct < 2:
            w.put(sct, 1)
        if sct > 0:
            imv = draw(st.integers(0, 2))
            w.put(imv == 2, 1)
            if imv < 2:
                w.put(imv, 1)
        if order_hint:
            order_bits = draw(st.integers(1, 8))
            w.put(order_bits - 1, 3)
    w.put(draw(st.integers(0, 7)), 3)
    # color_config()
    high = draw(b)
    w.put(high, 1)
    if profile == 2 and high:
        twelve = draw(b)
        w.put(twelve, 1)
        depth = 12 if twelve else 10
    else:
        depth = 10 if high else 8
    mono = profile != 1 and draw(b)
    if profile != 1:
        w.put(mono, 1)
    srgb_ok = not mono and (profile == 1 or (profile == 2 and depth == 12))
    codes = st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255))
    if srgb_ok:
        codes = st.one_of(st.just((1, 13, 0)), codes)
    described = draw(b)
    w.put(described, 1)
    cp, tc, mc = (
        draw(codes.filter(lambda c: c != (1, 13, 0) or srgb_ok)) if described else (2, 2, 2)
    )
    if described:
        w.put(cp, 8)
        w.put(tc, 8)
        w.put(mc, 8)
    if mono:
        full, ssx, ssy = draw(b), 1, 1
        w.put(full, 1)
    elif (cp, tc, mc) == (1, 13, 0):
        full, ssx, ssy = True, 0, 0
        w.put(draw(b), 1)  # separate_uv_delta_q
    else:
        full = draw(b)
        w.put(full, 1)
        if profile == 0:
            ssx = ssy = 1
        elif profile == 1:
            ssx = ssy = 0
        elif depth == 12:
            ssx = draw(st.integers(0, 1))
            ssy = draw(st.integers(0, 1)) if ssx else 0
            w.put(ssx, 1)
            if ssx:
                w.put(ssy, 1)
        else:
            ssx, ssy = 1, 0
        if ssx and ssy:
            w.put(draw(st.integers(0, 2)), 2)  # chroma_sample_position (3 is reserved)
        w.put(draw(b), 1)  # separate_uv_delta_q
    grain = draw(b)
    w.put(grain, 1)
    expected = SequenceHeader(
        profile=profile,
        still_picture=still,
        reduced_still_picture_header=reduced,
        max_width=max_w,
        max_height=max_h,
        decoder_model_info_present=decoder_model,
        equal_picture_interval=equal,
        buffer_removal_time_length=removal,
        frame_presentation_time_length=presentation,
        operating_points=tuple(points),
        frame_id_numbers_present=frame_ids,
        frame_id_length=id_len,
        delta_frame_id_length=delta_len,
        enable_order_hint=order_hint,
        order_hint_bits=order_bits,
        force_screen_content_tools=sct,
        force_integer_mv=imv,
        bit_depth=depth,
        mono_chrome=mono,
        subsampling_x=ssx,
        subsampling_y=ssy,
        color_primaries=cp,
        transfer_characteristics=tc,
        matrix_coefficients=mc,
        full_range=full,
        film_grain_params_present=grain,
    )
    return w.payload(), expected


def ffmpeg_trace(packets: list[bytes]) -> tuple[list[dict[str, int]], list[str]]:
    """FFmpeg's AV1 parser (CBS, via trace_headers): one dict of syntax elements per sequence
    or frame header, and any error messages."""
    sections: list[dict[str, int]] = []
    errors = []
    previous = av.logging.get_level()
    av.logging.set_level(av.logging.INFO)
    try:
        with av.logging.Capture() as logs:
            bsf = BitStreamFilterContext("trace_headers", "av1")
            for data in packets:
                bsf.filter(av.Packet(data))
            bsf.filter(None)
    finally:
        av.logging.set_level(previous)
    for level, _name, line in logs:
        if level <= av.logging.ERROR:
            errors.append(line)
        elif line.strip() in ("Sequence Header", "Frame Header"):
            sections.append({"_kind": line.strip()})  # type: ignore[dict-item]
        elif sections and " = " in line:
            fields = line.split()
            sections[-1][fields[1]] = int(fields[-1])
    return sections, errors


@settings(max_examples=120, deadline=None)
@given(sequence_headers())
def test_sequence_header_matches_ffmpeg(case):
    payload, expected = case
    assert parse_sequence_header(payload) == expected
    (cbs,), errors = ffmpeg_trace([obu(OBU_SEQUENCE_HEADER, payload)])
    assert not errors
    # fields a reduced still-picture header leaves out are inferred as 0
    assert cbs.get("frame_id_numbers_present_flag", 0) == expected.frame_id_numbers_present
    assert cbs.get("enable_order_hint", 0) == expected.enable_order_hint
    if expected.enable_order_hint:
        assert cbs["order_hint_bits_minus_1"] + 1 == expected.order_hint_bits
    assert cbs["max_frame_width_minus_1"] + 1 == expected.max_width
    assert cbs["max_frame_height_minus_1"] + 1 == expected.max_height
    assert cbs["film_grain_params_present"] == expected.film_grain_params_present
    assert cbs["trailing_one_bit"] == 1
    if expected.decoder_model_info_present:
        assert cbs["buffer_removal_time_length_minus_1"] + 1 == expected.buffer_removal_time_length


def test_sequence_header_truncated():
    with pytest.raises(Av1ParseError, match="ends before"):
        parse_sequence_header(b"\x00\x00")


# --- frame headers --------------------------------------------------------------------------


def _sequence(**changes) -> SequenceHeader:
    base = SequenceHeader(
        profile=0,
        still_picture=False,
        reduced_still_picture_header=False,
        max_width=64,
        max_height=64,
        decoder_model_info_present=False,
        equal_picture_interval=False,
        buffer_removal_time_length=0,
        frame_presentation_time_length=0,
        operating_points=(OperatingPoint(0, False),),
        frame_id_numbers_present=False,
        frame_id_length=0,
        delta_frame_id_length=0,
        enable_order_hint=True,
        order_hint_bits=7,
        force_screen_content_tools=2,
        force_integer_mv=2,
        bit_depth=8,
        mono_chrome=False,
        subsampling_x=1,
        subsampling_y=1,
        color_primaries=2,
        transfer_characteristics=2,
        matrix_coefficients=2,
        full_range=False,
        film_grain_params_present=False,
    )
    return dataclasses.replace(base, **changes)


@st.composite
def frame_headers(draw):
    """(payload, sequence, slot state, temporal id, spatial id, expected FrameHeader)."""
    b = st.booleans()
    reduced = draw(b)
    order_hint = not reduced and draw(b)
    bits = draw(st.integers(1, 8)) if order_hint else 0
    decoder_model = not reduced and draw(b)
    frame_ids = not reduced and draw(b)
    delta_len = draw(st.integers(2, 14)) if frame_ids else 0
    id_len = draw(st.integers(delta_len + 1, min(16, delta_len + 8))) if frame_ids else 0
    points = tuple(
        OperatingPoint(draw(st.integers(0, 4095)), draw(b))
        for _ in range(draw(st.integers(1, 3)) if decoder_model else 1)
    )
    seq = _sequence(
        reduced_still_picture_header=reduced,
        decoder_model_info_present=decoder_model,
        equal_picture_interval=decoder_model and draw(b),
        buffer_removal_time_length=draw(st.integers(1, 32)) if decoder_model else 0,
        frame_presentation_time_length=draw(st.integers(1, 32)) if decoder_model else 0,
        operating_points=points,
        frame_id_numbers_present=frame_ids,
        frame_id_length=id_len,
        delta_frame_id_length=delta_len,
        enable_order_hint=order_hint,
        order_hint_bits=bits,
        force_screen_content_tools=2 if reduced else draw(st.integers(0, 2)),
        force_integer_mv=2 if reduced else draw(st.integers(0, 2)),
    )
    refs = RefState()
    refs.valid = [True] * 8
    refs.frame_type = draw(st.lists(st.integers(0, 3), min_size=8, max_size=8))
    refs.order_hint = draw(st.lists(st.integers(0, (1 << bits) - 1), min_size=8, max_size=8))
    tid, sid = draw(st.integers(0, 7)), draw(st.integers(0, 3))
    timing = decoder_model and not seq.equal_picture_interval
    w = BitWriter()

    def field(n: int, strategy=None) -> int:
        value = draw(strategy if strategy is not None else st.integers(0, (1 << n) - 1))
        w.put(value, n)
        return value

    if reduced:
        ftype, show, showable, resilient = KEY_FRAME, True, False, True
    else:
        if field(1):  # show_existing_frame
            slot = field(3)
            if timing:
                field(seq.frame_presentation_time_length)
            if frame_ids:
                field(id_len)
            field(8)  # whatever follows
            ftype = refs.frame_type[slot]
            refresh = 255 if ftype == KEY_FRAME else 0
            hint = refs.order_hint[slot]
            expected = FrameHeader(
                True, slot, ftype, True, False, False, hint, refresh, (), False, None
            )
            return w.payload(False), seq, refs, tid, sid, expected
        ftype = field(2)
        show = bool(field(1))
        if show and timing:
            field(seq.frame_presentation_time_length)
        showable = ftype != KEY_FRAME if show else bool(field(1))
        forced = ftype == SWITCH_FRAME or (ftype == KEY_FRAME and show)
        resilient = True if forced else bool(field(1))
    intra = ftype in (KEY_FRAME, INTRA_ONLY_FRAME)
    field(1)  # disable_cdf_update
    tools = field(1) if seq.force_screen_content_tools == 2 else seq.force_screen_content_tools
    if tools and seq.force_integer_mv == 2:
        field(1)
    if frame_ids:
        field(id_len)
    if ftype != SWITCH_FRAME and not reduced:
        field(1)
    hint = field(bits) if bits else 0
    if not (intra or resilient):
        field(3)
    if decoder_model and field(1):
        for op in points:
            in_t, in_s = op.idc >> tid & 1, op.idc >> (sid + 8) & 1
            if op.decoder_model_present and (op.idc == 0 or (in_t and in_s)):
                field(seq.buffer_removal_time_length)
    if ftype == SWITCH_FRAME or (ftype == KEY_FRAME and show):
        refresh = 255
    else:
        refresh = field(8, st.integers(0, 254) if ftype == INTRA_ONLY_FRAME else None)
    slot_hints = [0] * 8 if ftype == KEY_FRAME and show else refs.order_hint
    ref_order_hint = None
    if (not intra or refresh != 255) and resilient and order_hint:
        ref_order_hint = tuple(field(bits) for _ in range(8))
        slot_hints = list(ref_order_hint)
    idx: tuple[int, ...] = ()
    short = False
    if not intra:
        short = order_hint and bool(field(1))
        if short:
            last, gold = field(3), field(3)
            idx = set_frame_refs(last, gold, slot_hints, hint, bits)
        explicit = []
        for _ in range(7):
            if not short:
                explicit.append(field(3))
            if frame_ids:
                field(delta_len)
        idx = idx if short else tuple(explicit)
    field(8)  # whatever follows
    expected = FrameHeader(
        False, 0, ftype, show, showable, resilient, hint, refresh, idx, short, ref_order_hint
    )
    return w.payload(False), seq, refs, tid, sid, expected


@settings(max_examples=300, deadline=None)
@given(frame_headers())
def test_frame_header_fields(case):
    payload, seq, refs, tid, sid, expected = case
    assert parse_frame_header(payload, seq, refs, tid, sid) == expected


def test_frame_header_truncated():
    seq = _sequence()
    w = BitWriter()
    w.put(0, 1)  # not show_existing
    w.put(INTER_FRAME, 2)
    with pytest.raises(Av1ParseError, match="ends before"):
        parse_frame_header(w.payload(False), seq, RefState())


# Worked by hand from spec 7.8 (set_frame_refs): order hints are compared relative to the
# current frame; ALTREF takes the furthest future slot, BWDREF and ALTREF2 the closest future
# ones, LAST2 / LAST3 (then BWDREF, ALTREF2, ALTREF if still unset) the latest past ones, and
# anything left the slot with the earliest order hint.
@pytest.mark.parametrize(
    ("last", "gold", "hints", "current", "bits", "expected"),
    [
        # past 8 6 4 9 2, future 12 16 11: every reference finds a slot
        (5, 4, [8, 6, 12, 16, 4, 9, 2, 11], 10, 7, (5, 0, 1, 4, 7, 2, 3)),
        # no future slot: all from the past; ties go to the higher slot number
        (0, 3, [8, 7, 6, 5, 5, 5, 5, 5], 10, 7, (0, 1, 2, 3, 7, 6, 5)),
        # only two past slots, both taken by LAST / GOLDEN: LAST2 / LAST3 get the earliest
        (0, 6, [8, 12, 13, 14, 15, 16, 9, 11], 10, 7, (0, 0, 0, 6, 7, 1, 5)),
        # 3-bit order hints wrap: 7 and 6 are in the past of 1, 2 3 4 in its future
        (0, 4, [7, 0, 2, 3, 6, 5, 1, 4], 1, 3, (0, 1, 5, 4, 6, 2, 7)),
    ],
)
def test_set_frame_refs(last, gold, hints, current, bits, expected):
    assert set_frame_refs(last, gold, hints, current, bits) == expected


def test_ref_state_updates():
    refs = RefState()
    key = FrameHeader(False, 0, KEY_FRAME, True, False, True, 0, 255, (), False, None)
    refs.update(key)
    assert refs.valid == [True] * 8 and refs.order_hint == [0] * 8
    hidden_key = FrameHeader(False, 0, KEY_FRAME, False, True, False, 9, 0b100, (), False, None)
    refs.update(hidden_key)
    inter = FrameHeader(False, 0, INTER_FRAME, True, True, False, 5, 0b1010, (0,) * 7, False, None)
    refs.update(inter)
    assert refs.order_hint == [0, 5, 9, 5, 0, 0, 0, 0]
    assert refs.frame_type == [KEY_FRAME, INTER_FRAME, KEY_FRAME, INTER_FRAME] + [KEY_FRAME] * 4
    show_inter = FrameHeader(True, 1, INTER_FRAME, True, False, False, 5, 0, (), False, None)
    refs.update(show_inter)  # a non-key show_existing_frame changes nothing
    assert refs.order_hint == [0, 5, 9, 5, 0, 0, 0, 0]
    show_key = FrameHeader(True, 2, KEY_FRAME, True, False, False, 9, 255, (), False, None)
    refs.update(show_key)  # reloads every slot from slot 2
    assert refs.order_hint == [9] * 8 and refs.frame_type == [KEY_FRAME] * 8
    expected_hints = (9, 9, 3, 9, 9, 9, 9, 9)
    resilient = FrameHeader(
        False, 0, INTER_FRAME, True, True, True, 11, 1, (0,) * 7, False, expected_hints
    )
    refs.update(resilient)  # a mismatched expected order hint invalidates the slot
    assert refs.valid == [True, True, False, True, True, True, True, True]
    assert refs.order_hint == [11, 9, 3, 9, 9, 9, 9, 9]
