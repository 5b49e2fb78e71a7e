"""envace's import graph, read from the source (nothing imported): which envace modules each module imports,
and everything a module pulls in when it runs.

Every import counts: module-level and inside functions, ``from x import y`` (an edge to ``x``, and to
``x.y`` when that is a module), and ``importlib.import_module("...")`` with a literal name; an import under
``if TYPE_CHECKING:`` does not (annotations only, never run). A package's ``__init__`` is a module of its
own. The graph over-approximates what one run executes (an import inside a function counts whether or not
that function runs), which is the safe side for the two users: tests/unit/test_import_graph.py (the
package floors, no circles) and envace.reporting.science_provenance (the code a science part depends on
beyond the files its DVC stage declares).
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_name(path: Path, package_dir: Path) -> str:
    """``<package_dir>/stages/train.py`` -> ``envace.stages.train``; a package's ``__init__.py`` -> the package."""
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, name: str, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` (module ``name``) imports."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(_without_type_checking(ast.parse(path.read_text()))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            targets = [node.args[0].value]
        out.update(t for t in targets if t in modules and t != name)
    return out


def _without_type_checking(tree: ast.Module) -> ast.Module:
    """The tree less the bodies of ``if TYPE_CHECKING:`` blocks (imports for annotations only)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            node.body = [ast.Pass()]
    return tree


def module_paths(package_dir: Path) -> dict[str, Path]:
    """``{module name: source file}`` of every module under ``package_dir`` (e.g. ``envace/``)."""
    return {module_name(p, package_dir): p for p in sorted(package_dir.rglob("*.py"))}


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """``{module: the modules of the same package it imports}``."""
    paths = module_paths(package_dir)
    modules = set(paths)
    return {name: imported(path, name, modules) for name, path in paths.items()}


def closure(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module that running ``start`` (``python -m start``) can load: its imports, theirs, and the
    ``__init__`` of every package on the way (importing ``a.b.c`` runs ``a`` and ``a.b`` first)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module in seen or module not in graph:
            continue
        seen.add(module)
        parts = module.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        todo.extend(graph[module])
    return seen
