"""mp4 / mov containers.

- ``mp4.moov``: ``parse_mp4`` / ``parse_mp4_bytes`` / ``parse_mp4_file`` read the first
  supported video track's sample table into numpy arrays (``Mp4Track``);
- ``mp4.faststart``: ``faststart`` moves a moov in front of the media data;
- ``mp4.edits``: edit lists, applied as FFmpeg applies them;
- ``mp4.boxes``: box framing and ``Mp4Error``.
"""

__all__: list[str] = []
