"""The shared ``Registry``: lazy entries ("module:attribute") import on first ``get`` and stay cached;
names list lazy and eager entries; taken names and unknown names fail with clear messages."""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from envace.core.registry import Registry, UnknownName


@pytest.fixture
def plugin_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write throwaway modules on a fresh sys.path entry; returns a writer giving each a unique name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def write(body: str, stem: str = "plugin") -> str:
        name = f"_envace_test_{stem}_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
        written.append(name)
        importlib.invalidate_caches()
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


def test_lazy_entry_resolves_on_first_get_and_is_cached(plugin_modules) -> None:
    module = plugin_modules("class Thing:\n    pass\n")
    reg: Registry[type] = Registry("thing")
    reg.register_lazy("lazy", f"{module}:Thing")
    assert module not in sys.modules  # naming it imports nothing
    thing = reg.get("lazy")
    assert module in sys.modules and thing.__name__ == "Thing" and thing.__module__ == module
    del sys.modules[module]
    assert reg.get("lazy") is thing  # cached: not imported again
    assert module not in sys.modules


def test_names_list_lazy_and_eager_entries(plugin_modules) -> None:
    module = plugin_modules("VALUE = 3\n")
    reg: Registry[int] = Registry("thing")
    reg.register("eager", 1)
    reg.register_lazy("lazy", f"{module}:VALUE")
    assert reg.names() == ["eager", "lazy"] and list(reg) == ["eager", "lazy"]
    assert "lazy" in reg and "other" not in reg
    assert module not in sys.modules
    assert reg.items() == {"eager": 1, "lazy": 3}  # items() imports the lazy entries
    assert reg.names() == ["eager", "lazy"]  # a resolved lazy name is listed once


def test_taken_names(plugin_modules) -> None:
    module = plugin_modules("A = object()\nB = object()\n")
    reg: Registry[object] = Registry("thing")
    reg.register_lazy("x", f"{module}:A")
    reg.register_lazy("x", f"{module}:A")  # the same target again: no-op
    with pytest.raises(ValueError, match=r"thing 'x' is already registered \(lazily"):
        reg.register_lazy("x", f"{module}:B")
    with pytest.raises(ValueError, match="thing 'x' is already registered"):
        reg.register("x", object())  # another item under a lazy name
    reg.register("y", 1)
    with pytest.raises(ValueError, match="thing 'y' is already registered"):
        reg.register_lazy("y", f"{module}:A")
    with pytest.raises(ValueError, match="'module:attribute'"):
        reg.register_lazy("z", module)


def test_a_lazily_named_module_may_register_its_item_itself(plugin_modules) -> None:
    home = plugin_modules("from envace.core.registry import Registry\nREG = Registry('engine')\n", stem="home")
    plugin = plugin_modules(
        f"""
        from {home} import REG

        @REG.register("p")
        class Plugin:
            pass
        """
    )
    reg = __import__(home).REG
    reg.register_lazy("p", f"{plugin}:Plugin")
    found = reg.get("p")
    assert found is sys.modules[plugin].Plugin and reg.names() == ["p"]


def test_a_failed_import_is_not_cached(plugin_modules) -> None:
    reg: Registry[object] = Registry("thing")
    reg.register_lazy("gone", "_envace_test_no_such_module:X")
    for _ in range(2):
        with pytest.raises(ModuleNotFoundError):
            reg.get("gone")
    assert reg.names() == ["gone"]


def test_unknown_name_message() -> None:
    reg: Registry[int] = Registry("thing")
    with pytest.raises(UnknownName, match=r"^unknown thing 'a'; known: \(none\)$"):
        reg.get("a")
    reg.register("b", 1)
    reg.register_lazy("c", "_envace_test_never_imported:X")
    with pytest.raises(UnknownName, match=r"^unknown thing 'a'; known: b, c$"):
        reg.get("a")
    custom: Registry[int] = Registry("engine", unknown="no {kind} named {name!r}; valid: {names}")
    custom.register("b", 1)
    with pytest.raises(KeyError, match=r"^no engine named 'a'; valid: \['b'\]$"):
        custom.get("a")
    with pytest.raises(ValueError, match="no engine named"):  # UnknownName is both
        custom.get("a")
