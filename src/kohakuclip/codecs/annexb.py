"""H.264 / HEVC: length-prefixed (mp4) samples to Annex B; parameter sets from avcC / hvcC.

mp4 stores each NAL unit behind a big-endian length field of 1, 2 or 4 bytes (the size is in
the avcC / hvcC record). A decoder fed without extradata wants Annex B instead: every NAL unit
behind a ``00 00 00 01`` start code, with the parameter sets (VPS/SPS/PPS) in front.
"""

from __future__ import annotations

import struct

from kohakuclip.errors import KohakuClipError

__all__ = [
    "AnnexBError",
    "annexb_in_place",
    "nal_length_size",
    "nal_units",
    "parameter_sets_annexb",
    "to_annexb",
]


START_CODE = b"\x00\x00\x00\x01"
_LENGTH = struct.Struct(">I")


class AnnexBError(KohakuClipError, ValueError):
    """A sample or decoder configuration whose NAL unit framing is broken."""


def _fail(where: str, problem: str) -> AnnexBError:
    return AnnexBError(f"{where}: {problem}" if where else problem)


def annexb_in_place(buf: bytearray | memoryview, where: str = "") -> None:
    """Overwrite each 4-byte NAL length in ``buf`` with a start code (the read hot path).

    ``buf`` (a bytearray, or a writable byte memoryview such as a slice of one) holds one or
    more whole samples with 4-byte lengths, back to back (e.g. a GOP read in one go). Raises
    AnnexBError when a length runs past the end.
    """
    end = len(buf)
    pos = 0
    unpack = _LENGTH.unpack_from
    while pos + 4 <= end:
        (length,) = unpack(buf, pos)
        buf[pos : pos + 4] = START_CODE
        pos += 4 + length
    if pos != end:
        raise _fail(where, f"NAL unit runs past the end of the sample ({pos} > {end})")


def to_annexb(
    sample: bytes | bytearray | memoryview, nal_length_size: int, where: str = ""
) -> bytes:
    """One length-prefixed sample as an Annex B byte stream.

    With 4-byte lengths this is an in-place overwrite of a copy; with 1-, 2- or 3-byte lengths
    the NAL units are copied behind 4-byte start codes.
    """
    if nal_length_size == 4:
        out = bytearray(sample)
        annexb_in_place(out, where)
        return bytes(out)
    if nal_length_size not in (1, 2, 3):
        raise _fail(where, f"unsupported NAL length size {nal_length_size}")
    return b"".join(START_CODE + unit for unit in nal_units(sample, nal_length_size, where))


def nal_units(
    sample: bytes | bytearray | memoryview, nal_length_size: int, where: str = ""
) -> list[memoryview]:
    """The NAL units of a length-prefixed sample (views into it, headers included)."""
    view = memoryview(sample).cast("B")
    units = []
    pos = 0
    end = len(view)
    while pos < end:
        if pos + nal_length_size > end:
            raise _fail(where, f"truncated NAL length field at byte {pos}")
        length = int.from_bytes(view[pos : pos + nal_length_size], "big")
        pos += nal_length_size
        if pos + length > end:
            raise _fail(where, f"NAL unit runs past the end of the sample ({pos + length} > {end})")
        units.append(view[pos : pos + length])
        pos += length
    return units


def nal_length_size(codec: str, config: bytes, where: str = "") -> int:
    """The NAL length field size (1, 2 or 4) declared by an avcC (h264) or hvcC (hevc) record."""
    at = {"h264": 4, "hevc": 21}.get(codec)
    if at is None:
        raise _fail(where, f"no NAL length size for codec {codec!r}")
    if len(config) <= at:
        raise _fail(where, f"{_record(codec)} too short ({len(config)} bytes)")
    size = (config[at] & 3) + 1
    if size == 3:
        raise _fail(where, f"{_record(codec)} declares an invalid NAL length size 3")
    return size


def _record(codec: str) -> str:
    return "avcC" if codec == "h264" else "hvcC"


def _take(config: bytes, pos: int, size: int, codec: str, where: str) -> bytes:
    if pos + size > len(config):
        raise _fail(where, f"{_record(codec)} truncated at byte {pos}")
    return config[pos : pos + size]


def _avcc_units(config: bytes, where: str) -> list[bytes]:
    if len(config) < 7 or config[0] != 1:
        raise _fail(where, "avcC is not a version 1 decoder configuration record")
    units = []
    pos = 5
    for count_mask in (0x1F, 0xFF):  # SPS count (5 bits), then PPS count
        count = _take(config, pos, 1, "h264", where)[0] & count_mask
        pos += 1
        for _ in range(count):
            length = int.from_bytes(_take(config, pos, 2, "h264", where), "big")
            units.append(_take(config, pos + 2, length, "h264", where))
            pos += 2 + length
    return units


def _hvcc_units(config: bytes, where: str) -> list[bytes]:
    if len(config) < 23 or config[0] != 1:
        raise _fail(where, "hvcC is not a version 1 decoder configuration record")
    units = []
    pos = 23
    for _ in range(config[22]):
        count = int.from_bytes(_take(config, pos + 1, 2, "hevc", where), "big")
        pos += 3
        for _ in range(count):
            length = int.from_bytes(_take(config, pos, 2, "hevc", where), "big")
            units.append(_take(config, pos + 2, length, "hevc", where))
            pos += 2 + length
    return units


def parameter_sets_annexb(codec: str, config: bytes, where: str = "") -> bytes:
    """The NAL units an avcC / hvcC record carries (SPS, PPS; VPS first for HEVC), as Annex B.

    HEVC records may also carry SEI arrays; they are kept, in the record's order.
    """
    if codec == "h264":
        units = _avcc_units(config, where)
    elif codec == "hevc":
        units = _hvcc_units(config, where)
    else:
        raise _fail(where, f"no parameter sets for codec {codec!r}")
    return b"".join(START_CODE + unit for unit in units)
