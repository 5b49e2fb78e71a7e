"""Shop scenarios: price check (search), find-and-add (search_products → add_to_cart on the found id),
add by id, view cart, checkout, order status, cancel an order, an out-of-stock error path, and
follow-ups ("place the order", "cancel that order")."""

from __future__ import annotations

from envace.core.json_paths import Match
from envace.envs.toolworld.domains.shop import cart_total
from envace.envs.toolworld.planning import (
    PlannedTurn,
    Ref,
    Scenario,
    ScenarioInput,
)
from envace.envs.toolworld.scenarios.common import call, one_step, phrase
from envace.envs.toolworld.schema import OUT_OF_STOCK
from envace.envs.toolworld.state import sorted_ids


def _addable(inp: ScenarioInput) -> list[str]:
    """Products of which at least one more unit fits in the cart."""
    cart = inp.state["cart"]
    return [p for p in sorted_ids(inp.state["products"]) if inp.state["products"][p]["stock"] > cart.get(p, 0)]


def _room(inp: ScenarioInput, product_id: str) -> int:
    return inp.state["products"][product_id]["stock"] - inp.state["cart"].get(product_id, 0)


def _price_check(inp: ScenarioInput) -> PlannedTurn:
    pid = inp.rng.choice(sorted_ids(inp.state["products"]))
    item = inp.state["products"][pid]
    k = inp.key("search")
    user = phrase(
        inp,
        ("How much does the {name} cost?", "What's the price of a {name}?", "Do you have a {name}? How much is it?"),
        name=item["name"],
    )
    hit = ("products", Match.of(name=item["name"]))
    fields = {
        "name": item["name"],
        "pid": Ref(k, (*hit, "product_id")),
        "price": Ref(k, (*hit, "price")),
        "stock": Ref(k, (*hit, "stock")),
    }
    return PlannedTurn(
        user,
        one_step(call(k, "search_products", query=item["name"])),
        "The {name} ({pid}) costs {price}; {stock} in stock.",
        fields,
        ("price",),
    )


def _add_found(inp: ScenarioInput) -> PlannedTurn | None:
    options = _addable(inp)
    if not options:
        return None
    pid = inp.rng.choice(options)
    name, qty = inp.state["products"][pid]["name"], inp.rng.randint(1, min(2, _room(inp, pid)))
    ks, ka = inp.key("search"), inp.key("add")
    user = phrase(
        inp,
        (
            "Please add {qty} {name} to my cart.",
            "I'd like {qty} {name} in my cart, please.",
            "Find the {name} and put {qty} in my cart.",
        ),
        qty=qty,
        name=name,
    )
    pid_ref = Ref(ks, ("products", Match.of(name=name), "product_id"))
    steps = ((call(ks, "search_products", query=name),), (call(ka, "add_to_cart", product_id=pid_ref, quantity=qty),))
    return PlannedTurn(
        user,
        steps,
        "Added {qty} x {name} ({pid}) to your cart. Cart total: {total}.",
        {"qty": qty, "name": name, "pid": pid_ref, "total": Ref(ka, ("cart_total",))},
        ("total",),
        {"cart": True},
    )


def _add_by_id(inp: ScenarioInput) -> PlannedTurn | None:
    options = _addable(inp)
    if not options:
        return None
    pid = inp.rng.choice(options)
    qty = inp.rng.randint(1, min(3, _room(inp, pid)))
    k = inp.key("add")
    user = phrase(inp, ("Add {qty} of {pid} to my cart.", "Put {qty} x {pid} in the cart."), qty=qty, pid=pid)
    return PlannedTurn(
        user,
        one_step(call(k, "add_to_cart", product_id=pid, quantity=qty)),
        "Added {qty} x {pid} to your cart. Cart total: {total}.",
        {"qty": qty, "pid": pid, "total": Ref(k, ("cart_total",))},
        ("total",),
        {"cart": True},
    )


def _view_cart(inp: ScenarioInput) -> PlannedTurn:
    k = inp.key("cart")
    user = phrase(inp, ("What's in my cart?", "Show me my cart.", "How much is my cart right now?"))
    cart = inp.state["cart"]
    listing = ", ".join(f"{cart[p]} x {p}" for p in sorted_ids(cart)) or "nothing"
    return PlannedTurn(
        user,
        one_step(call(k, "view_cart")),
        "Your cart has {listing}. Total: {total}.",
        {"listing": listing, "total": cart_total(dict(inp.state))},
        ("total",),
    )


def _checkout(inp: ScenarioInput) -> PlannedTurn | None:
    if not inp.state["cart"]:
        return None
    k = inp.key("order")
    user = phrase(inp, ("Please place my order.", "I'm ready to check out.", "Go ahead and order what's in my cart."))
    return _order_turn(inp, user, k)


def _order_turn(inp: ScenarioInput, user: str, k: str) -> PlannedTurn:
    oid = Ref(k, ("order_id",))
    return PlannedTurn(
        user,
        one_step(call(k, "place_order")),
        "Order {order_id} is placed; total {total}.",
        {"order_id": oid, "total": Ref(k, ("total",))},
        ("order_id", "total"),
        {"order": {"id": oid}},
    )


def _order_status(inp: ScenarioInput) -> PlannedTurn:
    oid = inp.rng.choice(sorted_ids(inp.state["orders"]))
    k = inp.key("status")
    user = phrase(
        inp, ("What's the status of order {oid}?", "Has order {oid} shipped yet?", "Check on order {oid}."), oid=oid
    )
    return PlannedTurn(
        user,
        one_step(call(k, "get_order", order_id=oid)),
        "Order {oid} is {status} (total {total}).",
        {"oid": oid, "status": Ref(k, ("status",)), "total": Ref(k, ("total",))},
        ("status",),
    )


def _cancel_order(inp: ScenarioInput) -> PlannedTurn | None:
    orders = inp.state["orders"]
    placed = [o for o in sorted_ids(orders) if orders[o]["status"] == "placed"]
    if not placed:
        return None
    oid = inp.rng.choice(placed)
    k = inp.key("cancel")
    user = phrase(inp, ("Please cancel order {oid}.", "I want to cancel my order {oid}."), oid=oid)
    return PlannedTurn(
        user,
        one_step(call(k, "cancel_order", order_id=oid)),
        "Order {oid} is {status}.",
        {"oid": oid, "status": Ref(k, ("status",))},
        ("oid", "status"),
    )


def _out_of_stock(inp: ScenarioInput) -> PlannedTurn:
    pid = inp.rng.choice(sorted_ids(inp.state["products"]))
    stock = inp.state["products"][pid]["stock"]
    qty = stock - inp.state["cart"].get(pid, 0) + inp.rng.randint(1, 5)
    user = phrase(inp, ("Add {qty} of {pid} to my cart.", "Put {qty} x {pid} in the cart."), qty=qty, pid=pid)
    planned = call(inp.key("add"), "add_to_cart", OUT_OF_STOCK, product_id=pid, quantity=qty)
    return PlannedTurn(
        user, one_step(planned), "Sorry, only {stock} of {pid} are in stock.", {"stock": stock, "pid": pid}, ("stock",)
    )


def _order_follow_up(inp: ScenarioInput) -> PlannedTurn:
    user = phrase(inp, ("Great, please place the order.", "Thanks. Now check out, please."))
    return _order_turn(inp, user, inp.key("order"))


def _cancel_follow_up(inp: ScenarioInput) -> PlannedTurn:
    oid = inp.context["order"]["id"]
    k = inp.key("cancel")
    user = phrase(inp, ("Actually, cancel that order.", "Hmm, I changed my mind: please cancel it."))
    return PlannedTurn(
        user,
        one_step(call(k, "cancel_order", order_id=oid)),
        "Order {order_id} is {status}.",
        {"order_id": oid, "status": Ref(k, ("status",))},
        ("order_id", "status"),
    )


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("price_check", ("search_products",), _price_check),
    Scenario("find_and_add", ("search_products", "add_to_cart"), _add_found, provides=("cart",)),
    Scenario("add_by_id", ("add_to_cart",), _add_by_id, provides=("cart",)),
    Scenario("view_cart", ("view_cart",), _view_cart),
    Scenario("checkout", ("place_order",), _checkout, provides=("order",)),
    Scenario("order_status", ("get_order",), _order_status),
    Scenario("cancel_order", ("cancel_order",), _cancel_order),
    Scenario("out_of_stock", ("add_to_cart",), _out_of_stock),
    Scenario("place_it", ("place_order",), _order_follow_up, requires="cart", provides=("order",)),
    Scenario("cancel_it", ("cancel_order",), _cancel_follow_up, requires="order"),
)
