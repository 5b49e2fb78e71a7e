"""FinMCP-Bench: loader and validation, replayed responses and fallbacks, TF1 / exact-match scoring."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from envace.core.records import ToolCall
from envace.core.wire import render_rehearsal, render_tool_calls
from envace.envs.finmcp import (
    FinMCPAdapter,
    FinMCPFormatError,
    ReplayExecutor,
    aggregate,
    call_key,
    finmcp_report,
    infer_tool_schemas,
    load_samples,
    load_tool_schemas,
    score_tool_names,
)
from envace.evaluation import build_policy, evaluate, get_benchmark
from envace.inference.base import ChatOutput, ChatRequest
from envace.inference.openai_server import ChatCompletionServer

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "finmcp"
SAMPLES = FIXTURES / "samples.json"
TOOLS = FIXTURES / "mcp_tools.json"


@pytest.fixture(scope="module")
def adapter() -> FinMCPAdapter:
    return FinMCPAdapter(SAMPLES, tools_path=TOOLS)


def write_rows(tmp_path: Path, rows: list, name: str = "bad.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(rows))
    return path


class ScriptedPolicy:
    """Replies from a script by the number of assistant messages since the last user message."""

    name = "scripted-policy"

    def __init__(self, steps: Sequence[str], rehearse: str = "") -> None:
        self.steps = list(steps)
        self.rehearse = rehearse
        self.requests: list[ChatRequest] = []

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        out = []
        for request in requests:
            self.requests.append(request)
            if "execution backend" in request.messages[0]["content"]:
                out.append(ChatOutput(self.rehearse))
                continue
            last_user = max(i for i, m in enumerate(request.messages) if m["role"] == "user")
            step = sum(1 for m in request.messages[last_user:] if m["role"] == "assistant")
            out.append(ChatOutput(self.steps[min(step, len(self.steps) - 1)]))
        return out


# ---- loading ----------------------------------------------------------------------------------------
def test_loader_reads_the_documented_shape() -> None:
    samples = {s.sample_id: s for s in load_samples(SAMPLES)}
    assert list(samples) == ["1", "2", "3", "4", "5"]
    two = samples["2"]
    assert two.task_type == "multi_step" and two.difficulty == "medium" and two.category == "Account Services"
    assert two.gold_tool_sequence == ("GetUserHoldings", "GetFundNav", "GetFundNav")
    assert len(two.gold_calls[0]) == 2 and len(two.gold_calls[0][1]) == 2  # the parallel step stays one step
    assert two.recorded[2].response == {"fundCode": "LB3302", "nav": 2.0115, "dailyChange": 0.0107}
    multi = samples["4"]
    assert len(multi.user_turns) == 3  # the trailing ###STOP### is no request
    assert multi.gold_calls[0] == () and multi.gold_answers[0].startswith("Happy to help")
    assert [r.turn for r in multi.recorded] == [1, 2]
    assert multi.history_before(2)[0] == {"role": "user", "content": multi.user_turns[0]}
    assert samples["5"].recorded[0].response.startswith("Service notice")  # non-JSON text kept as text


def test_loader_accepts_documented_variants() -> None:
    (sample,) = load_samples(FIXTURES / "samples_variants.jsonl")
    assert sample.sample_id == "train-demo-1" and sample.system_prompt.startswith("You are a wealth")
    assert sample.tool_names == ("GetStrategyDetail",)  # from 'tool_path'
    assert sample.recorded[0].response == {"strategyCode": "EV01", "riskLevel": 2}
    tool_message = sample.turn_messages[0][1]
    assert tool_message["tool_call_id"] == sample.turn_messages[0][0]["tool_calls"][0]["id"]


@pytest.mark.parametrize(
    ("rows", "needle"),
    [
        ([{"id": 7}], "row 0 (id 7): field 'messages'"),
        ([{"id": 7, "messages": [{"role": "robot", "content": "x"}]}], "field 'messages[0]'"),
        (
            [
                {
                    "id": 7,
                    "messages": [
                        {"role": "user", "content": "q"},
                        {"role": "assistant", "tool_calls": [{"function": {"name": "F", "arguments": "{oops"}}]},
                    ],
                }
            ],
            "field 'messages[1].tool_calls[0].function.arguments': arguments string is not valid JSON",
        ),
        (
            [{"id": 7, "messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "{}"}]}],
            "tool message without a preceding",
        ),
        ([{"id": 7, "messages": [{"role": "user", "content": "###STOP###"}]}], "no user message"),
        (
            [
                {"id": 1, "messages": [{"role": "user", "content": "a"}]},
                {"id": 1, "messages": [{"role": "user", "content": "b"}]},
            ],
            "already used",
        ),
    ],
)
def test_loader_errors_name_file_row_and_field(tmp_path: Path, rows: list, needle: str) -> None:
    path = write_rows(tmp_path, rows)
    with pytest.raises(FinMCPFormatError, match="bad.json") as info:
        load_samples(path)
    assert needle in str(info.value)


def test_loader_rejects_bad_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="hub-only"):
        load_samples(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text('{"rows": []}')
    with pytest.raises(FinMCPFormatError, match="without a sample list"):
        load_samples(tmp_path / "x.json")
    (tmp_path / "y.jsonl").write_text('{"id": 1}\nnot json\n')
    with pytest.raises(FinMCPFormatError, match="line 2"):
        load_samples(tmp_path / "y.jsonl")


def test_tool_schemas_from_mcp_file_and_inferred() -> None:
    schemas = {t["function"]["name"]: t for t in load_tool_schemas(TOOLS)}
    assert schemas["GetQuote"]["function"]["parameters"]["required"] == ["ticker"]
    inferred = {t["function"]["name"]: t["function"] for t in infer_tool_schemas(load_samples(SAMPLES))}
    assert inferred["GetFundNav"]["parameters"]["properties"] == {
        "fundCode": {"type": "string"},
        "date": {"type": "string"},
    }
    assert inferred["SearchFunds"]["parameters"]["required"] == []  # keyword / category vary between calls
    assert "inferred" in inferred["GetQuote"]["description"]


# ---- scoring ----------------------------------------------------------------------------------------
def test_tool_name_scores_follow_the_reference_definitions() -> None:
    s = score_tool_names(["A", "B", "B", "C"], ["B", "A", "D"])
    assert (s.tp, s.fp, s.fn, s.exact) == (2, 2, 1, False)
    assert s.precision == pytest.approx(0.5) and s.recall == pytest.approx(2 / 3)
    assert s.f1 == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
    assert score_tool_names(["A", "B"], ["B", "A"]).f1 == 1.0 and not score_tool_names(["A", "B"], ["B", "A"]).exact
    empty = score_tool_names([], [])
    assert empty.exact and empty.f1 == 0.0  # the reference's safe_div: no calls on either side scores 0
    m = aggregate([s, score_tool_names(["A"], ["A"])])
    assert m.macro_precision == pytest.approx((0.5 + 1) / 2)
    assert m.micro_precision == pytest.approx(3 / 5) and m.micro_recall == pytest.approx(3 / 4)
    assert m.exact_match == 0.5


# ---- episodes -----------------------------------------------------------------------------------------
def test_registry_builds_the_adapter_and_explains_a_missing_path() -> None:
    assert isinstance(get_benchmark("finmcp", path=SAMPLES), FinMCPAdapter)
    with pytest.raises(ValueError, match="hub"):
        get_benchmark("finmcp")


def test_subsets_and_tool_scope(adapter: FinMCPAdapter) -> None:
    assert [t.task_id for t in adapter.tasks("multi_turn")] == ["4"]
    assert len(adapter.tasks("single_step,multi_step")) == 4
    assert adapter.tasks(limit=2, seed=3) == adapter.tasks(limit=2, seed=3)
    with pytest.raises(ValueError, match="valid: test"):
        adapter.tasks("hard")
    assert len(adapter.tasks()[0].tools) == 7  # every tool of the schema file is offered
    narrow = FinMCPAdapter(SAMPLES, tools_path=TOOLS, tool_scope="sample")
    assert [t["function"]["name"] for t in narrow.tasks()[1].tools] == ["GetUserHoldings", "GetFundNav"]


@pytest.mark.parametrize("history", ["gold", "own"])
def test_oracle_replay_scores_full_marks(history: str) -> None:
    adapter = FinMCPAdapter(SAMPLES, tools_path=TOOLS, history=history)
    tasks = adapter.tasks()
    run = evaluate(adapter, build_policy("oracle", tasks=tasks), tasks, progress=False, concurrency=3)
    assert [r.score for r in run.records] == [1.0] * 5 and run.metrics.success_rate == 1.0
    assert all(r.info["replay"]["stats"]["unrecorded"] == 0 for r in run.records)
    report = finmcp_report(run.records, tasks)
    assert report["overall"]["macro_f1"] == 1.0 and report["overall"]["exact_match"] == 1.0
    assert set(report["task_type"]) == {"single_step", "multi_step", "multi_turn"}
    repeated = next(r for r in run.records if r.task_id == "3")
    assert [resp["price"] for t in repeated.turns for resp in t.responses[:1] if "price" in resp] == [41.2, 41.35]


def test_gold_history_resets_each_turn_to_the_reference_conversation(adapter: FinMCPAdapter) -> None:
    task = next(t for t in adapter.tasks() if t.task_id == "4")
    policy = ScriptedPolicy(["Let me check.", "unused"])
    record = adapter.run_episode(policy, task)
    last = policy.requests[-1].messages
    assert [m["role"] for m in last][:4] == ["system", "user", "assistant", "user"]
    assert any(m.get("tool_calls") for m in last)  # turn 2's gold tool call is in the context of turn 3
    assert record.score == 0.0 and record.info["finmcp"]["fn"] == 2 and len(record.final_answers) == 3


def test_wrong_and_unrecorded_calls(adapter: FinMCPAdapter) -> None:
    task = next(t for t in adapter.tasks() if t.task_id == "1")
    call = render_tool_calls(
        [
            ToolCall("SearchFunds", {"keyword": "Harbour"}),
            ToolCall("GetExchangeRate", {"base": "EUR", "quote": "USD"}),
            ToolCall("NoSuchTool", {}),
        ]
    )
    record = adapter.run_episode(ScriptedPolicy([call, "Done."]), task)
    codes = [r["error"]["code"] for r in record.turns[0].responses]
    assert codes == ["NOT_RECORDED", "NOT_RECORDED", "UNKNOWN_TOOL"]
    assert record.info["finmcp"]["tp"] == 1 and record.info["finmcp"]["fp"] == 2
    assert record.score == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1)) and not record.success


def test_unrecorded_calls_can_be_rehearsed_by_the_policy() -> None:
    adapter = FinMCPAdapter(SAMPLES, tools_path=TOOLS, unrecorded="rehearse")
    task = next(t for t in adapter.tasks() if t.task_id == "4")
    call = render_tool_calls([ToolCall("GetExchangeRate", {"base": "EUR", "quote": "USD"})])
    policy = ScriptedPolicy([call, "ok"], rehearse=render_rehearsal({"rate": 1.09}))
    record = adapter.run_episode(policy, task)
    assert record.turns[0].responses == ({"rate": 1.09},)
    assert record.info["replay"]["stats"]["fallback_ok"] == 3
    rehearse_prompt = next(r for r in policy.requests if "execution backend" in r.messages[0]["content"])
    assert "MM0007" not in rehearse_prompt.messages[0]["content"]  # no examples from turn 0 (none) / future
    last = [r for r in policy.requests if "execution backend" in r.messages[0]["content"]][-1]
    # earlier turns' recorded responses are the conversation so far (answered calls), not a system block
    assert "Stillwater" not in last.messages[0]["content"]
    assert any("Stillwater" in m["content"] for m in last.messages[1:] if m["role"] == "assistant")
    assert "rehearse_unrecorded" in record.costs


class SimulatorBackend:
    name = "scripted-simulator"

    def __init__(self) -> None:
        self.calls = 0

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        self.calls += 1
        text = '{"rate": 0.92}' if self.calls == 1 else "I cannot say."
        return [ChatOutput(text) for _ in requests]


def test_unrecorded_calls_via_a_simulator_endpoint() -> None:
    with ChatCompletionServer(SimulatorBackend(), "sim") as server:
        adapter = FinMCPAdapter(
            SAMPLES,
            tools_path=TOOLS,
            unrecorded="simulate",
            simulator={"base_url": server.base_url, "model": "sim", "timeout": 5},
        )
        task = next(t for t in adapter.tasks() if t.task_id == "1")
        call = render_tool_calls([ToolCall("GetExchangeRate", {"base": "USD", "quote": "EUR"})] * 2)
        record = adapter.run_episode(ScriptedPolicy([call, "ok"]), task)
    first, second = record.turns[0].responses
    assert first == {"rate": 0.92} and second["error"]["code"] == "SIMULATION_FAILED"
    assert record.info["replay"]["stats"] == {**record.info["replay"]["stats"], "fallback_ok": 1, "fallback_failed": 1}
    with pytest.raises(ValueError, match="simulator"):
        FinMCPAdapter(SAMPLES, unrecorded="simulate")


def test_crashing_task_is_a_recorded_failure(adapter: FinMCPAdapter) -> None:
    class Flaky:
        name = "flaky"

        def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
            if any("copper" in str(m.get("content")) for r in requests for m in r.messages):
                raise RuntimeError("backend exploded")
            return [ChatOutput("Nothing to do.") for _ in requests]

    tasks = adapter.tasks()
    run = evaluate(adapter, Flaky(), tasks, progress=False, concurrency=2)
    crashed = [r for r in run.records if r.crashed]
    assert [r.task_id for r in crashed] == ["5"] and "exploded" in crashed[0].error
    report = finmcp_report(run.records, tasks)
    assert report["n_crashed"] == 1 and report["overall"]["n"] == 5
    assert finmcp_report(run.records, tasks, drop_errors=True)["overall"]["n"] == 4


def test_replay_executor_and_call_keys(adapter: FinMCPAdapter) -> None:
    assert call_key("F", {"b": 1.0, "a": [2.0]}) == call_key("F", {"a": [2], "b": 1})
    task = next(t for t in adapter.tasks() if t.task_id == "3")
    executor = adapter.real_executor(task)
    assert isinstance(executor, ReplayExecutor)
    prices = [executor.execute(ToolCall("GetQuote", {"ticker": "NVX"}))["price"] for _ in range(3)]
    assert prices == [41.2, 41.35, 41.2]
    assert executor.execute(ToolCall("GetQuote", {"ticker": "XYZ"}))["error"]["code"] == "NOT_RECORDED"


def test_a_folder_of_overlapping_files_is_refused(tmp_path: Path) -> None:
    for name in ("benchmark_final.json", "benchmark_stss.json"):
        (tmp_path / name).write_text(SAMPLES.read_text())
    with pytest.raises(FinMCPFormatError, match="pass one file"):
        load_samples(tmp_path)


def test_private_rehearsal_runs_on_replayed_tasks(adapter: FinMCPAdapter) -> None:
    from envace.core.rehearsal import RehearsalConfig, RehearsalScope
    from envace.rehearsal.committed import evaluate_with_rehearsal
    from envace.rehearsal.controller import RehearsalSettings

    tasks = [t for t in adapter.tasks() if t.task_id == "4"]
    oracle = build_policy("oracle", tasks=tasks)
    settings = RehearsalSettings(RehearsalConfig(n_attempts=1, scope=RehearsalScope.turn))
    run = evaluate_with_rehearsal(adapter, oracle, oracle, tasks, settings, progress=False)
    (record,) = run.records
    assert record.score == 1.0 and len(record.info["rehearsal"]["outcomes"]) == 3
    assert record.real_calls == 2  # only the committed episode reaches the record
    assert adapter.status()["status"].startswith("runnable")


def test_fidelity_skips_responses_that_the_replay_made_up(adapter: FinMCPAdapter) -> None:
    from envace.envs.finmcp import sample_of
    from envace.evaluation.fidelity import measure_fidelity

    task = next(t for t in adapter.tasks() if t.task_id == "1")
    recorded = sample_of(task).recorded[0]
    call = render_tool_calls(
        [ToolCall("GetExchangeRate", {"base": "EUR", "quote": "USD"}), recorded.call, ToolCall("NoSuchTool", {})]
    )
    record = adapter.run_episode(ScriptedPolicy([call, "Done."]), task)
    turn = record.turns[0]
    assert turn.responses[1] == recorded.response
    assert turn.stand_ins == (0,)  # NOT_RECORDED was made up by the replay
    assert turn.responses[2]["error"]["code"] == "UNKNOWN_TOOL"  # by the ACT loop's rule, not the replay
    rehearser = ScriptedPolicy(["x"], rehearse=render_rehearsal({"rate": 1.09}))
    report = measure_fidelity(rehearser, [record], [task], progress=False)
    assert [(p.tool, p.real) for p in report.pairs] == [(recorded.call.name, recorded.response)]
    probe = rehearser.requests[0]
    assert "NOT_RECORDED" not in json.dumps(probe.messages)  # nor shown as an example or as history
