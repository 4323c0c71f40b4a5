"""kohakuclip: fast random-access video clips and images for deep-learning training.

Data path: sources (``storage``) -> plan (``read.plan``) -> pool (``read.pool``) -> batch.
Reading: ``Reader`` (video clips), ``ImageReader``; the torch datasets and loader are in
``kohakuclip.torch``. Writing: ``write_videos`` and ``write_images`` (whole jobs, or one part of
one with ``part=``), ``merge`` (the dataset view over the parts); ``encode`` / ``pack`` and
``encode_image`` / ``pack_images`` for one video, image or shard. Every error raised on purpose
derives from ``KohakuClipError`` and is importable from here.
"""

from kohakuclip import _core as _core  # 1.0.0's module names, as attributes
from kohakuclip import image_writer as image_writer
from kohakuclip import sampling as sampling
from kohakuclip import writer as writer
from kohakuclip.check import Problem, VerifyReport, verify
from kohakuclip.codecs.annexb import AnnexBError
from kohakuclip.codecs.av1_syntax import Av1ParseError
from kohakuclip.decode._avcodec import AvcodecError
from kohakuclip.decode._dav1d import Dav1dError
from kohakuclip.decode.image import ImageDecodeError
from kohakuclip.decode.video import ClipDecodeError
from kohakuclip.errors import KohakuClipError, SourceWarning
from kohakuclip.formats import IndexFormatError
from kohakuclip.gulp.frames import GulpError, RecordError
from kohakuclip.mp4.boxes import Mp4Error
from kohakuclip.mp4.moov import UnsupportedVideo
from kohakuclip.read.image_reader import ImageBatch, ImageInfo, ImageReader, ImageReadError
from kohakuclip.read.permute import permute
from kohakuclip.read.plan import FrameRangeError
from kohakuclip.read.pool import Pending, PoolClosedError
from kohakuclip.read.profile import profile
from kohakuclip.read.reader import Batch, ClipError, Reader, VideoInfo
from kohakuclip.read.sample import clip, random_frames
from kohakuclip.read.stream import SampleStream
from kohakuclip.sheet import contact_sheet
from kohakuclip.storage.image_listing import ImageSourceError
from kohakuclip.storage.remote import MissingObjectError, ObjectStoreError
from kohakuclip.storage.video_listing import SourceError
from kohakuclip.storage.view import ViewError
from kohakuclip.storage.zip import ArchiveError
from kohakuclip.summary import VideoSummary, describe
from kohakuclip.write.image_prepare import ImageSkip
from kohakuclip.write.image_sources import ImageInputError
from kohakuclip.write.images import (
    EncodedImage,
    WriteSummary,
    encode_image,
    pack_images,
    write_images,
)
from kohakuclip.write.merge import MergeError, MergeResult, merge
from kohakuclip.write.pack import PackError, pack
from kohakuclip.write.parts import Part
from kohakuclip.write.shards import WriteError, WriteResult, write_videos
from kohakuclip.write.sources import Source
from kohakuclip.write.video import EncodeError, encode

__version__ = "0.1.0"

__all__ = [
    "AnnexBError",
    "ArchiveError",
    "Av1ParseError",
    "AvcodecError",
    "Batch",
    "ClipDecodeError",
    "ClipError",
    "Dav1dError",
    "EncodeError",
    "EncodedImage",
    "FrameRangeError",
    "GulpError",
    "ImageBatch",
    "ImageDecodeError",
    "ImageInfo",
    "ImageInputError",
    "ImageReadError",
    "ImageReader",
    "ImageSkip",
    "ImageSourceError",
    "IndexFormatError",
    "KohakuClipError",
    "MergeError",
    "MergeResult",
    "MissingObjectError",
    "Mp4Error",
    "ObjectStoreError",
    "PackError",
    "Part",
    "Pending",
    "PoolClosedError",
    "Problem",
    "Reader",
    "RecordError",
    "SampleStream",
    "Source",
    "SourceError",
    "SourceWarning",
    "UnsupportedVideo",
    "VerifyReport",
    "VideoInfo",
    "VideoSummary",
    "ViewError",
    "WriteError",
    "WriteResult",
    "WriteSummary",
    "clip",
    "contact_sheet",
    "describe",
    "encode",
    "encode_image",
    "merge",
    "pack",
    "pack_images",
    "permute",
    "profile",
    "random_frames",
    "verify",
    "write_images",
    "write_videos",
]
