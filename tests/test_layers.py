"""Import layers, read from the source with ``ast`` (nothing imported): every module under
src/kohakuclip imports only its own package and what ``ALLOWED`` lists for it, lazy imports
inside functions included.

Bottom to top: errors, formats, plan_types, imaging, _argtypes, _cpus, _progress; codecs; mp4;
tracks; storage and gulp (peers: each may import only the other's modules listed here); decode;
read; write, check and the tools; the package root. codecs/, mp4/ and storage/ import no upper
layer; read/ and decode/ never import write/; decode/ takes its tracks from ``tracks``, never from
storage's catalogs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "kohakuclip"
ROOT = "__init__"  # the package root, ``kohakuclip/__init__.py`` (it imports every layer)

_BASE = {"errors", "formats", "plan_types", "imaging", "_argtypes", "_cpus", "_progress"}
_STORAGE = _BASE | {"codecs", "mp4", "tracks", "storage"}
_IO = {"storage.cache", "storage.files", "storage.ranged", "storage.remote"}  # no catalog
_READ = _STORAGE | {"gulp", "decode", "read"}
_WRITE = _READ | {"write"}
_TOOLS = _WRITE | {"check", "summary", "sheet", "gpu", "_yuv_torch", "torch", "cli"}
_TOOLS |= {"writer", "image_writer", "_core", "sampling"}
_ANY = _TOOLS | {ROOT}

ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "_argtypes": set(),
    "_cpus": set(),
    "_progress": set(),
    "plan_types": set(),
    "imaging": set(),
    "formats": {"errors"},
    "codecs": {"errors", "formats"},
    "mp4": {"errors", "formats", "codecs"},
    "tracks": {"codecs"},
    "storage": _STORAGE | {"gulp.index", "gulp.meta", "gulp.frames"},  # gulp's read side
    "gulp": _BASE | {"storage.folder", "storage.remote", "storage.prefix"},  # URL datasets
    "decode": _BASE | {"codecs", "mp4", "tracks"} | _IO,
    "gpu": set(),
    "read": _READ,
    "_yuv_torch": {"decode", "gpu"},
    "write": _WRITE | {ROOT},  # the root for its __version__ only
    "check": _READ,
    "summary": _STORAGE,
    "sheet": {"read"},
    "torch": _TOOLS | {ROOT},
    "cli": _TOOLS,
    "writer": {"write"},  # 1.0.0's module names for the writers
    "image_writer": {"write"},
    "_core": {"write"},
    "sampling": {"read"},  # 1.0.0's module name for the samplers
    ROOT: _ANY,
}

UPPER = {"decode", "read", "write", "check", "summary", "sheet", "gpu", "_yuv_torch", "torch"}
UPPER |= {"cli", "writer", "image_writer", "_core", "sampling", ROOT}


def _unit(rel: Path) -> str:
    """The layer unit of a module: its top package, or the top-level module itself."""
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _is_module(name: str) -> bool:
    return (SRC / name).is_dir() or (SRC / f"{name}.py").is_file()


def imported(source: str, rel: Path) -> list[tuple[int, str]]:
    """(line, target) of every kohakuclip import in a module's source; targets are dotted names
    below the package (``storage.zip``), or ``ROOT`` for the package root itself."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "kohakuclip":
                    out.append((node.lineno, ROOT))
                elif alias.name.startswith("kohakuclip."):
                    out.append((node.lineno, alias.name.removeprefix("kohakuclip.")))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = list(rel.parent.parts)
                base = package[: len(package) - node.level + 1]
                parts = base + (node.module.split(".") if node.module else [])
            elif node.module == "kohakuclip" or (node.module or "").startswith("kohakuclip."):
                parts = node.module.split(".")[1:] if node.module else []
            else:
                continue
            if parts:
                out.append((node.lineno, ".".join(parts)))
                continue
            for alias in node.names:  # ``from kohakuclip import x``: a module, or the root's x
                out.append((node.lineno, alias.name if _is_module(alias.name) else ROOT))
    return out


def allowed(unit: str, target: str) -> bool:
    """True when ``unit`` may import ``target`` (its own modules, or what ALLOWED lists)."""
    if target.split(".")[0] == unit:
        return True
    return any(target == p or target.startswith(p + ".") for p in ALLOWED[unit])


def violations(source: str, rel: Path) -> list[str]:
    """The imports of one module (``rel``: its path under src/kohakuclip) the table forbids."""
    unit = _unit(rel)
    return [
        f"{rel}:{line}: {unit} imports kohakuclip.{target}"
        for line, target in imported(source, rel)
        if not allowed(unit, target)
    ]


MODULES = sorted(p.relative_to(SRC) for p in SRC.rglob("*.py"))


def test_every_unit_has_a_row() -> None:
    units = {_unit(rel) for rel in MODULES}
    assert units - set(ALLOWED) == set(), "a new package or module: give it a row in ALLOWED"
    assert set(ALLOWED) - units == set(), "a row for a package or module that is gone"


def test_the_table_keeps_the_layer_rules() -> None:
    for lower in ("errors", "formats", "plan_types", "imaging", "codecs", "mp4", "tracks"):
        assert {p.split(".")[0] for p in ALLOWED[lower]} & (UPPER | {"storage", "gulp"}) == set()
    for lower in ("storage", "gulp"):
        assert {p.split(".")[0] for p in ALLOWED[lower]} & UPPER == set()
    for unit in ("decode", "read"):
        forbidden = {"write", "cli", "torch", "check", ROOT}
        assert {p.split(".")[0] for p in ALLOWED[unit]} & forbidden == set()
    assert "read" not in ALLOWED["decode"]


@pytest.mark.parametrize("rel", MODULES, ids=str)
def test_imports_follow_the_layers(rel: Path) -> None:
    assert violations((SRC / rel).read_text(encoding="utf-8"), rel) == []


@pytest.mark.parametrize(
    ("rel", "source"),
    [
        ("storage/zip.py", "from kohakuclip.decode.video import ClipDecoder\n"),
        ("codecs/av1.py", "def f():\n    import kohakuclip.read.plan\n"),
        ("decode/video.py", "from kohakuclip import write\n"),
        ("read/plan.py", "from kohakuclip import merge\n"),  # a root name: the root imports write
        ("mp4/moov.py", "from ..storage import zip\n"),
        ("read/reader.py", "from ..write.pack import pack\n"),
        ("gulp/index.py", "from kohakuclip.storage.video_catalog import Catalog\n"),
        ("decode/video.py", "from kohakuclip.storage.video_listing import VideoRef\n"),
    ],
)
def test_a_broken_rule_is_found(rel: str, source: str) -> None:
    assert len(violations(source, Path(rel))) == 1


def test_allowed_imports_pass() -> None:
    source = "from kohakuclip.formats import INDEX_MEMBER\nfrom .zip import Member\n"
    assert violations(source, Path("storage/tar.py")) == []
    assert violations("from kohakuclip.gulp.index import GulpIndex\n", Path("storage/x.py")) == []
