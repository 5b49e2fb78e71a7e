"""A small registry of named things (data sources, adapters, ...), shared by every plug-in point.

``Registry("data source")`` maps names to items; ``register`` adds one (usable as a decorator) and
``get`` returns it, or raises ``UnknownName`` listing the known names. Registering another item under
a taken name is an error; registering the same item again is a no-op (a module imported twice).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownName(KeyError, ValueError):
    """No item is registered under the name (a ``KeyError`` and a ``ValueError``, for either caller)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Named items of one kind (``kind`` is used in error messages)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, item: T | None = None) -> Any:
        """Register ``item`` under ``name``; without ``item``, a decorator registering what it decorates."""

        def _register(value: T) -> T:
            if name in self._items and self._items[name] is not value:
                raise ValueError(f"{self.kind} {name!r} is already registered ({self._items[name]!r})")
            self._items[name] = value
            return value

        return _register if item is None else _register(item)

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownName(f"unknown {self.kind} {name!r}; known: {', '.join(self.names()) or '(none)'}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def items(self, where: Callable[[T], bool] = lambda _: True) -> dict[str, T]:
        """The registered items (those for which ``where`` holds), by name."""
        return {name: self._items[name] for name in self.names() if where(self._items[name])}
