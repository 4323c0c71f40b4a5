"""The public surface: every name in ``kohakuclip.__all__`` resolves, and the API reference page
(docs/api.md, built by ``mkdocs build``) documents exactly the public names of ``kohakuclip`` and
``kohakuclip.torch``."""

from __future__ import annotations

import ast
import re

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
    assert sorted(documented) == sorted(public)
