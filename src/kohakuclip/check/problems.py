"""What ``verify`` finds: one problem per line, naming the shard, the member and the frame."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Problem", "VerifyReport", "capped", "without_where"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a source.

    ``member`` is the video (archive member, path in a folder, gulp id), ``""`` for the source as
    a whole; ``frame`` the display-order frame index, or None when no frame can be named.
    """

    source: str
    member: str
    frame: int | None
    message: str

    def __str__(self) -> str:
        where = self.source if not self.member else f"{self.source}: {self.member}"
        if self.frame is not None:
            where += f": frame {self.frame}"
        return f"{where}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "member": self.member,
            "frame": self.frame,
            "message": self.message,
        }


@dataclass
class VerifyReport:
    """Everything ``verify`` looked at and what it found."""

    sources: int = 0
    videos: int = 0
    frames: int = 0  # frames checked (decoded through the reader and by PyAV)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def without_where(message: str, where: str) -> str:
    """An error message without the ``where:`` prefix that the problem names already."""
    return message[len(where) + 2 :] if message.startswith(f"{where}: ") else message


def capped(problems: list[Problem], limit: int) -> list[Problem]:
    """The first ``limit`` problems of one check, then one line counting the rest."""
    if len(problems) <= limit:
        return problems
    last = problems[limit]
    rest = len(problems) - limit
    more = Problem(last.source, last.member, None, f"... and {rest} more like the above")
    return [*problems[:limit], more]
