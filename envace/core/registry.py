"""A small registry of named things, shared by every plug-in point (data sources, judges, engines,
benchmarks, model loaders).

``Registry("data source")`` maps names to items; ``register`` adds one (usable as a decorator) and
``get`` returns it, or raises ``UnknownName`` listing the known names. Registering another item under
a taken name is an error; registering the same item again is a no-op (a module imported twice).

``register_lazy(name, "module:attribute")`` names an item without importing it: the first ``get``
imports the module, takes the attribute and keeps it. ``names()`` lists lazy names as well, resolved
or not. The lazily named module may register the item itself while it is being imported (a decorator
on the class); that is allowed when the item is the one the lazy entry names (same module and
qualified name), and ``get`` then checks that the attribute is that very item.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

DEFAULT_UNKNOWN = "unknown {kind} {name!r}; known: {known}"


class UnknownName(KeyError, ValueError):
    """No item is registered under the name (a ``KeyError`` and a ``ValueError``, for either caller)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _address(item: Any) -> str | None:
    """``"module:qualname"`` of a class or function (what a lazy entry names), None for other items."""
    module, qualname = getattr(item, "__module__", None), getattr(item, "__qualname__", None)
    return f"{module}:{qualname}" if isinstance(module, str) and isinstance(qualname, str) else None


class Registry(Generic[T]):
    """Named items of one kind (``kind`` is used in error messages).

    ``unknown`` is the message of ``UnknownName``, a ``str.format`` template with the fields ``kind``,
    ``name`` (the name asked for), ``names`` (the sorted list of known names) and ``known`` (those
    names joined by ", ", or "(none)").
    """

    def __init__(self, kind: str, unknown: str = DEFAULT_UNKNOWN) -> None:
        self.kind = kind
        self.unknown = unknown
        self._items: dict[str, T] = {}
        self._lazy: dict[str, str] = {}  # name -> "module:attribute", kept after resolution

    def register(self, name: str, item: T | None = None) -> Any:
        """Register ``item`` under ``name``; without ``item``, a decorator registering what it decorates."""

        def _register(value: T) -> T:
            if name in self._items:
                if self._items[name] is not value:
                    raise ValueError(f"{self.kind} {name!r} is already registered ({self._items[name]!r})")
            elif name in self._lazy and _address(value) != self._lazy[name]:
                raise ValueError(f"{self.kind} {name!r} is already registered (lazily, as {self._lazy[name]!r})")
            self._items[name] = value
            return value

        return _register if item is None else _register(item)

    def register_lazy(self, name: str, target: str) -> None:
        """Name the item at ``target`` ("module:attribute") without importing it; the first ``get`` does."""
        module, sep, attribute = target.partition(":")
        if not (module and sep and attribute):
            raise ValueError(f"{self.kind} {name!r}: a lazy target is 'module:attribute', not {target!r}")
        if name in self._lazy:
            if self._lazy[name] != target:
                raise ValueError(f"{self.kind} {name!r} is already registered (lazily, as {self._lazy[name]!r})")
            return
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is already registered ({self._items[name]!r})")
        self._lazy[name] = target

    def get(self, name: str) -> T:
        if name in self._items:  # registered, or lazy and already resolved
            return self._items[name]
        if name not in self._lazy:
            raise UnknownName(self._unknown_message(name))
        return self._resolve(name)

    def _resolve(self, name: str) -> T:
        target = self._lazy[name]
        module, _, attribute = target.partition(":")
        value = getattr(importlib.import_module(module), attribute)  # may register the name itself
        if name in self._items and self._items[name] is not value:
            raise ValueError(
                f"{self.kind} {name!r}: {target!r} is not the item registered under that name ({self._items[name]!r})"
            )
        self._items[name] = value
        return value

    def _unknown_message(self, name: str) -> str:
        names = self.names()
        return self.unknown.format(kind=self.kind, name=name, names=names, known=", ".join(names) or "(none)")

    def names(self) -> list[str]:
        """Every registered name, lazy ones included (resolved or not), sorted."""
        return sorted({*self._items, *self._lazy})

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def items(self, where: Callable[[T], bool] = lambda _: True) -> dict[str, T]:
        """The registered items (those for which ``where`` holds), by name; lazy entries are imported."""
        return {name: item for name in self.names() if where(item := self.get(name))}
