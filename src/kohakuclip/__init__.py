"""kohakuclip: fast random-access video clips and images for deep-learning training."""

from kohakuclip.read.pool import Pending
from kohakuclip.read.reader import Batch, ClipError, Reader, VideoInfo
from kohakuclip.read.sample import clip, random_frames

__version__ = "0.1.0"

__all__ = ["Batch", "ClipError", "Pending", "Reader", "VideoInfo", "clip", "random_frames"]
