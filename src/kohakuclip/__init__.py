"""kohakuclip: fast random-access video clips and images for deep-learning training.

Data path: sources (``storage``) -> plan (``read.plan``) -> pool (``read.pool``) -> batch.
"""

from kohakuclip.check import Problem, VerifyReport, verify
from kohakuclip.errors import KohakuClipError
from kohakuclip.read.image_reader import ImageBatch, ImageInfo, ImageReader, ImageReadError
from kohakuclip.read.permute import permute
from kohakuclip.read.pool import Pending, PoolClosedError
from kohakuclip.read.reader import Batch, ClipError, Reader, VideoInfo
from kohakuclip.read.sample import clip, random_frames
from kohakuclip.read.stream import SampleStream
from kohakuclip.sheet import contact_sheet
from kohakuclip.storage.remote import ObjectStoreError
from kohakuclip.summary import VideoSummary, describe
from kohakuclip.write.images import encode_image, pack_images
from kohakuclip.write.merge import MergeError, merge
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
    "KohakuClipError",
    "MergeError",
    "ObjectStoreError",
    "Pending",
    "PoolClosedError",
    "Problem",
    "Reader",
    "SampleStream",
    "VerifyReport",
    "VideoInfo",
    "VideoSummary",
    "clip",
    "contact_sheet",
    "describe",
    "encode",
    "encode_image",
    "merge",
    "pack",
    "pack_images",
    "permute",
    "random_frames",
    "verify",
]
