"""Sanity check of a gulp directory (GulpIO's checks, plus well-formed records).

Per chunk: both files present and not empty, the meta file parses with well-formed frame
records, and the data file is exactly as long as its last frame's end. Across chunks (and
inside a meta file): no id appears twice.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from kohakuclip.gulp.frames import GulpError
from kohakuclip.gulp.meta import frame_table, load_meta, scan_directory

__all__ = ["SanityReport", "check_gulp_directory"]


@dataclass
class SanityReport:
    """Problems found, by file; ``ok`` when there are none."""

    root: str
    problems: dict[str, list[str]] = field(default_factory=dict)  # file -> what is wrong
    duplicates: dict[str, list[str]] = field(default_factory=dict)  # id -> meta files holding it
    chunks: int = 0
    ids: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems and not self.duplicates

    @property
    def bad_files(self) -> list[str]:
        """Every file with a problem or holding a duplicated id, sorted."""
        files = set(self.problems)
        for where in self.duplicates.values():
            files.update(where)
        return sorted(files)

    def add(self, path: str, problem: str) -> None:
        self.problems.setdefault(path, []).append(problem)

    def lines(self) -> list[str]:
        """A human-readable summary, one finding per line."""
        out = [f"{path}: {p}" for path in sorted(self.problems) for p in self.problems[path]]
        for id_, where in sorted(self.duplicates.items()):
            out.append(f"duplicate id {id_!r} in: {', '.join(where)}")
        return out


def check_gulp_directory(path: str | os.PathLike[str]) -> SanityReport:
    """Run every check on a gulp directory (one with no chunks at all fails too); GulpError
    only when it is not a directory."""
    root = os.fspath(path)
    report = SanityReport(root)
    chunks, lone_data, lone_meta = scan_directory(root)
    if not (chunks or lone_data or lone_meta):
        report.add(root, "no gulp chunks (data_<i>.gulp and meta_<i>.gmeta files)")
    for data_path in lone_data:
        report.add(data_path, "no meta file")
    for meta_path in lone_meta:
        report.add(meta_path, "no data file")
    holders: dict[str, list[str]] = {}
    for chunk in chunks:
        report.chunks += 1
        data_size = os.path.getsize(chunk.data_path)
        if data_size == 0:
            report.add(chunk.data_path, "empty data file")
        if os.path.getsize(chunk.meta_path) == 0:
            report.add(chunk.meta_path, "empty meta file")
            continue
        repeated: list[str] = []
        try:
            meta = load_meta(chunk.meta_path, repeated)
            _, table = frame_table(meta, chunk.meta_path)
        except GulpError as exc:
            report.add(chunk.meta_path, str(exc).removeprefix(f"{chunk.meta_path}: "))
            continue
        if not meta:
            report.add(chunk.meta_path, "no ids")
        report.ids += len(meta)
        for id_ in [*meta, *repeated]:
            holders.setdefault(id_, []).append(chunk.meta_path)
        end = int(np.max(table[:, 0] + table[:, 2])) if len(table) else 0
        if data_size != end:
            report.add(chunk.data_path, f"{data_size} bytes, the last frame ends at {end}")
    report.duplicates = {id_: where for id_, where in holders.items() if len(where) > 1}
    return report
