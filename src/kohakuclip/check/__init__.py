"""``kohakuclip verify``: is every frame of a set of sources readable, and read right?

``structure`` checks the archive and the index against each member's moov, ``reference``
decodes each member independently with PyAV, ``frames`` reads the same frames through the
``Reader`` (full decode, ``keep`` and closure skipping), and ``verify`` runs them all.
"""

from kohakuclip.check.problems import Problem, VerifyReport
from kohakuclip.check.verify import verify

__all__ = ["Problem", "VerifyReport", "verify"]
