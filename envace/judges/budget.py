"""A judge's failure budget over a run: failures stay excluded and counted until there are too many.

Every judge call (one checklist item at one step, after the HTTP client's retries and the judge's re-asks
of malformed verdicts) is recorded as passed or failed in a sliding window of the last ``window`` calls.
When more than ``max_failure_rate × window`` of them failed, the budget is exhausted and
``JudgeFailureBudgetExceeded`` is raised - at the call that crossed the line and at every later call - so
the stage stops instead of training on exclusions. Counting against the full window from the first call
makes a dead judge fail fast: with the defaults (0.2 over 20) the fifth failure in a row stops the run;
below the line a failed call is an ERROR verdict, so the trajectory is JUDGE_FAILED (excluded, counted).
``max_failure_rate=1`` never stops.
"""

from __future__ import annotations

import threading
from collections import deque

from envace.inference.preflight import EndpointUnavailable


class JudgeFailureBudgetExceeded(EndpointUnavailable):
    """Too many judge calls failed in the sliding window (the message says how many, why and what to set)."""


class FailureBudget:
    """Thread-safe sliding-window failure counter (module docstring). ``where`` names the endpoint."""

    def __init__(self, max_failure_rate: float, window: int, where: str = "") -> None:
        if not 0.0 <= max_failure_rate <= 1.0 or window < 1:
            raise ValueError(
                f"FailureBudget: max_failure_rate={max_failure_rate} must be in [0, 1] and "
                f"window={window} >= 1 (judge.max_failure_rate, judge.failure_window)"
            )
        self.max_failure_rate = max_failure_rate
        self.window = window
        self.where = where
        self.calls = 0
        self.failures = 0
        self._recent: deque[bool] = deque(maxlen=window)
        self._lock = threading.Lock()
        self._exceeded: str | None = None

    @property
    def allowed(self) -> float:
        """Failures the window tolerates (more than this exhausts the budget)."""
        return self.max_failure_rate * self.window

    def check(self) -> None:
        """Raise when the budget is already exhausted (before spending a request on a doomed run)."""
        if self._exceeded is not None:
            raise JudgeFailureBudgetExceeded(self._exceeded)

    def record(self, failed: bool, cause: str = "") -> None:
        """Count one judge call; raise ``JudgeFailureBudgetExceeded`` when this makes too many failures."""
        with self._lock:
            self.calls += 1
            self.failures += int(failed)
            self._recent.append(failed)
            in_window = sum(self._recent)
            if self._exceeded is None and failed and in_window > self.allowed:
                last = " ".join(cause.split()) or "unknown"
                self._exceeded = (
                    f"judge failure budget exhausted: {in_window} of the last {len(self._recent)} judge calls failed "
                    f"(judge.max_failure_rate={self.max_failure_rate:g} of judge.failure_window={self.window}; "
                    f"{self.failures} of {self.calls} calls failed in this run); last cause: {last}; "
                    f"endpoint {self.where or '(a local backend)'}: fix judge.base_url / judge.model / "
                    "judge.api_key_env / judge.timeout_s, or allow more with judge.max_failure_rate"
                )
        self.check()
