"""Tool schemas of the reimplemented VitaBench toolkits (general, delivery, in-store).

Parameter names and types follow the reference tools' Python signatures (``src/vita/environment/toolkit.py``,
``src/vita/domains/{delivery,instore}/tools.py``); descriptions here are our own short texts. When the
user's checkout holds the reference description tables (``tools_schema.py`` / ``toolkit_schema.py``), their
description, pre- and post-conditions and per-argument texts (where the argument names agree with the
signature) replace ours: they are read as data with ``ast.literal_eval``, never imported or executed.
OTA tools are not reimplemented; their names/arguments come from the checkout's table when present so the
agent sees them, and calling one returns a ``NOT_REPRODUCED`` error.
"""

from __future__ import annotations

import ast
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

S, INT, N, B = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}
SL, IL = {"type": "array", "items": S}, {"type": "array", "items": INT}


@dataclass(frozen=True)
class VitaToolSpec:
    name: str
    toolkit: str  # general | delivery | instore | ota
    kind: str  # read | write | generic
    params: dict[str, dict[str, Any]]
    required: tuple[str, ...]
    description: str


def _spec(
    toolkit: str, kind: str, name: str, description: str, params: dict[str, Any], optional: tuple[str, ...] = ()
) -> VitaToolSpec:
    return VitaToolSpec(name, toolkit, kind, params, tuple(k for k in params if k not in optional), description)


_SPECS = [
    # general toolkit
    _spec(
        "general",
        "generic",
        "longitude_latitude_to_distance",
        "Distance in metres between two points.",
        {"longitude1": N, "latitude1": N, "longitude2": N, "latitude2": N},
    ),
    _spec(
        "general",
        "generic",
        "weather",
        "Weather of the city of an address between two dates (yyyy-mm-dd).",
        {"address": S, "date_start": S, "date_end": S},
    ),
    _spec(
        "general",
        "generic",
        "address_to_longitude_latitude",
        "[longitude, latitude] of a known address.",
        {"address": S},
    ),
    _spec(
        "general", "generic", "get_date_holiday_info", "Whether a date (yyyy-mm-dd) is a Chinese holiday.", {"date": S}
    ),
    _spec(
        "general", "generic", "get_holiday_date", "Date of a named holiday in a year.", {"year": S, "holiday_name": S}
    ),
    _spec("general", "read", "get_user_historical_behaviors", "The user's profile and historical preferences.", {}),
    _spec("general", "read", "get_user_all_orders", "Every order of the user.", {}),
    _spec(
        "general",
        "read",
        "get_nearby",
        "Businesses within `range` metres of a point.",
        {"longitude": N, "latitude": N, "range": N},
    ),
    # delivery
    _spec(
        "delivery",
        "generic",
        "delivery_distance_to_time",
        "Delivery minutes for a distance in metres.",
        {"distance": N},
    ),
    _spec("delivery", "read", "get_delivery_store_info", "A delivery store with its products.", {"store_id": S}),
    _spec("delivery", "read", "get_delivery_product_info", "One delivery product.", {"product_id": S}),
    _spec(
        "delivery",
        "read",
        "delivery_store_search_recommand",
        "Delivery stores ranked by keyword match.",
        {"keywords": SL},
    ),
    _spec(
        "delivery",
        "read",
        "delivery_product_search_recommand",
        "Delivery products ranked by keyword match.",
        {"keywords": SL},
    ),
    _spec(
        "delivery",
        "write",
        "create_delivery_order",
        "Create an unpaid delivery order from one store (dispatch_time: yyyy-mm-dd HH:MM:SS, not in the past).",
        {
            "user_id": S,
            "store_id": S,
            "product_ids": SL,
            "product_cnts": IL,
            "address": S,
            "dispatch_time": S,
            "attributes": SL,
            "note": S,
        },
        optional=("attributes", "note"),
    ),
    _spec("delivery", "write", "pay_delivery_order", "Pay an unpaid delivery order.", {"order_id": S}),
    _spec("delivery", "read", "get_delivery_order_status", "Status of a delivery order.", {"order_id": S}),
    _spec("delivery", "write", "cancel_delivery_order", "Cancel a delivery order.", {"order_id": S}),
    _spec(
        "delivery",
        "write",
        "modify_delivery_order",
        "Replace the note of a delivery order.",
        {"order_id": S, "note": S},
    ),
    _spec(
        "delivery",
        "read",
        "search_delivery_orders",
        "The user's delivery orders with a status (default unpaid).",
        {"user_id": S, "status": S},
        optional=("status",),
    ),
    _spec("delivery", "read", "get_delivery_order_detail", "Full detail of a delivery order.", {"order_id": S}),
    # in-store
    _spec(
        "instore", "read", "instore_shop_search_recommend", "In-store shops ranked by keyword match.", {"keywords": SL}
    ),
    _spec(
        "instore",
        "read",
        "instore_product_search_recommend",
        "In-store products ranked by keyword match.",
        {"keywords": SL},
    ),
    _spec(
        "instore",
        "write",
        "create_instore_product_order",
        "Create an unpaid order for a shop's product.",
        {"user_id": S, "shop_id": S, "product_id": S, "quantity": INT},
        optional=("quantity",),
    ),
    _spec("instore", "write", "pay_instore_order", "Pay an unpaid in-store order.", {"order_id": S}),
    _spec("instore", "write", "instore_cancel_order", "Cancel an in-store order.", {"order_id": S}),
    _spec(
        "instore",
        "write",
        "instore_book",
        "Book a table (paid booking when the shop charges for it).",
        {"user_id": S, "shop_id": S, "time": S, "customer_count": INT},
        optional=("customer_count",),
    ),
    _spec("instore", "write", "pay_instore_book", "Pay an unpaid table booking.", {"book_id": S}),
    _spec("instore", "write", "instore_cancel_book", "Cancel a table booking.", {"book_id": S}),
    _spec(
        "instore",
        "write",
        "instore_reservation",
        "Reserve a visit (free).",
        {"user_id": S, "shop_id": S, "time": S, "customer_count": INT},
        optional=("customer_count",),
    ),
    _spec(
        "instore",
        "write",
        "instore_modify_reservation",
        "Change the time and party size of a reservation.",
        {"reservation_id": S, "time": S, "customer_count": INT},
        optional=("customer_count",),
    ),
    _spec("instore", "write", "instore_cancel_reservation", "Cancel a reservation.", {"reservation_id": S}),
    _spec("instore", "read", "get_instore_orders", "The user's in-store orders.", {"user_id": S}),
    _spec("instore", "read", "get_instore_reservations", "The user's reservations.", {"user_id": S}),
    _spec("instore", "read", "get_instore_books", "The user's table bookings.", {"user_id": S}),
    _spec(
        "instore",
        "read",
        "search_instore_book",
        "One booking, or all of the user's.",
        {"user_id": S, "book_id": S},
        optional=("book_id",),
    ),
    _spec(
        "instore",
        "read",
        "search_instore_reservation",
        "One reservation, or all of the user's.",
        {"user_id": S, "reservation_id": S},
        optional=("reservation_id",),
    ),
]
TOOL_SPECS: dict[str, VitaToolSpec] = {s.name: s for s in _SPECS}


# ---- reference descriptions (data only) ---------------------------------------------------------------
def _literal_tables(path: Path) -> dict[str, dict[str, Any]]:
    """Top-level ``NAME = {...}`` dict literals of a Python file, evaluated as literals only."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = {}
    for node in tree.body:
        single = isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        if single and isinstance(node.value, ast.Dict):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return out


def read_reference_descriptions(files: Mapping[str, Path], language: str) -> dict[str, dict[str, Any]]:
    """``{tool: {"description", "preconditions", "postconditions", "args"}}`` from the checkout's tables."""
    suffix = "_EN" if language == "english" else "_ZH"
    out: dict[str, dict[str, Any]] = {}
    for toolkit, path in files.items():
        try:
            tables = _literal_tables(path)
        except (OSError, SyntaxError) as exc:
            logger.warning("cannot read VitaBench descriptions from %s (%s); using built-in texts", path, exc)
            continue
        for name, table in tables.items():
            if name.endswith(suffix) and isinstance(table, dict):
                for tool, entry in table.items():
                    if isinstance(entry, dict):
                        out[str(tool)] = {**entry, "toolkit": toolkit}
    return out


def _described(spec: VitaToolSpec, ref: Mapping[str, Any] | None) -> tuple[str, dict[str, dict[str, Any]]]:
    if not ref:
        return spec.description, dict(spec.params)
    parts = [str(ref.get("description") or spec.description)]
    for key, label in (("preconditions", "Precondition"), ("postconditions", "Postcondition")):
        if ref.get(key):
            parts.append(f"{label}: {ref[key]}")
    arg_texts = ref.get("args") if isinstance(ref.get("args"), dict) else {}
    params = {
        k: ({**v, "description": str(arg_texts[k])} if k in arg_texts else dict(v)) for k, v in spec.params.items()
    }
    return "\n".join(parts), params


def openai_schema(spec: VitaToolSpec, ref: Mapping[str, Any] | None = None) -> dict[str, Any]:
    description, params = _described(spec, ref)
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": description,
            "parameters": {"type": "object", "properties": params, "required": list(spec.required)},
        },
    }


def ota_schemas(reference: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Schemas of the (not reimplemented) OTA tools from the checkout's table: string args, all optional."""
    out = []
    for name, ref in reference.items():
        if ref.get("toolkit") != "ota" or name in TOOL_SPECS:
            continue
        args = ref.get("args") if isinstance(ref.get("args"), dict) else {}
        props = {k: {"type": "string", "description": str(v)} for k, v in args.items()}
        description = f"{ref.get('description', '')}\n(not reproduced offline: calls return NOT_REPRODUCED)"
        out.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": description.strip(),
                    "parameters": {"type": "object", "properties": props},
                },
            }
        )
    return out


def tool_schemas(toolkits: tuple[str, ...], reference: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """General tools + the tools of ``toolkits`` (reference descriptions merged when available)."""
    chosen = [s for s in _SPECS if s.toolkit == "general" or s.toolkit in toolkits]
    schemas = [openai_schema(s, reference.get(s.name)) for s in chosen]
    if "ota" in toolkits:
        schemas.extend(ota_schemas(reference))
    return tuple(schemas)


# OTA tool names of the reference (not reimplemented; calling one answers NOT_REPRODUCED)
OTA_TOOL_NAMES = frozenset(
    {
        "get_ota_hotel_info",
        "get_ota_attraction_info",
        "get_ota_flight_info",
        "get_ota_train_info",
        "hotel_search_recommand",
        "attractions_search_recommend",
        "flight_search_recommend",
        "train_ticket_search",
        "create_hotel_order",
        "create_attraction_order",
        "create_flight_order",
        "create_train_order",
        "pay_hotel_order",
        "pay_attraction_order",
        "pay_flight_order",
        "pay_train_order",
        "search_hotel_order",
        "search_attraction_order",
        "search_flight_order",
        "search_train_order",
        "get_hotel_order_detail",
        "get_attraction_order_detail",
        "get_flight_order_detail",
        "get_train_order_detail",
        "modify_train_order",
        "modify_flight_order",
        "cancel_hotel_order",
        "cancel_attraction_order",
        "cancel_flight_order",
        "cancel_train_order",
    }
)
