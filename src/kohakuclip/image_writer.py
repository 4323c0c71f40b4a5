"""Image shard writing from Python: ``write_images`` (the whole job), ``encode_image`` and
``pack_images`` (one image, one shard)."""

from kohakuclip.write.image_prepare import ImageSkip
from kohakuclip.write.images import (
    EncodedImage,
    WriteSummary,
    encode_image,
    pack_images,
    write_images,
)

__all__ = [
    "EncodedImage",
    "ImageSkip",
    "WriteSummary",
    "encode_image",
    "pack_images",
    "write_images",
]
