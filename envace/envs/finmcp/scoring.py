"""FinMCP-Bench scoring: tool-name precision / recall / F1 ("TF1") and exact sequence match.

What the authors' ``eval/evaluation.py`` (github.com/aliyun/qwen-dianjin, DianJin-TIR) computes, restated:

* per sample, the tool *names* of every assistant tool call in the gold conversation and in the predicted
  one (all turns, in order); arguments are not compared;
* TP / FP / FN over the two name *multisets* (a tool called twice counts twice);
* precision = TP/(TP+FP), recall = TP/(TP+FN), F1 = 2PR/(P+R), each 0 when its denominator is 0 — so a
  sample whose gold and predicted sequences are both empty scores 0, not 1 (kept as the reference does);
* exact match ("consist") = the two name sequences are equal, order included;
* aggregation: macro (mean of per-sample P/R/F1), micro (P/R/F1 of summed TP/FP/FN), exact-match rate,
  overall and grouped by scenario level 1 (``first-class``), difficulty (``diff_level.level``) and task
  type (single / multi step, multi turn).

Deviation: the reference drops samples whose inference crashed (``drop_error_data=True``); here a crashed
sample stays in every denominator with no predicted calls (``drop_errors=True`` restores the reference).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolCallScore:
    tp: int
    fp: int
    fn: int
    exact: bool

    @property
    def precision(self) -> float:
        return _div(self.tp, self.tp + self.fp)

    @property
    def recall(self) -> float:
        return _div(self.tp, self.tp + self.fn)

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return _div(2 * p * r, p + r)

    def to_json(self) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "fp": self.fp,
            "fn": self.fn,
            "exact": self.exact,
            "precision": self.precision,
            "recall": self.recall,
            "f1": self.f1,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ToolCallScore:
        return cls(int(d["tp"]), int(d["fp"]), int(d["fn"]), bool(d["exact"]))


def _div(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def score_tool_names(predicted: Sequence[str], gold: Sequence[str]) -> ToolCallScore:
    """Multiset TP/FP/FN of tool names and ordered exact match."""
    pred, ref = Counter(predicted), Counter(gold)
    tp = sum((pred & ref).values())
    return ToolCallScore(
        tp=tp, fp=sum(pred.values()) - tp, fn=sum(ref.values()) - tp, exact=list(predicted) == list(gold)
    )


@dataclass(frozen=True)
class ToolMetrics:
    n: int
    macro_precision: float
    macro_recall: float
    macro_f1: float
    micro_precision: float
    micro_recall: float
    micro_f1: float
    exact_match: float

    def to_json(self) -> dict[str, float]:
        return dict(vars(self))


def aggregate(scores: Sequence[ToolCallScore]) -> ToolMetrics:
    """Macro and micro P/R/F1 and exact-match rate over samples (zeros when empty)."""
    n = len(scores)
    tp, fp, fn = (sum(getattr(s, k) for s in scores) for k in ("tp", "fp", "fn"))
    micro = ToolCallScore(tp, fp, fn, exact=False)
    return ToolMetrics(
        n=n,
        macro_precision=_div(sum(s.precision for s in scores), n),
        macro_recall=_div(sum(s.recall for s in scores), n),
        macro_f1=_div(sum(s.f1 for s in scores), n),
        micro_precision=micro.precision,
        micro_recall=micro.recall,
        micro_f1=micro.f1,
        exact_match=_div(sum(1 for s in scores if s.exact), n),
    )


def grouped_metrics(
    rows: Iterable[tuple[ToolCallScore, Mapping[str, str]]],
    group_keys: Sequence[str] = ("category", "difficulty", "task_type"),
) -> dict[str, Any]:
    """``{"overall": …, "<key>": {"<value>": …}}`` from (score, labels) rows."""
    rows = list(rows)
    out: dict[str, Any] = {"overall": aggregate([s for s, _ in rows]).to_json()}
    for key in group_keys:
        groups: dict[str, list[ToolCallScore]] = {}
        for score, labels in rows:
            groups.setdefault(str(labels.get(key, "unknown")), []).append(score)
        out[key] = {value: aggregate(scores).to_json() for value, scores in sorted(groups.items())}
    return out
