"""World-model fidelity: metric functions on hand-made pairs, and measure_fidelity with a scripted rehearser."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from envace.core.conversation import TOOL_CALL_ERROR_KEY, is_error_response
from envace.core.env import Task
from envace.core.records import ToolCall, Turn
from envace.core.wire import render_rehearsal
from envace.evaluation.fidelity import (
    canonical_json,
    compare_responses,
    field_f1,
    flatten_json,
    measure_fidelity,
)
from envace.evaluation.records import EpisodeRecord
from envace.inference.base import ChatOutput, ChatRequest


def test_flatten_paths_and_leaves():
    assert flatten_json({"a": 1, "b": {"c": [True, None]}, "e": {}, "f": [], "odd key": "x"}) == {
        "$.a": "1",
        "$.b.c[0]": "true",
        "$.b.c[1]": "null",
        "$.e": "{}",
        "$.f": "[]",
        '$["odd key"]': '"x"',
    }
    assert flatten_json(5) == {"$": "5"}


def test_exact_match_is_canonical():
    assert canonical_json({"b": 1, "a": [1, {"y": 2, "x": 1}]}) == '{"a":[1,{"x":1,"y":2}],"b":1}'
    assert compare_responses({"b": 1, "a": 2}, {"a": 2, "b": 1}) == (1.0, 1.0, 1.0)
    assert compare_responses({"result": 5}, 5) == (1.0, 1.0, 1.0)  # real scalars are wrapped


def test_field_f1_hand_numbers():
    predicted = {"a": 1, "b": {"c": 2, "d": 3}}
    real = {"a": 1, "b": {"c": 2, "d": 4}, "e": 5}
    # 2 shared pairs; precision 2/3, recall 2/4 -> F1 = 4/7
    assert field_f1(predicted, real) == pytest.approx(4 / 7)
    assert field_f1({"x": 1}, {"y": 1}) == 0.0
    assert field_f1([], []) == 1.0
    assert compare_responses(predicted, real) == (0.0, pytest.approx(4 / 7), 1.0)


def test_error_agreement():
    assert is_error_response({"error": {"code": "NOT_FOUND"}}) and not is_error_response({"error": None})
    assert not is_error_response([{"error": "x"}])
    assert is_error_response({TOOL_CALL_ERROR_KEY: "bad arguments"})  # the judges' rule reads it the same way
    assert compare_responses({"error": "no such account"}, {"error": {"code": "NOT_FOUND"}}) == (0.0, 0.0, 1.0)
    assert compare_responses({"ok": True}, {"error": "x"})[2] == 0.0
    assert compare_responses(None, {"ok": True}) == (0.0, 0.0, 0.0)


class ScriptedRehearser:
    """REHEARSE backend answering by the call name in the last message; records every request."""

    name = "scripted-rehearser"

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers, self.requests = answers, []

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        outs = []
        for r in requests:
            self.requests.append(r)
            last = r.messages[-1]["content"]
            name = next(n for n in self.answers if f"Call: {n}\n" in last)
            outs.append(ChatOutput(self.answers[name], completion_tokens=1))
        return outs


def test_measure_fidelity_per_tool_and_overall():
    tools = tuple({"type": "function", "function": {"name": n, "parameters": {}}} for n in ("lookup", "pay", "log"))
    task = Task("f1", "bank", "test", "sys", tools, ("Look up Ann, pay her.", "Log it."))
    lookup, pay, log = ToolCall("lookup", {"who": "ann"}), ToolCall("pay", {"to": "ann"}), ToolCall("log", {})
    real_lookup = {"id": 7, "name": "ann"}
    real_pay = {"a": 1, "b": {"c": 2, "d": 4}, "e": 5}
    record = EpisodeRecord(
        "kv",
        "f1",
        "bank",
        "test",
        False,
        1.0,
        True,
        turns=(
            Turn("", (lookup, pay), (real_lookup, real_pay), False, 0),
            Turn("", (log,), ({"error": "log full"},), False, 1),
        ),
    )
    rehearser = ScriptedRehearser(
        {
            "lookup": render_rehearsal({"name": "ann", "id": 7}),  # exact (key order differs)
            "pay": render_rehearsal({"a": 1, "b": {"c": 2, "d": 3}}),  # F1 4/7
            "log": "I think it worked",  # unparseable
        }
    )
    report = measure_fidelity(rehearser, [record, EpisodeRecord.failed("kv", task, "boom")], [task], progress=False)
    assert report.overall.n == 3
    assert report.overall.exact_match == pytest.approx(1 / 3)
    assert report.overall.field_f1 == pytest.approx((1 + 4 / 7) / 3)
    assert report.overall.error_agreement == pytest.approx(2 / 3)
    assert report.overall.parse_failure_rate == pytest.approx(1 / 3)
    assert report.per_tool["pay"].field_f1 == pytest.approx(4 / 7) and report.per_tool["log"].n == 1
    assert report.pairs[2].parse_errors == ("NO_EXECUTION_RESULT_TAG",)
    assert report.flat()["fidelity/tool/lookup/exact_match"] == 1.0

    by_call = {r.messages[-1]["content"].split("Call: ")[1].split("\n")[0]: r for r in rehearser.requests}
    pay_text = json.dumps([m["content"] for m in by_call["pay"].messages])
    assert "log full" not in pay_text and "Log it." not in pay_text  # nothing of a later turn
    assert by_call["pay"].messages[2]["content"] == render_rehearsal(real_lookup)  # same-turn history, real response
    log = by_call["log"].messages  # system, then the real turn-0 calls as answered history, then the call
    assert [m["role"] for m in log] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert log[4]["content"] == render_rehearsal(real_pay) and "Earlier calls" not in log[0]["content"]
    assert (
        "Look up Ann" in by_call["pay"].messages[1]["content"]
        and "Look up Ann" not in by_call["pay"].messages[-1]["content"]
    )
    assert "Log it." in log[-1]["content"]
    assert all(r.tools is None for r in rehearser.requests)


def test_measure_fidelity_needs_the_tasks():
    record = EpisodeRecord("kv", "zz", "bank", "test", False, 0.0, False)
    with pytest.raises(KeyError, match="zz"):
        measure_fidelity(ScriptedRehearser({}), [record], [], progress=False)
