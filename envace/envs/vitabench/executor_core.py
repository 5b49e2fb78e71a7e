"""Shared machinery of the reimplemented VitaBench tools: errors, time parsing, distances, ranking, dispatch.

See ``environment.py`` for what is and is not reproduced. Tool handlers are methods named ``_t_<tool>`` on
the mixins in ``tools_general.py``, ``tools_delivery.py`` and ``tools_instore.py``.
"""

from __future__ import annotations

import copy
import difflib
import math
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from envace.core.records import ToolCall
from envace.envs.vitabench.schemas import OTA_TOOL_NAMES, TOOL_SPECS

TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
DATE_FORMAT = "%Y-%m-%d"


class Rejected(Exception):
    """A request the tool declines (the reference's assertion messages)."""


class Failure(Exception):
    """A request the tool cannot process (the reference's exceptions)."""


def parse_time(text: Any, fmt: str = TIME_FORMAT, what: str = "time") -> datetime:
    try:
        return datetime.strptime(str(text), fmt)
    except ValueError:
        human = "yyyy-mm-dd HH:MM:SS" if fmt == TIME_FORMAT else "yyyy-mm-dd"
        raise Rejected(f"{what} {text!r} has an invalid format; {human} required") from None


def haversine_m(lon1: float, lat1: float, lon2: float, lat2: float) -> float:
    """Great-circle distance in whole metres (Earth radius 6371 km)."""
    if (lon1, lat1) == (lon2, lat2):
        return 0.0
    p1, p2, dl = math.radians(lat1), math.radians(lat2), math.radians(lon2 - lon1)
    h = math.sin((p2 - p1) / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return float(round(2 * 6_371_000 * math.asin(math.sqrt(h))))


def keyword_rank(keywords: Any, docs: Mapping[str, str], top_k: int) -> list[str]:
    """Ids ordered by match: whole keywords contained, then share of their words contained, then difflib
    similarity of the joined keywords, then input order (CJK keywords have no spaces: whole-keyword match)."""
    phrases = [str(k).lower() for k in (keywords if isinstance(keywords, list) else [keywords]) if str(k).strip()]
    words = [w for p in phrases for w in p.split()]
    joined = "".join(phrases)

    def score(item: tuple[int, tuple[str, str]]) -> tuple[int, float, float, int]:
        index, (_, text) = item
        low = text.lower()
        whole = sum(1 for p in phrases if p in low)
        share = sum(1 for w in words if w in low) / len(words) if words else 0.0
        return (-whole, -share, -difflib.SequenceMatcher(None, joined, low).ratio(), index)

    return [key for _, (key, _) in sorted(enumerate(docs.items()), key=score)][:top_k]


class ExecutorCore:
    """Database copy, dispatch and helpers shared by the tool mixins."""

    def __init__(self, environment: Mapping[str, Any], toolkits: tuple[str, ...] | None = None) -> None:
        """``toolkits``: the domain toolkits the task offers (general tools always); None = all."""
        self.toolkits = None if toolkits is None else frozenset(("general", *toolkits))
        self.db: dict[str, Any] = copy.deepcopy(dict(environment))
        self.db["orders"] = dict(self.db.get("orders") or {})
        if "shops" in self.db:
            self.db["books"] = dict(self.db.get("books") or {})
            self.db["reservations"] = dict(self.db.get("reservations") or {})
        self.now = parse_time(self.db.get("time"), what="environment.time")
        self.calls = 0
        self.failures = 0
        self.created: list[str] = []

    # ---- dispatch -----------------------------------------------------------------------------
    def execute(self, call: ToolCall) -> Any:
        self.calls += 1
        try:
            return self._run(call)
        except Rejected as exc:
            return {"error": str(exc)}
        except Failure as exc:
            self.failures += 1
            return {"error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - like the reference, any tool exception is an error response
            self.failures += 1
            return {"error": f"{call.name} failed: {type(exc).__name__}: {exc}"}

    def _run(self, call: ToolCall) -> Any:
        spec = TOOL_SPECS.get(call.name)
        handler: Callable[..., Any] | None = getattr(self, f"_t_{call.name}", None)
        if self.toolkits is not None and spec is not None and spec.toolkit not in self.toolkits:
            spec = None
        if spec is None or handler is None:
            code = "NOT_REPRODUCED" if spec is None and call.name in OTA_TOOL_NAMES else "UNKNOWN_TOOL"
            raise Failure(f"{code}: tool {call.name!r} is not available in this offline environment")
        unknown = sorted(set(call.arguments) - set(spec.params))
        missing = [k for k in spec.required if k not in call.arguments]
        if unknown or missing:
            raise Failure(f"{call.name}: unexpected arguments {unknown} / missing arguments {missing}")
        return handler(**call.arguments)

    def state(self) -> dict[str, Any]:
        tables = ("orders", "books", "reservations")
        return {
            **{t: copy.deepcopy(self.db[t]) for t in tables if t in self.db},
            "created": list(self.created),
            "calls": self.calls,
            "failures": self.failures,
        }

    # ---- helpers ------------------------------------------------------------------------------
    def _check_user(self, user_id: Any) -> None:
        if not user_id:
            raise Rejected("User ID cannot be empty")
        if user_id != self.db.get("user_id"):
            raise Rejected("User ID does not match")

    def _new_id(self, prefix: str) -> str:
        self.created.append(f"{prefix}{len(self.created) + 1:04d}")
        return self.created[-1]

    def _stamp(self) -> str:
        return self.now.strftime(TIME_FORMAT)

    def _known_locations(self) -> dict[str, dict[str, Any]]:
        places: dict[str, dict[str, Any]] = {}
        for loc in self.db.get("location") or []:
            places[loc["address"]] = loc
        for table in ("stores", "shops"):
            for item in (self.db.get(table) or {}).values():
                if isinstance(item.get("location"), dict):
                    places.setdefault(item["location"]["address"], item["location"])
        for order in self.db["orders"].values():
            if isinstance(order.get("location"), dict):
                places.setdefault(order["location"]["address"], order["location"])
        return places

    def _store(self, store_id: str) -> dict[str, Any]:
        store = (self.db.get("stores") or {}).get(store_id)
        if store is None:
            raise Failure(f"Store {store_id} not found")
        return store

    def _shop(self, shop_id: str) -> dict[str, Any]:
        shop = (self.db.get("shops") or {}).get(shop_id)
        if shop is None:
            raise Failure(f"Shop {shop_id} does not exist")
        return shop

    def _products(self, table: str) -> dict[str, dict[str, Any]]:
        return {p["product_id"]: p for item in (self.db.get(table) or {}).values() for p in item.get("products", [])}

    def _order(self, order_id: str, order_type: str) -> dict[str, Any]:
        order = self.db["orders"].get(order_id)
        if order is None:
            raise Failure(f"Order {order_id} not found")
        if order.get("order_type") != order_type:
            raise Failure(f"Order {order_id} is not a {order_type} order")
        return order

    @staticmethod
    def _summary(item: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in item.items() if k != "products"}
