"""kohakuclip: fast random-access video clips and images for deep-learning training.

Data path: sources (``storage``) -> plan (``read.plan``) -> pool (``read.pool``) -> batch.
"""

from kohakuclip.read.image_reader import ImageBatch, ImageInfo, ImageReader, ImageReadError
from kohakuclip.read.permute import permute
from kohakuclip.read.pool import Pending, PoolClosedError
from kohakuclip.read.reader import Batch, ClipError, Reader, VideoInfo
from kohakuclip.read.sample import clip, random_frames
from kohakuclip.write.images import encode_image, pack_images
from kohakuclip.write.pack import pack
from kohakuclip.write.video import encode

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "ClipError",
    "ImageBatch",
    "ImageInfo",
    "ImageReadError",
    "ImageReader",
    "Pending",
    "PoolClosedError",
    "Reader",
    "VideoInfo",
    "clip",
    "encode",
    "encode_image",
    "pack",
    "pack_images",
    "permute",
    "random_frames",
]
