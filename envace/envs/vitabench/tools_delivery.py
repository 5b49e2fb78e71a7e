"""Delivery tools of VitaBench, reimplemented over the task database (see ``environment.py``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from envace.envs.vitabench.executor_core import (
    TIME_FORMAT,
    ExecutorCore,
    Failure,
    Rejected,
    haversine_m,
    keyword_rank,
    parse_time,
)

MINUTES_BASE, MINUTES_PER_METRE = 25.0, 0.00651
SEARCH_TOP_K = 100


def delivery_minutes(distance_m: float) -> float:
    """The reference's delivery-time rule: 25 minutes + 0.00651 per whole metre, rounded."""
    return float(round(MINUTES_BASE + int(distance_m) * MINUTES_PER_METRE))


class DeliveryTools(ExecutorCore):
    def _t_delivery_distance_to_time(self, distance: Any) -> dict[str, Any]:
        if isinstance(distance, bool) or not isinstance(distance, (int, float)):
            raise Rejected(f"distance must be a number, got {type(distance).__name__}")
        return {"minutes": delivery_minutes(distance)}

    def _t_get_delivery_store_info(self, store_id: str) -> dict[str, Any]:
        return self._store(store_id)

    def _t_get_delivery_product_info(self, product_id: str) -> dict[str, Any]:
        product = self._products("stores").get(product_id)
        if product is None:
            raise Failure(f"{product_id} not found")
        return product

    def _t_delivery_store_search_recommand(self, keywords: Any) -> dict[str, Any]:
        stores = self.db.get("stores") or {}
        docs = {sid: s.get("name", "") + ",".join(s.get("tags", [])) for sid, s in stores.items()}
        return {"stores": [self._summary(stores[sid]) for sid in keyword_rank(keywords, docs, SEARCH_TOP_K)]}

    def _t_delivery_product_search_recommand(self, keywords: Any) -> dict[str, Any]:
        products = self._products("stores")
        docs = {
            pid: f"{p.get('store_name', '')} {p.get('name', '')} {p.get('tags', [])}" for pid, p in products.items()
        }
        return {"products": [products[pid] for pid in keyword_rank(keywords, docs, SEARCH_TOP_K)]}

    def _check_delivery_request(
        self, user_id: str, store_id: str, product_ids: Any, product_cnts: Any, address: str, dispatch_time: str
    ) -> None:
        self._check_user(user_id)
        if store_id not in (self.db.get("stores") or {}):
            raise Rejected(f"Store {store_id} not found")
        if not isinstance(product_ids, list) or not isinstance(product_cnts, list):
            raise Rejected("product_ids and product_cnts must be lists")
        missing = [p for p in product_ids if p not in self._products("stores")]
        if missing:
            raise Failure(f"{missing[0]} not found")
        if not address:
            raise Rejected("Location is empty")
        if len(product_ids) != len(product_cnts) or not all(isinstance(c, int) and c > 0 for c in product_cnts):
            raise Rejected(f"product_cnts {product_cnts} list is invalid")
        if parse_time(dispatch_time, what="dispatch_time") < self.now:
            raise Rejected(f"dispatch_time {dispatch_time} must be in the future")

    def _t_create_delivery_order(
        self,
        user_id: str,
        store_id: str,
        product_ids: list,
        product_cnts: list,
        address: str,
        dispatch_time: str,
        attributes: list | None = None,
        note: str | None = "",
    ) -> dict[str, Any]:
        self._check_delivery_request(user_id, store_id, product_ids, product_cnts, address, dispatch_time)
        store = self._store(store_id)
        longitude, latitude = self._t_address_to_longitude_latitude(address)  # type: ignore[attr-defined]
        distance = haversine_m(
            longitude, latitude, float(store["location"]["longitude"]), float(store["location"]["latitude"])
        )
        minutes = delivery_minutes(distance)
        catalogue = self._products("stores")
        attrs = (list(attributes or []) + [""] * len(product_ids))[: len(product_ids)]
        lines = [
            {**catalogue[p], "quantity": c, "attributes": a or ""} for p, c, a in zip(product_ids, product_cnts, attrs)
        ]
        order = {
            "order_id": self._new_id("OD"),
            "order_type": "delivery",
            "user_id": user_id,
            "store_id": store_id,
            "location": {"address": address, "longitude": longitude, "latitude": latitude},
            "dispatch_time": dispatch_time,
            "shipping_time": minutes,
            "delivery_time": (parse_time(dispatch_time) + timedelta(minutes=minutes)).strftime(TIME_FORMAT),
            "total_price": round(sum(float(line["price"]) * line["quantity"] for line in lines), 2),
            "create_time": self._stamp(),
            "update_time": self._stamp(),
            "note": note or "",
            "products": lines,
            "status": "unpaid",
        }
        self.db["orders"][order["order_id"]] = order
        return order

    def _t_pay_delivery_order(self, order_id: str) -> dict[str, Any]:
        order = self._order(order_id, "delivery")
        if order["status"] != "unpaid":
            raise Rejected("Order is not in `unpaid` status.")
        order.update(status="paid", update_time=self._stamp())
        return {"message": "Payment successful", "order_id": order_id}

    def _t_get_delivery_order_status(self, order_id: str) -> dict[str, Any]:
        return {"order_id": order_id, "status": self._order(order_id, "delivery")["status"]}

    def _t_cancel_delivery_order(self, order_id: str) -> dict[str, Any]:
        order = self._order(order_id, "delivery")
        if order["status"] == "cancelled":
            raise Rejected(f"Order {order_id} is already cancelled")
        order.update(status="cancelled", update_time=self._stamp())
        return {"message": f"Order {order_id} has been cancelled."}

    def _t_modify_delivery_order(self, order_id: str, note: str) -> dict[str, Any]:
        order = self._order(order_id, "delivery")
        order.update(note=note, update_time=self._stamp())
        return {"message": f"Order {order_id} has been modified.", "order": order}

    def _t_search_delivery_orders(self, user_id: str, status: str = "unpaid") -> dict[str, Any]:
        self._check_user(user_id)
        found = [
            self._summary(o)
            for o in self.db["orders"].values()
            if o.get("order_type") == "delivery" and o.get("status") == status and o.get("user_id") == user_id
        ]
        return {"orders": found} if found else {"message": "No delivery orders available"}

    def _t_get_delivery_order_detail(self, order_id: str) -> dict[str, Any]:
        if not order_id:
            raise Rejected("Order ID cannot be empty")
        return self._order(order_id, "delivery")
