"""`_` means private (issue 35): no module of cgt_viz/ imports a `_name` another module defines, and benchmarks/
use the public API only.

Allowed: importing a private *module* (`from . import _cells`, `from .._checks import checked`, `from
..figures._style import finish`): the leading `_` of a module marks it internal to the package, and its names
are the package's shared internals. Not allowed: `from .evaluate import _gap` (a private name of another module),
and, in benchmarks/, calling a private method (`model._lower(...)`; dunders are fine).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ("cgt_viz", "common")   # what benchmarks import that lives in this repository


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _package_of(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return parts[:-1]   # an __init__.py's package is its folder, as for any module in it


def _is_module(parts: list[str]) -> bool:
    where = ROOT.joinpath(*parts)
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def _private_imports(path: Path, tree: ast.AST) -> list[str]:
    """file:line for each `from X import _name` (anywhere, lazy imports too) where _name is not a module."""
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = node.module.split(".") if node.module else []
        if node.level:
            package = _package_of(path)
            target = package[:len(package) - node.level + 1] + module
        elif module and module[0] in LOCAL:
            target = ["benchmarks", *module] if module[0] == "common" else module
        else:
            continue   # another project's names are its own business
        for alias in node.names:
            if _is_private(alias.name) and not _is_module(target + [alias.name]):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {'.' * node.level}{node.module or ''} "
                           f"import {alias.name}")
    return bad


def _private_calls(path: Path, tree: ast.AST) -> list[str]:
    """file:line for each call of a private method or function through an attribute (`x._name(...)`)."""
    return [f"{path.relative_to(ROOT)}:{node.lineno}: .{node.func.attr}(...)" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_private(node.func.attr)]


def _modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_no_module_imports_a_private_name_of_another():
    bad = [b for folder in ("cgt_viz", "benchmarks") for path in _modules(folder)
           for b in _private_imports(path, ast.parse(path.read_text(), str(path)))]
    assert not bad, "private names imported from another module (give them a public name):\n" + "\n".join(bad)


def test_benchmarks_call_no_private_method():
    bad = [b for path in _modules("benchmarks") for b in _private_calls(path, ast.parse(path.read_text(), str(path)))]
    assert not bad, "benchmarks calling private methods (use the public API):\n" + "\n".join(bad)


def test_the_rules_catch_what_they_should():
    """The checks themselves: a private name is caught, a private module and a dunder are not."""
    fake = ROOT / "cgt_viz" / "hf" / "example.py"
    code = ("from ..evaluate import _gap, gap_closed\nfrom .. import _checks\nfrom .._checks import checked\n"
            "def f():\n    from ..io import _umask\n    from .measure import __doc__\n")
    assert [b.split(": ", 1)[1] for b in _private_imports(fake, ast.parse(code))] == \
        ["from ..evaluate import _gap", "from ..io import _umask"]
    bench = ROOT / "benchmarks" / "example.py"
    code = "from common import _helper, write_json\nmodel._lower(x)\nmodel.__call__(x)\nmodel.forward(x)\n"
    tree = ast.parse(code)
    assert [b.split(": ", 1)[1] for b in _private_imports(bench, tree)] == ["from common import _helper"]
    assert [b.split(": ", 1)[1] for b in _private_calls(bench, tree)] == ["._lower(...)"]
