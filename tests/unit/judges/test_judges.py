"""Rule, LLM and composite judges (LLM judged through an in-process scripted ChatBackend)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from envace.core.checklist import Checklist, ItemRule, RuleKind
from envace.core.checklist_reward import Verdict
from envace.core.conversation import conversation_steps
from envace.core.records import TrajectoryStatus
from envace.data.cm2 import cm2_row_to_episode_spec, validate_rows
from envace.envs.toolworld import generate_tasks, to_cm2_row
from envace.envs.toolworld.checklist import TurnTranscript, checklist_score
from envace.inference.base import ChatOutput, ChatRequest
from envace.inference.openai_client import EndpointError
from envace.judges import evaluate_checklist, get_judge, judge_names
from envace.judges.budget import FailureBudget, JudgeFailureBudgetExceeded
from envace.judges.composite import CompositeJudge
from envace.judges.conditions import parse_pass_condition
from envace.judges.llm import (
    LLMJudge,
    LLMJudgeConfig,
    MalformedVerdictError,
    build_judge_request,
    parse_verdict,
)
from envace.judges.rule import RuleJudge, json_equal, mentions

SAMPLE = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "cm2" / "checklist_annotated_sample.json"
TOOLS = "assistant.tool_calls"
REPLY = "assistant.content.user_visible_reply"
FAST = {"backoff_s": 0.001, "max_backoff_s": 0.002}


class ScriptedJudgeBackend:
    """Answers judge prompts from a script: one text per call in order, then the last one forever."""

    name = "scripted-judge"

    def __init__(self, texts: Sequence[str] = ('{"analysis": "ok", "answer": true}',), delay_s: float = 0.0):
        self.texts = list(texts)
        self.delay_s = delay_s
        self.calls = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.prompts: list[str] = []
        self._lock = threading.Lock()

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        with self._lock:
            k = self.calls
            self.calls += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.prompts.append(requests[0].messages[-1]["content"])
        time.sleep(self.delay_s)
        with self._lock:
            self.in_flight -= 1
        text = self.texts[min(k, len(self.texts) - 1)]
        if isinstance(text, Exception):
            raise text
        return [ChatOutput(text=text)]


def item(item_id: str, weight: float, focus: str = REPLY, condition: str = "", required: bool = False, rule=None):
    out = {
        "id": item_id,
        "question": f"{item_id}?",
        "focus_on": focus,
        "pass_condition": condition or f"condition {item_id}",
        "failure_examples": ["bad"],
        "evidence": [{"turn": 0, "step": 0, "from": focus, "snippet": "snip"}],
        "weight": weight,
        "required_for_next_turn": required,
        "dependence": [],
    }
    if rule is not None:
        out["rule"] = rule
    return out


def call(name: str, args: dict | str) -> dict:
    arguments = args if isinstance(args, str) else json.dumps(args)
    return {"id": f"c_{name}", "type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATION = [
    {"role": "user", "content": "weather in Paris?"},
    {
        "role": "assistant",
        "content": "<think>look it up</think>",
        "tool_calls": [call("get_weather", {"city": "Paris"})],
    },
    {"role": "tool", "content": '{"temp_c": 21}'},
    {"role": "assistant", "content": "<think>done</think>It is 21 C in Paris."},
    {"role": "user", "content": "and Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Roma"})]},
    {"role": "tool", "content": '{"temp_c": 25}'},
    {"role": "assistant", "content": "It is 25 C in Rome."},
]


@pytest.fixture
def rule_checklist() -> Checklist:
    return Checklist.from_raw(
        [
            [
                item(
                    "T",
                    0.5,
                    TOOLS,
                    'There exists a tool call with name=get_weather and arguments.city == "Paris".',
                ),
                item("A", 0.5, REPLY, 'The reply contains "21 C".'),
            ],
            [
                item(
                    "T",
                    0.6,
                    TOOLS,
                    rule={"kind": "tool_call", "name": "get_weather", "arguments": {"city": "Rome"}},
                ),
                item("A", 0.4, REPLY, rule={"kind": "answer_contains", "text": "25 c in rome"}),
            ],
        ]
    )


# ---- pass-condition parsing -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "name", "args"),
    [
        (
            'There exists an assistant tool call with name=get_x and arguments.teamid == "W Huskies".',
            "get_x",
            {"teamid": "W Huskies"},
        ),
        (
            "name=get_x and arguments.n == 3 and arguments.opts.strict == true",
            "get_x",
            {"n": 3, "opts.strict": True},
        ),
        ("The assistant calls name=\"get_x\", arguments.city = 'Rome'", "get_x", {"city": "Rome"}),
        ('A tool call with name = `get_x` and arguments.q == "a and b"', "get_x", {"q": "a and b"}),
        ("name=get_x", "get_x", {}),
        ("name=get_x and arguments.v == null and arguments.w == -1.5e2.", "get_x", {"v": None, "w": -150.0}),
    ],
)
def test_parse_simple_tool_call_conditions(condition: str, name: str, args: dict) -> None:
    rule = parse_pass_condition(condition, TOOLS)
    assert rule is not None and rule.kind is RuleKind.TOOL_CALL
    assert rule.tool_name == name
    assert dict(rule.arguments) == args


@pytest.mark.parametrize(
    "condition",
    [
        "There exists no tool call with name=get_x.",
        "name=get_x or name=get_y",
        "name=get_x and arguments.n > 3",
        'name=get_x and arguments.q == "v" (case-insensitive)',
        "The assistant called the right tool with the team name.",
        'name=get_x and arguments.q == "v" and arguments.q == "w"',
        "arguments.q == 1",
        "name=get_x and arguments.n == 3abc",
    ],
)
def test_unparseable_conditions_stay_undecidable(condition: str) -> None:
    assert parse_pass_condition(condition, TOOLS) is None


def test_conditions_are_parsed_only_for_matching_focus() -> None:
    assert parse_pass_condition("name=get_x", REPLY) is None
    assert parse_pass_condition('The final reply contains "numeric ID".', REPLY) == ItemRule(
        RuleKind.ANSWER_CONTAINS, values=("numeric ID",)
    )
    assert parse_pass_condition('The reply contains "x" and nothing else.', REPLY) is None
    assert parse_pass_condition('The reply contains "x".', "tool.content") is None


def test_json_equal() -> None:
    assert json_equal(1, 1.0) and json_equal({"a": [1, "x"]}, {"a": [1.0, "x"]})
    assert not json_equal(True, 1) and not json_equal("1", 1) and not json_equal(None, "null")
    assert not json_equal({"a": 1}, {"a": 1, "b": 2}) and not json_equal([1], [1, 1])


# ---- rule judge ---------------------------------------------------------------------------------


def test_rule_judge_scores_rule_checkable_checklist(rule_checklist: Checklist) -> None:
    score, report = evaluate_checklist(RuleJudge(), CONVERSATION, rule_checklist)
    assert report.complete and report.n_requests == 0
    by_step = {(sv.turn, sv.step): {v.item_id: v.verdict for v in sv.verdicts} for sv in report.step_verdicts}
    assert by_step[(0, 0)] == {"T": Verdict.PASS, "A": Verdict.FAIL}
    assert by_step[(0, 1)] == {"T": Verdict.FAIL, "A": Verdict.PASS}
    assert by_step[(1, 0)]["T"] is Verdict.FAIL  # called with "Roma"
    assert by_step[(1, 1)]["A"] is Verdict.PASS
    assert score.status is TrajectoryStatus.OK
    assert score.reward == pytest.approx((1.0 + 0.4) / 2)


def test_rule_judge_turn_selection(rule_checklist: Checklist) -> None:
    report = RuleJudge().judge(CONVERSATION, rule_checklist, turns=[1])
    assert {sv.turn for sv in report.step_verdicts} == {1}


def test_invalid_arguments_never_match_and_tool_errors_force_fail() -> None:
    checklist = Checklist.from_raw([[item("T", 1.0, TOOLS, "name=get_weather")]])
    broken = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call("get_weather", "{not json")]},
        {"role": "tool", "content": "{}"},
        {"role": "assistant", "content": "a"},
    ]
    assert evaluate_checklist(RuleJudge(), broken, checklist)[0].reward == 0.0
    errored = [dict(m) for m in CONVERSATION[:4]]
    errored[2] = {"role": "tool", "content": '{"error_tool_call": "INVALID_TOOL_NAME"}'}
    report = RuleJudge().judge(errored, checklist)
    assert report.step_verdicts[0].verdicts[0].source == "tool_error"
    assert evaluate_checklist(RuleJudge(), errored, checklist)[0].reward == 0.0


def test_rule_judge_rejects_conversation_longer_than_checklist(rule_checklist: Checklist) -> None:
    longer = CONVERSATION + [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    with pytest.raises(ValueError, match="checklist only"):
        RuleJudge().judge(longer, rule_checklist)


# ---- LLM judge ----------------------------------------------------------------------------------


def test_parse_verdict_is_strict() -> None:
    assert parse_verdict('{"analysis": "fine", "answer": false}') == (False, "fine")
    assert parse_verdict('<think>hmm</think>\n```json\n{"analysis": "a", "answer": true}\n```') == (True, "a")
    for bad in [
        "true",
        '{"analysis": "a", "answer": "true"}',
        '{"answer": true}',
        'Sure! {"analysis": "a", "answer": true}',
        '{"analysis": "a", "answer": 1}',
        '{"analysis": "a", "answer": true',
        "",
    ]:
        with pytest.raises(MalformedVerdictError):
            parse_verdict(bad)


def test_judge_prompt_shows_only_the_turn_so_far() -> None:
    checklist = Checklist.from_raw([[item("A", 1.0)], [item("B", 1.0)]])
    step = conversation_steps(CONVERSATION)[2]  # turn 1, step 0
    prompt = build_judge_request(checklist.turns[1][0], CONVERSATION, step, LLMJudgeConfig()).messages[-1]["content"]
    assert "weather in Paris?" in prompt.split("## Current turn")[0]  # earlier turn as context
    current = prompt.split("## Current turn")[1]
    assert "and Rome?" in current and '"temp_c": 25' in current
    assert "It is 25 C in Rome." not in prompt  # later steps are not shown


def test_llm_judge_retries_malformed_output_then_succeeds() -> None:
    backend = ScriptedJudgeBackend(["not json", '{"answer": true}', '{"analysis": "ok", "answer": true}'])
    checklist = Checklist.from_raw([[item("A", 1.0)]])
    messages = CONVERSATION[:4]
    judge = LLMJudge(backend, LLMJudgeConfig(max_retries=3, concurrency=1, **FAST))
    report = judge.judge(messages, checklist, turns=[0])
    # two steps in turn 0: first takes three attempts, second one
    assert backend.calls == 4 and report.n_requests == 4 and report.n_retries == 2
    score, _ = evaluate_checklist(judge, messages, checklist)
    assert score.reward == 1.0


def test_llm_judge_failure_is_counted_judge_failed() -> None:
    backend = ScriptedJudgeBackend(["garbage"])
    checklist = Checklist.from_raw([[item("A", 1.0)]])
    judge = LLMJudge(backend, LLMJudgeConfig(max_retries=2, **FAST))
    score, report = evaluate_checklist(judge, CONVERSATION[:4], checklist)
    assert report.n_errors == 2 and report.n_requests == 6
    assert score.status is TrajectoryStatus.JUDGE_FAILED and score.reward is None


def test_llm_judge_does_not_retry_non_retryable_errors() -> None:
    backend = ScriptedJudgeBackend([EndpointError("HTTP 401", status=401, retryable=False)])
    checklist = Checklist.from_raw([[item("A", 1.0)]])
    report = LLMJudge(backend, LLMJudgeConfig(max_retries=5, **FAST)).judge(
        CONVERSATION[:2] + CONVERSATION[2:4], checklist
    )
    assert report.n_requests == 2 and report.n_errors == 2  # one request per step, no retries


def test_llm_judge_does_not_stack_retries_on_transport_errors() -> None:
    """The HTTP client retries transport faults; the judge re-asks only malformed verdicts."""
    backend = ScriptedJudgeBackend(
        [EndpointError("HTTP 503", status=503, retryable=True), "not json", '{"analysis": "ok", "answer": true}']
    )
    checklist = Checklist.from_raw([[item("A", 1.0)]])
    judge = LLMJudge(backend, LLMJudgeConfig(max_retries=3, concurrency=1, **FAST))
    report = judge.judge(CONVERSATION[:4], checklist)
    assert backend.calls == 3 and report.n_errors == 1  # step 0: the 503 is final; step 1: re-asked once
    assert judge.budget.calls == 2 and judge.budget.failures == 1


# ---- failure budget -------------------------------------------------------------------------------


def test_failure_budget_slides_and_fails_fast() -> None:
    budget = FailureBudget(0.2, 20, where="http://127.0.0.1:1/v1")
    for _ in range(4):
        budget.record(True, "HTTP 503")  # 4 <= 0.2 * 20: still within budget
    for _ in range(20):
        budget.record(False)  # the old failures slide out of the window
    for _ in range(4):
        budget.record(True, "HTTP 503")
    with pytest.raises(JudgeFailureBudgetExceeded) as info:
        budget.record(True, "POST http://127.0.0.1:1/v1/chat/completions: connection refused\n(more)")
    message = str(info.value)
    assert "5 of the last 20 judge calls failed" in message and "9 of 29 calls" in message
    assert "connection refused (more)" in message and "http://127.0.0.1:1/v1" in message and "\n" not in message
    assert "judge.max_failure_rate" in message and "judge.failure_window" in message and "judge.base_url" in message
    with pytest.raises(JudgeFailureBudgetExceeded):  # sticky: no later call starts
        budget.check()
    never = FailureBudget(1.0, 3)
    for _ in range(10):
        never.record(True)
    assert never.failures == 10
    with pytest.raises(ValueError, match="judge.max_failure_rate"):
        FailureBudget(1.5, 20)


def test_llm_judge_stops_at_the_failure_budget() -> None:
    backend = ScriptedJudgeBackend(
        [EndpointError("POST http://j/v1/chat/completions: HTTP 503", status=503, retryable=True)]
    )
    checklist = Checklist.from_raw([[item(f"I{k}", 0.125) for k in range(8)]])
    judge = LLMJudge(backend, LLMJudgeConfig(concurrency=1, **FAST))  # defaults: 0.2 over 20 calls
    with pytest.raises(JudgeFailureBudgetExceeded, match="5 of the last 5 judge calls failed.*HTTP 503"):
        judge.judge(CONVERSATION[:4], checklist)  # 2 steps x 8 items, but the 5th failure stops it
    assert backend.calls == 5
    with pytest.raises(JudgeFailureBudgetExceeded):
        judge.judge(CONVERSATION[:4], checklist)
    assert backend.calls == 5  # nothing more is sent once the budget is spent


def test_failures_below_the_budget_stay_excluded_and_counted() -> None:
    ok = '{"analysis": "ok", "answer": true}'
    backend = ScriptedJudgeBackend([EndpointError("HTTP 500", status=500, retryable=True)] + [ok] * 9)
    checklist = Checklist.from_raw([[item("A", 0.5), item("B", 0.5)]])
    judge = get_judge("llm", backend=backend, concurrency=1, max_failure_rate=0.2, failure_window=20, **FAST)
    one_step = CONVERSATION[:3]  # one assistant step: its failed item cannot pass elsewhere in the turn
    score, report = evaluate_checklist(judge, one_step, checklist)
    assert report.n_errors == 1 and score.status is TrajectoryStatus.JUDGE_FAILED and score.reward is None
    for _ in range(3):
        assert evaluate_checklist(judge, one_step, checklist)[0].status is TrajectoryStatus.OK
    assert (judge.budget.calls, judge.budget.failures) == (8, 1)


def test_llm_judge_respects_concurrency_limit() -> None:
    backend = ScriptedJudgeBackend(delay_s=0.02)
    checklist = Checklist.from_raw([[item(f"I{k}", 0.125) for k in range(8)], [item("B", 1.0)]])
    report = LLMJudge(backend, LLMJudgeConfig(concurrency=3, **FAST)).judge(CONVERSATION, checklist)
    assert backend.calls == 2 * 8 + 2
    assert 1 < backend.max_in_flight <= 3
    assert report.complete


def test_llm_judge_skips_requests_for_tool_error_items() -> None:
    backend = ScriptedJudgeBackend()
    errored = [dict(m) for m in CONVERSATION[:4]]
    errored[2] = {"role": "tool", "content": '{"error_tool_call": "JSON_DECODE_ERROR"}'}
    checklist = Checklist.from_raw([[item("T", 0.5, TOOLS), item("A", 0.5)]])
    report = LLMJudge(backend, LLMJudgeConfig(**FAST)).judge(errored, checklist)
    assert backend.calls == 3  # T at step 0 is decided without a request
    assert report.step_verdicts[0].get("T").verdict is Verdict.FAIL


# ---- composite and registry ---------------------------------------------------------------------


def test_registry_lists_valid_names_on_unknown() -> None:
    assert {"rule", "llm", "composite"} <= set(judge_names())
    with pytest.raises(ValueError, match="valid judges: composite, llm, rule"):
        get_judge("gpt-judge")
    assert isinstance(get_judge("rule"), RuleJudge)
    with pytest.raises(ValueError, match="base_url"):
        get_judge("llm")
    # one config block serves every judge: endpoint settings without a base_url mean "no LLM"
    shared = {
        "base_url": None,
        "model": None,
        "api_key_env": "OPENAI_API_KEY",
        "max_retries": 3,
        "timeout_s": 60.0,
    }
    assert isinstance(get_judge("rule", **shared), RuleJudge)
    assert get_judge("composite", **shared).llm is None
    with pytest.raises(TypeError, match="unknown settings"):
        get_judge("rule", temprature=0.0)


def test_composite_without_llm_reports_undecidable() -> None:
    checklist = Checklist.from_raw([[item("T", 0.5, TOOLS, "name=get_weather"), item("A", 0.5)]])
    judge = get_judge("composite")
    assert isinstance(judge, CompositeJudge) and judge.llm is None
    score, report = evaluate_checklist(judge, CONVERSATION[:4], checklist)
    assert report.n_undecidable == 2 and report.n_requests == 0
    assert score.status is TrajectoryStatus.JUDGE_FAILED


def test_composite_sends_only_undecidable_items_to_llm() -> None:
    backend = ScriptedJudgeBackend()
    checklist = Checklist.from_raw([[item("T", 0.5, TOOLS, "name=get_weather"), item("A", 0.5)]])
    judge = get_judge("composite", backend=backend, **FAST)
    score, report = evaluate_checklist(judge, CONVERSATION[:4], checklist)
    assert backend.calls == 2 and report.n_requests == 2
    assert all("Question: A?" in p for p in backend.prompts)
    assert score.reward == 1.0


@pytest.fixture(scope="module")
def cm2_row() -> dict:
    if not SAMPLE.is_file():
        pytest.skip(f"CM2 sample not present at {SAMPLE}")
    return json.loads(SAMPLE.read_text())[0]


def test_cm2_sample_rule_and_composite(cm2_row: dict) -> None:
    checklist = Checklist.from_raw(cm2_row["checklists"][0])
    report = RuleJudge().judge(cm2_row["messages"], checklist)
    first = report.step_verdicts[0]
    assert first.get("C0").verdict is Verdict.PASS  # name=... and arguments.teamid == "Washington Huskies"
    assert report.step_verdicts[1].get("C0").verdict is Verdict.FAIL  # the reply step makes no call
    assert report.n_undecidable == 18  # 20 (step, item) pairs, C0 decided twice by rule
    backend = ScriptedJudgeBackend()
    score, composite = evaluate_checklist(
        get_judge("composite", backend=backend, **FAST), cm2_row["messages"], checklist
    )
    assert backend.calls == 18 and composite.complete
    assert score.reward == pytest.approx(1.0)


# ---- rule vocabulary shared with the embedded tool world -----------------------------------------


def test_parsed_rules_require_success_only_when_stated() -> None:
    assert not parse_pass_condition("name=f and arguments.a == 1", TOOLS).require_success
    stated = parse_pass_condition("name=f and arguments.a == 1, and its tool response is not an error.", TOOLS)
    assert stated is not None and stated.require_success
    assert parse_pass_condition('name=f and arguments.a == "x" (or the id returned earlier).', TOOLS) is None


def test_mentions_is_token_based() -> None:
    assert mentions("It costs $1,250.", "1250") and mentions("150.00 EUR", "150")
    assert not mentions("1500 EUR", "150") and not mentions("evt_30", "evt_3")
    assert mentions("The  Value is\nParis", "value is paris") and mentions("anything", "")


def _created_then_deleted(create_response: dict, delete_id: str) -> list[dict]:
    return [
        {"role": "user", "content": "create x"},
        {"role": "assistant", "content": "", "tool_calls": [call("create_event", {"title": "x"})]},
        {"role": "tool", "content": json.dumps(create_response)},
        {"role": "assistant", "content": "Created."},
        {"role": "user", "content": "now delete it"},
        {"role": "assistant", "content": "", "tool_calls": [call("delete_event", {"event_id": delete_id})]},
        {"role": "tool", "content": '{"deleted": true}'},
        {"role": "assistant", "content": "Deleted."},
    ]


BOUND_CHECKLIST = [
    [item("C0", 1.0, TOOLS, rule={"kind": "tool_call", "name": "create_event", "arguments": {"title": "x"}})],
    [
        item(
            "C0",
            1.0,
            TOOLS,
            rule={
                "kind": "tool_call",
                "name": "delete_event",
                "arguments": {"event_id": "evt_1"},  # the id in the reference run
                "bound_arguments": {"event_id": {"turn": 0, "item": "C0", "path": ["event", "id"]}},
            },
        )
    ],
]


@pytest.mark.parametrize(
    ("created", "deleted", "reward"),
    [
        ({"event": {"id": "evt_7"}}, "evt_7", 1.0),  # the agent's own id, bound from its response
        ({"event": {"id": "evt_7"}}, "evt_1", 1.0),  # the reference id itself
        ({"event": {"id": "evt_7"}}, "evt_8", 0.5),
        ({"error": {"code": "conflict"}}, "evt_7", 0.0),  # failed create: item fails, episode ends
    ],
)
def test_bound_arguments_and_required_success(created: dict, deleted: str, reward: float) -> None:
    checklist = Checklist.from_raw(BOUND_CHECKLIST)
    score, _ = evaluate_checklist(RuleJudge(), _created_then_deleted(created, deleted), checklist)
    assert score.reward == pytest.approx(reward)


def test_rule_judge_agrees_with_tool_world_checker() -> None:
    tasks = generate_tasks(n_train=30, n_val=5, n_test=5)["train"]
    rows = [to_cm2_row(t, include_state=True) for t in tasks]
    accepted, rejects = validate_rows(rows)
    assert rejects == [] and len(accepted) == len(rows)
    for task, row in zip(tasks, rows, strict=True):
        checklist = Checklist.from_raw(row["checklists"][0])
        assert evaluate_checklist(RuleJudge(), row["messages"], checklist)[0].reward == pytest.approx(1.0)
        vague = [
            {**m, "content": "Done."} if m["role"] == "assistant" and not m.get("tool_calls") else m
            for m in row["messages"]
        ]
        ours = evaluate_checklist(RuleJudge(), vague, checklist)[0].reward
        spec = cm2_row_to_episode_spec(row)
        transcripts = [
            TurnTranscript(tuple(e.call for e in ex), tuple(e.response for e in ex), "Done.") for ex in spec.exchanges
        ]
        assert ours == pytest.approx(checklist_score(task, transcripts))


def test_checklist_reward_fn_scores_a_trajectory() -> None:
    from envace.core.records import ToolCall, Trajectory, Turn
    from envace.judges import checklist_reward_fn, trajectory_messages

    class Spec:  # what an engine's EpisodeSpec offers
        system_prompt = "sys"
        user_turns = ("weather in Paris?", "and Rome?")
        checklists = (
            (
                item("T", 0.5, TOOLS, 'name=get_weather and arguments.city == "Paris"'),
                item("A", 0.5, REPLY, 'The reply contains "21 C".'),
            ),
            (
                item(
                    "T",
                    1.0,
                    TOOLS,
                    rule={"kind": "tool_call", "name": "get_weather", "arguments": {"city": "Rome"}},
                ),
            ),
        )

    turns = (
        Turn("", (ToolCall("get_weather", {"city": "Paris"}, id="c1"),), ({"temp_c": 21},), user_turn=0),
        Turn("It is 21 C.", user_turn=0),
        Turn("", (ToolCall("get_weather", {"city": "Roma"}, id="c2"),), ({"temp_c": 25},), user_turn=1),
        Turn("It is 25 C.", user_turn=1),
    )
    trajectory = Trajectory(prompt_id="p", sample_index=0, turns=turns)
    messages = trajectory_messages(Spec(), trajectory)
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": '{"temp_c": 21}'}
    reward, status, info = checklist_reward_fn(get_judge("rule"))(Spec(), trajectory)
    assert status is TrajectoryStatus.OK and reward == pytest.approx(0.5)
    assert info["turn_scores"] == [1.0, 0.0] and info["judge_requests"] == 0
    failing = checklist_reward_fn(get_judge("composite"))
    Spec.checklists = ((item("A", 1.0),), (item("B", 1.0),))
    reward, status, info = failing(Spec(), trajectory)
    assert status is TrajectoryStatus.JUDGE_FAILED and info["judge_undecidable"] == 4  # 4 steps x 1 item


def test_per_turn_judging_keeps_bound_sources_of_earlier_turns() -> None:
    checklist = Checklist.from_raw(BOUND_CHECKLIST)
    messages = _created_then_deleted({"event": {"id": "evt_7"}}, "evt_7")
    for judge in (RuleJudge(), get_judge("composite")):
        report = judge.judge(messages, checklist, turns=[1])
        assert [sv.turn for sv in report.step_verdicts] == [1, 1]
        assert report.step_verdicts[0].get("C0").verdict is Verdict.PASS
