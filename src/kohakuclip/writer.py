"""``kohakuclip.writer``: write video shards from Python (``write``), or encode / pack by hand."""

from kohakuclip.write.pack import pack
from kohakuclip.write.shards import WriteError, WriteResult, write
from kohakuclip.write.sources import Source
from kohakuclip.write.video import EncodeError, encode

__all__ = ["EncodeError", "Source", "WriteError", "WriteResult", "encode", "pack", "write"]
