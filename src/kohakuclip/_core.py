"""KohakuClip 1.0.0's ``kohakuclip._core`` writer functions, for code written against it:
``encode`` (one video, a path or its bytes, to the stored mp4 bytes), ``pack`` (a shard with
its index from named mp4 bytes), ``encode_image`` and ``pack_images``. They are the writer's
own functions, also exported by the package root, where new code takes them."""

from __future__ import annotations

from kohakuclip.write.images import encode_image, pack_images
from kohakuclip.write.pack import pack
from kohakuclip.write.video import encode

__all__ = ["encode", "encode_image", "pack", "pack_images"]
