"""GulpIO-compatible storage: read and write gulp directories, ingest datasets, check them.

``from gulpio import GulpDirectory`` becomes ``from kohakuclip.gulp import GulpDirectory``; the
datasets and transforms are ``kohakuclip.gulp.dataset`` and ``kohakuclip.gulp.transforms``.
``open_gulp_source`` gives the flat per-frame index that readers use. Torch is not needed.
"""

from kohakuclip.gulp.adapters import (
    AbstractDatasetAdapter,
    Custom20BNJsonVideoAdapter,
    ImageFolderAdapter,
    ImageListAdapter,
    JsonVideoAdapter,
    VideoFolderAdapter,
    load_label2idx,
)
from kohakuclip.gulp.chunk import ChunkBuilder, GulpChunk
from kohakuclip.gulp.directory import GulpDirectory
from kohakuclip.gulp.frames import GulpError, decode_frame, encode_frame
from kohakuclip.gulp.index import GulpIndex, open_gulp_source
from kohakuclip.gulp.ingest import (
    LABEL2IDX_FILE,
    ChunkWriter,
    GulpIngestor,
    IngestReport,
    calculate_chunk_slices,
)
from kohakuclip.gulp.media import read_video_frames
from kohakuclip.gulp.sanity import SanityReport, check_gulp_directory

__all__ = [
    "LABEL2IDX_FILE",
    "AbstractDatasetAdapter",
    "ChunkBuilder",
    "ChunkWriter",
    "Custom20BNJsonVideoAdapter",
    "GulpChunk",
    "GulpDirectory",
    "GulpError",
    "GulpIndex",
    "GulpIngestor",
    "ImageFolderAdapter",
    "ImageListAdapter",
    "IngestReport",
    "JsonVideoAdapter",
    "SanityReport",
    "VideoFolderAdapter",
    "calculate_chunk_slices",
    "check_gulp_directory",
    "decode_frame",
    "encode_frame",
    "load_label2idx",
    "open_gulp_source",
    "read_video_frames",
]
