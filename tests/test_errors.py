"""Every error the package raises on purpose derives from ``kohakuclip.KohakuClipError`` (and
from the builtin it always was), is importable from ``kohakuclip`` (its warning categories too),
and no two error classes share a name."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import kohakuclip
from kohakuclip import ClipError, KohakuClipError, Reader


def _error_classes(base: type[BaseException] = Exception) -> list[type]:
    """The package's public exception classes (``Warning``: its warning categories, which
    are not errors)."""
    found = []
    for info in pkgutil.walk_packages(kohakuclip.__path__, "kohakuclip."):
        if info.name.endswith(("torch", "gpu", "_yuv_torch")) or ".write.ray" in info.name:
            continue  # optional extras
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, base)
                and issubclass(value, Warning) == (base is Warning)
                and value.__module__ == info.name
                and not value.__name__.startswith("_")
            ):
                found.append(value)
    return found


def test_every_error_class_derives_from_the_base() -> None:
    classes = _error_classes()
    assert len(classes) > 15
    outside = [c.__qualname__ for c in classes if not issubclass(c, KohakuClipError)]
    assert outside == [], outside
    names = [c.__name__ for c in classes]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


@pytest.mark.parametrize("base", [Exception, Warning])
def test_every_error_and_warning_class_is_exported_from_the_root(base: type) -> None:
    not_exported = [
        c.__qualname__
        for c in _error_classes(base)
        if getattr(kohakuclip, c.__name__, None) is not c or c.__name__ not in kohakuclip.__all__
    ]
    assert not_exported == [], not_exported


def test_a_reader_error_is_caught_by_the_base_and_its_builtin(tmp_path) -> None:
    with pytest.raises(KohakuClipError):
        Reader(str(tmp_path / "missing.zip"))
    assert issubclass(ClipError, RuntimeError)
