"""``kohakuclip.writer``: write video shards from Python (``write``, ``part=`` / ``ray=`` for
jobs split over machines, ``merge`` for the dataset view), or encode / pack by hand."""

from kohakuclip.write.merge import MergeError, MergeResult, merge
from kohakuclip.write.pack import pack
from kohakuclip.write.parts import Part
from kohakuclip.write.shards import WriteError, WriteResult, write
from kohakuclip.write.sources import Source
from kohakuclip.write.video import EncodeError, encode

__all__ = [
    "EncodeError",
    "MergeError",
    "MergeResult",
    "Part",
    "Source",
    "WriteError",
    "WriteResult",
    "encode",
    "merge",
    "pack",
    "write",
]
