"""General VitaBench tools (every domain): distances, weather, geocoding, holidays, user history, nearby."""

from __future__ import annotations

import difflib
from typing import Any

from envace.envs.vitabench.executor_core import DATE_FORMAT, ExecutorCore, Failure, Rejected, haversine_m, parse_time


def _norm(text: str) -> str:
    return str(text).lower().replace(" city", "").replace("市", "").strip()


class GeneralTools(ExecutorCore):
    def _t_longitude_latitude_to_distance(
        self, longitude1: Any, latitude1: Any, longitude2: Any, latitude2: Any
    ) -> dict[str, Any]:
        try:
            coords = [float(v) for v in (longitude1, latitude1, longitude2, latitude2)]
        except (TypeError, ValueError):
            raise Failure("longitude/latitude values must be numbers") from None
        return {"distance_m": haversine_m(*coords)}

    def _t_weather(self, address: str, date_start: str, date_end: str) -> dict[str, Any]:
        start = parse_time(date_start, DATE_FORMAT, "date_start").date()
        end = parse_time(date_end, DATE_FORMAT, "date_end").date()
        entries = list(self.db.get("weather") or [])
        cities = list(dict.fromkeys(str(e["city"]) for e in entries))
        place = _norm(address)
        city = next((c for c in cities if _norm(c) and _norm(c) in place), None)
        if city is None:
            scored = sorted(cities, key=lambda c: -difflib.SequenceMatcher(None, _norm(c), place).ratio())
            best = scored[0] if scored else None
            if best is None or difflib.SequenceMatcher(None, _norm(best), place).ratio() < 0.5:
                raise Failure(f"Weather information not found for {address}")
            city = best
        chosen = sorted(
            (e for e in entries if e["city"] == city and start <= parse_time(e["datetime"], DATE_FORMAT).date() <= end),
            key=lambda e: e["datetime"],
        )
        if not chosen:
            return {"message": f"No weather information found for {city} between {date_start} and {date_end}"}
        return {"city": city, "weather": chosen}

    def _t_address_to_longitude_latitude(self, address: str) -> list[float]:
        places = self._known_locations()
        if address in places:
            hit = places[address]
        else:
            text = str(address).lower()
            overlapping = [p for p in places if p.lower() in text or text in p.lower()]
            if overlapping:
                hit = places[max(overlapping, key=len)]
            else:
                ranked = sorted(places, key=lambda p: -difflib.SequenceMatcher(None, p.lower(), text).ratio())
                if not ranked or difflib.SequenceMatcher(None, ranked[0].lower(), text).ratio() < 0.6:
                    raise Failure(f"Longitude and latitude not found for address {address}")
                hit = places[ranked[0]]
        return [float(hit["longitude"]), float(hit["latitude"])]

    def _t_get_date_holiday_info(self, date: str) -> dict[str, Any]:
        day = parse_time(date, DATE_FORMAT, "date").date()
        try:
            # lazy: optional package (the vitabench extra); the reference uses it for holiday lookups
            import holidays
        except ImportError:
            raise Failure("NOT_REPRODUCED: holiday lookup needs the optional 'holidays' package") from None
        name = holidays.China(years=day.year).get(day)
        return (
            {"date": date, "holiday": name}
            if name
            else {"date": date, "holiday": None, "message": f"Date {date} is not a holiday"}
        )

    def _t_get_holiday_date(self, year: str, holiday_name: str) -> dict[str, Any]:
        raise Failure(
            "NOT_REPRODUCED: the reference answers from a hard-coded festival table that this offline "
            "environment does not carry"
        )

    def _t_get_user_historical_behaviors(self) -> dict[str, Any]:
        return dict(self.db.get("user_historical_behaviors") or {})

    def _t_get_user_all_orders(self) -> dict[str, Any]:
        return {"orders": list(self.db["orders"].values())}

    def _t_get_nearby(self, longitude: Any, latitude: Any, range: Any) -> dict[str, Any]:
        try:
            lon, lat, limit = float(longitude), float(latitude), float(range)
        except (TypeError, ValueError):
            raise Rejected("longitude, latitude and range must be numbers") from None
        found = []
        for table in ("stores", "shops"):
            for item in (self.db.get(table) or {}).values():
                loc = item.get("location") or {}
                distance = haversine_m(lon, lat, float(loc["longitude"]), float(loc["latitude"]))
                if distance <= limit:
                    found.append({**self._summary(item), "distance_m": distance})
        return {"results": found} if found else {"message": "No search results found"}
