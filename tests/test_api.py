"""The public surface: every name in ``kohakuclip.__all__`` resolves; the API reference page
(docs/api.md, built by ``mkdocs build``) documents exactly the public names of ``kohakuclip`` and
``kohakuclip.torch``; every module declares its public names in ``__all__`` (read from the
source with ``ast``), and modules import only those from each other."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import kohakuclip
from tests.paths import ROOT


def _torch_all() -> list[str]:
    """``kohakuclip.torch.__all__``, read from the source (torch need not be installed)."""
    tree = ast.parse((ROOT / "src" / "kohakuclip" / "torch.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError("kohakuclip/torch.py has no __all__")


def test_every_public_name_resolves() -> None:
    assert len(kohakuclip.__all__) == len(set(kohakuclip.__all__))
    namespace: dict[str, object] = {}
    exec("from kohakuclip import *", namespace)  # AttributeError for a name that is not there
    del namespace["__builtins__"]
    assert sorted(namespace) == sorted(kohakuclip.__all__)
    assert all(namespace[name] is getattr(kohakuclip, name) for name in namespace)


def test_the_api_page_documents_every_public_name() -> None:
    page = (ROOT / "docs" / "api.md").read_text()
    documented = re.findall(r"^::: (\S+)$", page, flags=re.M)
    assert len(documented) == len(set(documented))
    public = [f"kohakuclip.{n}" for n in kohakuclip.__all__]
    public += [f"kohakuclip.torch.{n}" for n in _torch_all()]
    public += [f"kohakuclip.writer.{n}" for n in kohakuclip.writer.__all__]  # 1.0.0's names
    assert sorted(documented) == sorted(public)


SRC = ROOT / "src"
MODULES = sorted((SRC / "kohakuclip").rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _bound(statements: list[ast.stmt]) -> set[str]:
    """The names a block of top-level statements binds (inside ``if`` and ``try`` too)."""
    names: set[str] = set()
    for node in statements:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.If):
            names |= _bound(node.body) | _bound(node.orelse)
        elif isinstance(node, ast.Try):
            names |= _bound(node.body) | _bound(node.orelse) | _bound(node.finalbody)
            for handler in node.handlers:
                names |= _bound(handler.body)
    return names


def _declared(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                assert node.value is not None
                return list(ast.literal_eval(node.value))
    return None


def _imports(tree: ast.Module) -> list[tuple[str, str]]:
    """(module, name) for each ``from kohakuclip.module import name`` anywhere in ``tree``
    (lazy imports inside functions included), submodules left out."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kohakuclip":
            found += [(node.module, a.name) for a in node.names]
    return [(m, n) for m, n in found if f"{m}.{n}" not in _TREES]


_TREES = {_module_name(p): ast.parse(p.read_text()) for p in MODULES}
_ALL = {name: _declared(tree) for name, tree in _TREES.items()}


@pytest.mark.parametrize("module", sorted(_TREES))
def test_every_module_declares_its_public_names(module: str) -> None:
    declared = _ALL[module]
    assert declared is not None, f"{module} has no __all__"
    assert len(declared) == len(set(declared))
    assert not set(declared) - _bound(_TREES[module].body), "__all__ names what is not there"


def test_the_package_root_reexports_only_public_names() -> None:
    """Every name ``kohakuclip`` (and any module) passes on is public where it comes from."""
    for module, tree in _TREES.items():
        passed_on = set(_ALL[module] or ())
        for home, name in _imports(tree):
            if name in passed_on:
                assert name in (_ALL[home] or ()), f"{module} re-exports {home}.{name}"


def test_modules_import_only_public_names_from_each_other() -> None:
    """An underscore name is reached into on purpose; any other name one module imports from
    another is in that module's ``__all__``."""
    for module, tree in _TREES.items():
        for home, name in _imports(tree):
            if not name.startswith("_"):
                assert name in (_ALL[home] or ()), f"{module} imports {home}.{name}"


def test_the_docs_import_only_public_names() -> None:
    """The README's and docs' examples import from each module only what it declares."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    imports = r"^\s*from (kohakuclip[\w.]*) import (\([^)]*\)|[^\n]*)"
    found = 0
    for page in pages:
        for home, names in re.findall(imports, page.read_text(), flags=re.M):
            for name in re.findall(r"(\w+)(?:\s+as\s+\w+)?", names):
                found += 1
                assert name in (_ALL[home] or ()), f"{page.name} imports {home}.{name}"
    assert found > 0
