"""The listed videos of a reader: where each lives and its index header entry, kept in columns.

A reader lists every video of its sources once, and each DataLoader worker holds that listing.
One Python object per video (a ``VideoRef`` and its ``VideoEntry``: about 300 bytes, a million
videos 0.3 GB) would also be copied into every forked worker page by page, as reference counts
are written when objects are read. ``VideoRefs`` keeps the same facts in flat arrays (58 bytes a
video plus its name) and builds a ``VideoRef`` when one is asked for.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast, overload

import numpy as np

from kohakuclip.formats import Colorspace, VideoCodec, VideoEntry

__all__ = ["VideoRef", "VideoRefs"]

_NAME_ERRORS = "surrogatepass"  # names from archives may hold undecodable bytes as surrogates


@dataclass(frozen=True, slots=True)
class VideoRef:
    """Where one video lives."""

    source: int  # index into the listed sources
    member: str  # member name in the archive, or path relative to the folder
    entry: VideoEntry | None = None  # header entry when the source has an index


class _Strings:
    """Distinct strings by number (codecs, colorspaces, decoder prefixes: shared by videos)."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self._numbers: dict[str, int] = {}

    def number(self, value: str) -> int:
        """The number of ``value``, given one when it is new.

        Raises:
            TypeError: ``value`` is not a string (nothing is recorded then).
        """
        found = self._numbers.get(value) if isinstance(value, str) else None
        if found is None:
            if not isinstance(value, str):
                raise TypeError(f"expected a string, got {value!r}")
            found = self._numbers[value] = len(self.values)
            self.values.append(sys.intern(value))
        return found

    def __getstate__(self) -> list[str]:
        return self.values

    def __setstate__(self, values: list[str]) -> None:
        self.values = [sys.intern(v) for v in values]
        self._numbers = {v: k for k, v in enumerate(self.values)}


class VideoRefs(Sequence[VideoRef]):
    """The listed videos in order, as columns; ``refs[i]`` is a fresh ``VideoRef``."""

    def __init__(self, refs: Iterable[VideoRef] = ()) -> None:
        self._source = array("i")
        self._name_end = array("q")
        self._names = bytearray()
        self._entry = array("b")  # 1 where the video has a header entry
        self._row = array("q")
        self._n = array("q")
        self._fps = array("d")
        self._h = array("i")
        self._w = array("i")
        self._codec = array("i")
        self._colorspace = array("i")
        self._prefix = array("i")
        self._full_range = array("b")
        self._strings = _Strings()
        self.extend(refs)

    def append(self, ref: VideoRef) -> None:
        """Add one video at the end.

        Raises:
            ValueError: a field the columns cannot hold (a damaged index or manifest: sizes
                past 2**31, a missing value), naming the video; nothing is added then.
        """
        e = ref.entry
        if not isinstance(ref.member, str):
            raise ValueError(f"a video without a name ({ref.member!r}) in source {ref.source}")
        if e is not None and e.member != ref.member:
            raise ValueError(f"the entry of {ref.member!r} names {e.member!r}")
        fields = _NO_ENTRY if e is None else e
        name = ref.member.encode("utf-8", _NAME_ERRORS)
        grown: list[array[Any]] = []  # the columns grown so far, shrunk again on an error
        try:
            row: list[tuple[array[Any], Any]] = [
                (self._source, ref.source),
                (self._entry, e is not None),
                (self._row, fields.row),
                (self._n, fields.n),
                (self._fps, fields.fps),
                (self._h, fields.h),
                (self._w, fields.w),
                (self._codec, self._strings.number(fields.codec)),
                (self._colorspace, self._strings.number(fields.colorspace)),
                (self._prefix, self._strings.number(fields.prefix)),
                (self._full_range, bool(fields.full_range)),
            ]
            for column, value in row:
                column.append(value)
                grown.append(column)
        except (OverflowError, TypeError) as error:
            for column in grown:
                column.pop()
            raise ValueError(
                f"video {ref.member!r}: a missing or out-of-range field ({error})"
            ) from None
        self._names += name
        self._name_end.append(len(self._names))

    def extend(self, refs: Iterable[VideoRef]) -> None:
        """Add videos at the end, in order."""
        for ref in refs:
            self.append(ref)

    def __len__(self) -> int:
        return len(self._source)

    @overload
    def __getitem__(self, i: int) -> VideoRef: ...

    @overload
    def __getitem__(self, i: slice) -> list[VideoRef]: ...

    def __getitem__(self, i: int | slice) -> VideoRef | list[VideoRef]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        count = len(self._source)
        if not -count <= i < count:
            raise IndexError(f"video {i} of {count}")
        i %= count
        start = self._name_end[i - 1] if i else 0
        member = self._names[start : self._name_end[i]].decode("utf-8", _NAME_ERRORS)
        if not self._entry[i]:
            return VideoRef(self._source[i], member)
        strings = self._strings.values
        entry = VideoEntry(
            member=member,
            row=self._row[i],
            n=self._n[i],
            fps=self._fps[i],
            h=self._h[i],
            w=self._w[i],
            codec=cast(VideoCodec, strings[self._codec[i]]),
            prefix=strings[self._prefix[i]],
            colorspace=cast(Colorspace, strings[self._colorspace[i]]),
            full_range=bool(self._full_range[i]),
        )
        return VideoRef(self._source[i], member, entry)

    def __iter__(self) -> Iterator[VideoRef]:
        for i in range(len(self)):
            yield self[i]

    def sources(self) -> np.ndarray:
        """The source of each video (int32, a copy)."""
        return np.frombuffer(self._source, np.int32).copy() if len(self) else np.zeros(0, np.int32)

    def short_sides(self) -> np.ndarray | None:
        """The short side of each video from its header entry (int32), or None when some video
        has no entry."""
        if not len(self) or not np.frombuffer(self._entry, np.int8).all():
            return None
        return np.minimum(np.frombuffer(self._h, np.int32), np.frombuffer(self._w, np.int32))

    def nbytes(self) -> int:
        """The bytes the columns hold (names included, the shared strings not)."""
        columns: list[array[int] | array[float]] = [self._source, self._name_end, self._entry]
        columns += [self._row, self._n, self._fps, self._h, self._w, self._codec]
        columns += [self._colorspace, self._prefix, self._full_range]
        return sum(c.itemsize * len(c) for c in columns) + len(self._names)


_NO_ENTRY = VideoEntry("", 0, 0, 0.0, 0, 0, "av1", "", "bt601")
"""The column values of a video without a header entry (never read back)."""
