"""In-store tools of VitaBench (shops, product orders, table bookings, reservations), reimplemented.

Deviation: ``instore_modify_reservation`` with ``customer_count`` 0 (its default) keeps the party size;
the reference writes 0.
"""

from __future__ import annotations

from typing import Any

from envace.envs.vitabench.executor_core import ExecutorCore, Failure, Rejected, keyword_rank, parse_time

SEARCH_TOP_K = 1000


class InstoreTools(ExecutorCore):
    def _t_instore_shop_search_recommend(self, keywords: Any) -> dict[str, Any]:
        shops = self.db.get("shops") or {}
        docs = {sid: s.get("shop_name", "") + "," + ",".join(s.get("tags", [])) for sid, s in shops.items()}
        return {"shops": [self._summary(shops[sid]) for sid in keyword_rank(keywords, docs, SEARCH_TOP_K)]}

    def _t_instore_product_search_recommend(self, keywords: Any) -> dict[str, Any]:
        products = self._products("shops")
        docs = {pid: p.get("name", "") + "," + ",".join(p.get("tags", [])) for pid, p in products.items()}
        return {"products": [products[pid] for pid in keyword_rank(keywords, docs, SEARCH_TOP_K)]}

    def _t_create_instore_product_order(
        self, user_id: str, shop_id: str, product_id: str, quantity: int = 1
    ) -> dict[str, Any]:
        self._check_user(user_id)
        if shop_id not in (self.db.get("shops") or {}):
            raise Rejected("Shop does not exist")
        product = next((p for p in self._shop(shop_id).get("products", []) if p["product_id"] == product_id), None)
        if product is None:
            raise Rejected("Product does not exist")
        if not isinstance(quantity, int) or quantity <= 0:
            raise Rejected("Quantity must be greater than 0")
        order = {
            "order_id": self._new_id("OI"),
            "order_type": "instore",
            "user_id": user_id,
            "store_id": shop_id,
            "total_price": quantity * float(product["price"]),
            "create_time": self._stamp(),
            "update_time": self._stamp(),
            "status": "unpaid",
            "products": [{**product, "quantity": quantity}],
        }
        self.db["orders"][order["order_id"]] = order
        return order

    def _t_pay_instore_order(self, order_id: str) -> dict[str, Any]:
        order = self._order(order_id, "instore")
        if order["status"] != "unpaid":
            raise Rejected(f"Order {order_id} is not in `unpaid` status.")
        order.update(status="paid", update_time=self._stamp())
        return {"message": "Payment successful", "order_id": order_id}

    def _t_instore_cancel_order(self, order_id: str) -> dict[str, Any]:
        order = self._order(order_id, "instore")
        if order["status"] == "cancelled":
            raise Rejected(f"Order {order_id} is already cancelled.")
        order.update(status="cancelled", update_time=self._stamp())
        return {"message": f"Order {order_id} is cancelled."}

    def _visit_checks(self, user_id: str, shop_id: str, time: str, customer_count: Any, what: str) -> dict[str, Any]:
        self._check_user(user_id)
        if shop_id not in (self.db.get("shops") or {}):
            raise Rejected("Shop does not exist")
        if not isinstance(customer_count, int) or customer_count <= 0:
            raise Rejected(f"Number of customers for {what} must be greater than 0")
        parse_time(time, what=f"{what} time")
        return self._shop(shop_id)

    def _t_instore_book(self, user_id: str, shop_id: str, time: str, customer_count: int = 1) -> dict[str, Any]:
        shop = self._visit_checks(user_id, shop_id, time, customer_count, "table booking")
        if not shop.get("enable_book"):
            raise Rejected("Shop does not support table booking")
        price = float(shop.get("book_price") or 0)
        book = {
            "book_id": self._new_id("OB"),
            "shop_id": shop_id,
            "book_time": time,
            "customer_id": user_id,
            "customer_count": customer_count,
            "book_price": price,
            "status": "unpaid" if price > 0 else "paid",
            "update_time": self._stamp(),
        }
        self.db["books"][book["book_id"]] = book
        return book

    def _book(self, book_id: str) -> dict[str, Any]:
        if not book_id:
            raise Rejected("Booking ID cannot be empty")
        book = self.db.get("books", {}).get(book_id)
        if book is None:
            raise Failure(f"BookInfo {book_id} not found")
        return book

    def _t_pay_instore_book(self, book_id: str) -> dict[str, Any]:
        book = self._book(book_id)
        if book["status"] != "unpaid":
            raise Rejected(f"BookInfo {book_id} is not in `unpaid` status.")
        book.update(status="paid", update_time=self._stamp())
        return {"message": "Payment successful", "book_id": book_id}

    def _t_instore_cancel_book(self, book_id: str) -> dict[str, Any]:
        book = self._book(book_id)
        if book["status"] == "cancelled":
            raise Rejected(f"BookInfo {book_id} is already cancelled.")
        book.update(status="cancelled", update_time=self._stamp())
        return {"message": f"BookInfo {book_id} is cancelled."}

    def _t_instore_reservation(self, user_id: str, shop_id: str, time: str, customer_count: int = 1) -> dict[str, Any]:
        self._visit_checks(user_id, shop_id, time, customer_count, "reservation")
        item = {
            "reservation_id": self._new_id("OR"),
            "shop_id": shop_id,
            "reservation_time": time,
            "customer_id": user_id,
            "customer_count": customer_count,
            "status": "unconsumed",
            "update_time": self._stamp(),
        }
        self.db["reservations"][item["reservation_id"]] = item
        return item

    def _reservation(self, reservation_id: str) -> dict[str, Any]:
        if not reservation_id:
            raise Rejected("Reservation ID cannot be empty")
        item = self.db.get("reservations", {}).get(reservation_id)
        if item is None:
            raise Failure(f"ReservationInfo {reservation_id} not found")
        return item

    def _t_instore_modify_reservation(self, reservation_id: str, time: str, customer_count: int = 0) -> dict[str, Any]:
        item = self._reservation(reservation_id)
        if item["status"] in ("consumed", "cancelled"):
            raise Rejected(f"ReservationInfo {reservation_id} is already {item['status']}.")
        if not isinstance(customer_count, int) or customer_count < 0:
            raise Rejected("Number of customers for reservation must be greater than or equal to 0")
        parse_time(time, what="Reservation time")
        item.update(reservation_time=time, update_time=self._stamp())
        if customer_count:
            item["customer_count"] = customer_count
        return item

    def _t_instore_cancel_reservation(self, reservation_id: str) -> dict[str, Any]:
        item = self._reservation(reservation_id)
        if item["status"] == "cancelled":
            raise Rejected(f"ReservationInfo {reservation_id} is already cancelled.")
        item.update(status="cancelled", update_time=self._stamp())
        return {"message": f"ReservationInfo {reservation_id} is cancelled."}

    def _users_rows(self, user_id: str, table: str, owner: str, label: str) -> dict[str, Any]:
        self._check_user(user_id)
        rows = [
            r
            for r in (self.db.get(table) or {}).values()
            if r.get(owner) == user_id and (table != "orders" or r.get("order_type") == "instore")
        ]
        return {table: rows} if rows else {"message": f"User {user_id} has no {label} information."}

    def _t_get_instore_orders(self, user_id: str) -> dict[str, Any]:
        return self._users_rows(user_id, "orders", "user_id", "order")

    def _t_get_instore_reservations(self, user_id: str) -> dict[str, Any]:
        return self._users_rows(user_id, "reservations", "customer_id", "reservation")

    def _t_get_instore_books(self, user_id: str) -> dict[str, Any]:
        return self._users_rows(user_id, "books", "customer_id", "book")

    def _t_search_instore_book(self, user_id: str, book_id: str | None = None) -> dict[str, Any]:
        if book_id is None:
            return self._t_get_instore_books(user_id)
        self._check_user(user_id)
        book = self._book(book_id)
        if book["customer_id"] != user_id:
            raise Rejected(f"BookInfo {book_id} does not belong to user {user_id}.")
        return book

    def _t_search_instore_reservation(self, user_id: str, reservation_id: str | None = None) -> dict[str, Any]:
        if reservation_id is None:
            return self._t_get_instore_reservations(user_id)
        self._check_user(user_id)
        item = self._reservation(reservation_id)
        if item["customer_id"] != user_id:
            raise Rejected(f"ReservationInfo {reservation_id} does not belong to user {user_id}.")
        return item
