"""The import graph of envace/ has no circles, its packages keep their floors, only engines/verl imports verl, Ray.

The graph is envace.utils.imports's: every import counts, module-level and inside functions, ``from x import
y`` (an edge to ``x``, and to ``x.y`` when that is a module), and ``importlib.import_module("...")`` with a
literal name. A package's ``__init__`` is a module of its own, so a submodule importing its own package while
the package imports it is a circle too.

The package order (``LAYERS``, bottom first) is the house plan of docs/ARCHITECTURE.md: a module may import
its own package and the packages on the floors below it, never one above. Imports inside functions count
as module-level ones do; an import under ``if TYPE_CHECKING:`` would be exempt (annotations only, never
run), though envace has none today.
"""

from __future__ import annotations

import ast
from pathlib import Path

from envace.utils import imports

ROOT = Path(__file__).resolve().parents[2] / "envace"


def import_graph() -> dict[str, set[str]]:
    return imports.import_graph(ROOT)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


# envace's packages from the bottom floor up (envace/<name>/, one floor each); docs/ARCHITECTURE.md says
# what each owns. A new package gets a floor here before anything imports it.
LAYERS = (
    "utils",  # stdlib-level helpers: JSON I/O, the machine, the allocator, secrets, seeds, telemetry
    "core",  # pure records and rules: EpisodeSpec, the env contracts, advantages, prompts, registries
    "config",  # the typed config schema, its enums, composing conf/
    "tracking",  # the Tracker interface and MLflow
    "models",  # model and tokenizer loaders
    "runtime",  # the torch runtime: attention, KV cache, lean decoder, decoding, GEMM, precision
    "inference",  # chat backends: local (on the runtime), OpenAI-compatible clients and server
    "judges",  # checklist judges and rewards
    "evaluation",  # the evaluation episode loop, policies, metrics
    "data",  # data sets, episode specs, the data-source registry
    "envs",  # the environments (tool world, BFCL, tau2, FinMCP, VitaBench) and the built-in data sources
    "rehearsal",  # the test-time rehearsal controllers
    "engines",  # the training engines: interface and registry, local, verl
    "reporting",  # metrics files, tables, plots, the experiments collector
    "stages",  # the DVC stages
)


def package_of(module: str) -> str | None:
    """``envace.engines.local.rollout`` -> ``engines``; the top-level ``envace`` package itself -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def upward_imports(graph: dict[str, set[str]], layers: tuple[str, ...] = LAYERS) -> list[str]:
    """Every import from a package to one on a higher floor, and every module in a package with no floor."""
    floor = {name: i for i, name in enumerate(layers)}
    found = []
    for module in sorted(graph):
        source = package_of(module)
        if source is None:
            continue
        if source not in floor:
            found.append(f"{module}: package {source!r} has no floor in LAYERS")
            continue
        for target in sorted(graph[module]):
            dest = package_of(target)
            if dest is not None and floor.get(dest, len(layers)) > floor[source]:
                found.append(f"{module} (floor {floor[source]}: {source}) imports {target} (floor {floor.get(dest)})")
    return found


def test_the_order_rule_finds_an_upward_import():
    graph = {"envace.core.a": {"envace.stages.b"}, "envace.stages.b": {"envace.core.a"}, "envace.x.c": set()}
    assert upward_imports(graph, ("core", "stages")) == [
        "envace.core.a (floor 0: core) imports envace.stages.b (floor 1)",
        "envace.x.c: package 'x' has no floor in LAYERS",
    ]


def test_packages_import_only_their_own_floor_and_below():
    found = upward_imports(import_graph())
    assert not found, (
        "imports that run up the package order (LAYERS; move the shared piece down a floor instead): "
        + "; ".join(found)
    )


def test_the_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_in_envace():
    found = circles(import_graph())
    assert not found, "import circles (break each by moving the shared piece down a layer): " + "; ".join(
        " <-> ".join(c) for c in found
    )


def test_core_never_imports_verl_nor_the_engines():
    graph = import_graph()
    core = {m for m in graph if m.startswith("envace.core")}
    for module in sorted(core):
        path = (ROOT.parent / module.replace(".", "/")).with_suffix(".py")
        if not path.exists():
            path = ROOT.parent / module.replace(".", "/") / "__init__.py"
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0] == "verl"], f"{module} imports verl"
        assert not {m for m in graph[module] if not m.startswith("envace.core")}, (
            f"{module} imports {sorted(m for m in graph[module] if not m.startswith('envace.core'))} outside core"
        )


def test_one_episode_spec_class():
    def defines(path: Path) -> bool:
        tree = ast.parse(path.read_text())
        return any(isinstance(n, ast.ClassDef) and n.name == "EpisodeSpec" for n in ast.walk(tree))

    defining = [p for p in ROOT.rglob("*.py") if "class EpisodeSpec" in p.read_text() and defines(p)]
    assert [p.relative_to(ROOT.parent).as_posix() for p in defining] == ["envace/core/records.py"]


def test_no_two_classes_share_a_name():
    """One class per name across envace/ (a record, an enum and a protocol of one concept each have their
    own name: e.g. ``DataSourceName`` the config's enum, ``DataSource`` the registered source)."""
    places: dict[str, list[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                places.setdefault(node.name, []).append(path.relative_to(ROOT.parent).as_posix())
    assert {name: where for name, where in places.items() if len(where) > 1} == {}


GPU_STACK = ("verl", "ray")  # the GPU engine's dependencies: loading them costs seconds and prints warnings


def gpu_stack_importers(root: Path) -> dict[str, list[str]]:
    """Modules under ``root`` outside engines/verl that import verl or Ray (anywhere, functions included)."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[:2] == ("engines", "verl"):
            continue
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level]
        hits = sorted({n for n in names if n.split(".")[0] in GPU_STACK})
        if hits:
            found[str(path.relative_to(root))] = hits
    return found


def test_only_the_verl_engine_imports_verl_or_ray():
    found = gpu_stack_importers(ROOT)
    assert not found, (
        f"only envace/engines/verl/ may import {'/'.join(GPU_STACK)} (CPU runs must not load them): {found}"
    )
