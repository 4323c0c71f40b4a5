"""The plan of one clip's reads and decoder input: made by ``read.plan``, consumed by
``decode``; a module of its own so that decode/ does not import read/."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ClipPlan", "GopRead", "Pieces"]

Pieces = tuple[tuple[int, int], ...]
"""Byte ranges ``(start, end)`` within a read that make one packet."""


@dataclass(frozen=True)
class GopRead:
    """One pread and the packets cut from it.

    Args:
        offset: absolute byte offset of the read in the source.
        length: bytes read.
        packets: per packet fed to the decoder, its byte ranges within the read and its
            display index.
    """

    offset: int
    length: int
    packets: list[tuple[Pieces, int]]


@dataclass(frozen=True)
class ClipPlan:
    """What one clip reads and feeds the decoder (``read.plan.plan_clip`` makes it).

    Args:
        reads: one pread per GOP holding wanted frames, in decode order.
        targets: display index -> output positions in the clip.
        packets: packets fed to the decoder.
        decoded: frames the decoder decodes (AV1 hidden frames included when known).
    """

    reads: list[GopRead]
    targets: dict[int, list[int]]  # display index -> output positions in the clip
    packets: int  # packets fed to the decoder
    decoded: int  # frames the decoder decodes (AV1 hidden frames included when known)

    @property
    def bytes_read(self) -> int:
        """Bytes the plan reads."""
        return sum(r.length for r in self.reads)
