"""Shop domain: a product catalogue with stock, one cart and orders.

State: ``{"products": {prd_id: {"name", "price", "stock"}}, "cart": {prd_id: quantity}, "orders":
{ord_id: {"items": {prd_id: quantity}, "total", "status"}}, "next_ids": {"ord": n}}``. Placing an
order takes the cart's items out of stock; cancelling a ``placed`` order puts them back; a
``shipped`` order cannot be cancelled.
"""

from __future__ import annotations

import random
from typing import Any

from envace.envs.toolworld.schema import (
    EMPTY_CART,
    INVALID_STATE,
    NOT_FOUND,
    OUT_OF_STOCK,
    Param,
    ToolError,
    ToolSpec,
)
from envace.envs.toolworld.state import allocate_id, sorted_ids

NAME = "shop"
DESCRIPTION = "an online shop: search products, manage the cart, place, track and cancel orders"
PRODUCT_NAMES = (
    "desk lamp",
    "usb cable",
    "coffee mug",
    "notebook",
    "backpack",
    "water bottle",
    "headphones",
    "phone stand",
    "mouse pad",
    "desk chair",
)
SEARCH_LIMIT = 3


def product(state: dict[str, Any], product_id: str) -> dict[str, Any]:
    found = state["products"].get(product_id)
    if found is None:
        raise ToolError(NOT_FOUND, f"no product with id '{product_id}'")
    return found


def order(state: dict[str, Any], order_id: str) -> dict[str, Any]:
    found = state["orders"].get(order_id)
    if found is None:
        raise ToolError(NOT_FOUND, f"no order with id '{order_id}'")
    return found


def cart_total(state: dict[str, Any]) -> int:
    return sum(state["products"][pid]["price"] * qty for pid, qty in state["cart"].items())


def search(state: dict[str, Any], query: str) -> list[dict[str, Any]]:
    """Products whose name contains ``query`` (case-insensitive), by id, at most SEARCH_LIMIT."""
    products = state["products"]
    hits = [pid for pid in sorted_ids(products) if query.casefold() in products[pid]["name"].casefold()]
    return [{"product_id": pid, **products[pid]} for pid in hits[:SEARCH_LIMIT]]


def _search_products(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    return {"products": search(state, args["query"])}


def _add_to_cart(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    pid = args["product_id"]
    item = product(state, pid)
    wanted = state["cart"].get(pid, 0) + args["quantity"]
    if wanted > item["stock"]:
        raise ToolError(OUT_OF_STOCK, f"only {item['stock']} of {pid} in stock")
    state["cart"][pid] = wanted
    return {"product_id": pid, "quantity": wanted, "cart_total": cart_total(state)}


def _view_cart(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    items = [{"product_id": pid, "quantity": state["cart"][pid]} for pid in sorted_ids(state["cart"])]
    return {"items": items, "total": cart_total(state)}


def _place_order(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    if not state["cart"]:
        raise ToolError(EMPTY_CART, "the cart is empty")
    total = cart_total(state)
    for pid, qty in state["cart"].items():
        state["products"][pid]["stock"] -= qty
    order_id = allocate_id(state, "ord")
    state["orders"][order_id] = {"items": dict(state["cart"]), "total": total, "status": "placed"}
    state["cart"] = {}
    return {"order_id": order_id, "total": total, "status": "placed"}


def _get_order(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    found = order(state, args["order_id"])
    return {"order_id": args["order_id"], "status": found["status"], "total": found["total"]}


def _cancel_order(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    found = order(state, args["order_id"])
    if found["status"] != "placed":
        raise ToolError(INVALID_STATE, f"order {args['order_id']} is {found['status']} and cannot be cancelled")
    for pid, qty in found["items"].items():
        state["products"][pid]["stock"] += qty
    found["status"] = "cancelled"
    return {"order_id": args["order_id"], "status": "cancelled"}


_ORDER_ID = Param("order_id", "string", "Order id, e.g. ord_1.")

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "search_products",
        NAME,
        "Search the catalogue by product name.",
        (Param("query", "string", "Words from the product name.", min_length=1),),
        _search_products,
    ),
    ToolSpec(
        "add_to_cart",
        NAME,
        "Add a quantity of a product to the cart.",
        (
            Param("product_id", "string", "Product id, e.g. prd_3."),
            Param("quantity", "integer", "How many to add.", minimum=1, maximum=20),
        ),
        _add_to_cart,
    ),
    ToolSpec("view_cart", NAME, "Show the cart's items and total.", (), _view_cart),
    ToolSpec("place_order", NAME, "Order everything in the cart and empty it.", (), _place_order),
    ToolSpec("get_order", NAME, "Get an order's status and total.", (_ORDER_ID,), _get_order),
    ToolSpec("cancel_order", NAME, "Cancel an order that has not shipped yet.", (_ORDER_ID,), _cancel_order),
)


def seed_state(rng: random.Random) -> dict[str, Any]:
    """Five products, a cart holding one of them, and two past orders (at least one still placed)."""
    names = rng.sample(PRODUCT_NAMES, 5)
    products = {
        f"prd_{i + 1}": {"name": n, "price": rng.randrange(5, 125, 5), "stock": rng.randint(1, 9)}
        for i, n in enumerate(names)
    }
    ids = list(products)
    in_cart = rng.choice(ids)
    cart = {in_cart: 1}
    orders = {}
    statuses = rng.choice((("shipped", "placed"), ("placed", "shipped"), ("placed", "placed")))
    for number, status in enumerate(statuses, start=1):
        pid = rng.choice(ids)
        qty = rng.randint(1, 2)
        orders[f"ord_{number}"] = {"items": {pid: qty}, "total": products[pid]["price"] * qty, "status": status}
    return {"products": products, "cart": cart, "orders": orders, "next_ids": {"ord": len(orders) + 1}}
