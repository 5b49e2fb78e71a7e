"""VitaBench: loader, reimplemented environment, strict rubric judge, and whole episodes whose user
simulator and judge are served over real HTTP by ``ChatCompletionServer`` (scripted, deterministic)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from envace.core.records import Termination, ToolCall
from envace.core.wire import render_tool_calls
from envace.envs.vitabench import (
    NEEDS_ENDPOINTS,
    MalformedJudgement,
    RubricJudge,
    RubricJudgeConfig,
    VitaBenchAdapter,
    VitaExecutor,
    VitaFormatError,
    load_tasks,
    parse_window_states,
    render_transcript,
    sliding_windows,
    vitabench_report,
)
from envace.envs.vitabench.tools_delivery import delivery_minutes
from envace.evaluation import evaluate, get_benchmark
from envace.inference.base import ChatOutput, ChatRequest
from envace.inference.openai_server import ChatCompletionServer

CHECKOUT = Path(__file__).resolve().parents[2] / "fixtures" / "vitabench"
DELIVERY = CHECKOUT / "data" / "vita" / "domains" / "delivery" / "tasks_en.json"
OFFICE = "Floor 7, Lumen Tower, 18 Harbour Road, Eastgate District, Maplefield"
FAST = {"backoff_s": 0.001, "max_backoff_s": 0.002}


def spec(task_id: str = "9001", domain: str = "delivery"):
    return next(t for t in load_tasks(CHECKOUT, (domain,)) if t.task_id == task_id)


def executor(task_id: str = "9001", domain: str = "delivery") -> VitaExecutor:
    s = spec(task_id, domain)
    return VitaExecutor(s.environment, s.tool_domains)


def order_call(**overrides) -> ToolCall:
    args = {
        "user_id": "U100",
        "store_id": "ST_NOODLE",
        "product_ids": ["P_SOUP"],
        "product_cnts": [2],
        "address": OFFICE,
        "dispatch_time": "2031-05-09 11:15:00",
        **overrides,
    }
    return ToolCall("create_delivery_order", args)


# ---- scripted endpoints ---------------------------------------------------------------------------------
class ScriptedUser:
    """The user simulator: its k-th reply is ``lines[k]`` (k = its own earlier messages, seen as assistant)."""

    name = "scripted-user"

    def __init__(self, lines: Sequence[str]) -> None:
        self.lines = list(lines)
        self.systems: list[str] = []

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        out = []
        for r in requests:
            self.systems.append(r.messages[0]["content"])
            k = sum(1 for m in r.messages if m["role"] == "assistant")
            out.append(ChatOutput(self.lines[min(k, len(self.lines) - 1)]))
        return out


class ScriptedJudge:
    """Marks every rubric met (window mode: reads the ids from <current_rubrics>); ``bad`` malformed first."""

    name = "scripted-judge"

    def __init__(self, bad: int = 0, met: bool = True) -> None:
        self.bad, self.met, self.calls = bad, met, 0
        self.prompts: list[str] = []

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        out = []
        for r in requests:
            self.calls += 1
            user = r.messages[-1]["content"]
            self.prompts.append(user)
            if self.calls <= self.bad:
                out.append(ChatOutput('All rubrics look fine: {"answer": "yes"}'))
            elif "<current_rubrics>" in user:
                current = json.loads(user.split("<current_rubrics>\n")[1].split("\n</current_rubrics>")[0])
                verdicts = [
                    {"rubric_idx": c["rubric_idx"], "justification": "[3] ok", "meetExpectation": self.met}
                    for c in current
                ]
                out.append(ChatOutput("<think>checking</think>\n```json\n" + json.dumps(verdicts) + "\n```"))
            else:
                out.append(ChatOutput(json.dumps({"analysis": "ok", "answer": self.met})))
        return out


class ScriptedAgent:
    """Orders the soup for task 9001: search, create, ask, pay, confirm (decided from the conversation)."""

    name = "scripted-agent"

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
        return [ChatOutput(self.reply(list(r.messages))) for r in requests]

    @staticmethod
    def reply(messages: list[dict]) -> str:
        users = sum(1 for m in messages if m["role"] == "user")
        tools = [json.loads(m["content"]) for m in messages if m["role"] == "tool"]
        last = messages[-1]["role"]
        if users == 1 and not tools:
            search = ToolCall("delivery_product_search_recommand", {"keywords": ["mild noodle soup"]})
            return render_tool_calls([search])
        if users == 1 and len(tools) == 1:
            best = tools[0]["products"][0]
            return render_tool_calls([order_call(product_ids=[best["product_id"]], product_cnts=[1])])
        if users == 1:
            return f"Order {tools[-1]['order_id']} is ready. Shall I pay?"
        if last == "user":
            return render_tool_calls([ToolCall("pay_delivery_order", {"order_id": "OD0001"})])
        return "Paid. Anything else?"


@pytest.fixture()
def endpoints():
    """(user server, judge server) factory: real HTTP on 127.0.0.1, stopped at the end."""
    servers: list[ChatCompletionServer] = []

    def start(user: ScriptedUser, judge: ScriptedJudge) -> tuple[dict, dict]:
        for backend, name in ((user, "user-sim"), (judge, "judge")):
            servers.append(ChatCompletionServer(backend, name).start())
        return (
            {"base_url": servers[-2].base_url, "model": "user-sim", "timeout": 5},
            {"base_url": servers[-1].base_url, "model": "judge", "timeout": 5},
        )

    yield start
    for server in servers:
        server.stop()


USER_LINES = ["It's raining; I'd like a mild noodle soup at my office around 11:45.", "Yes, please pay.", "###STOP###"]


# ---- loading ------------------------------------------------------------------------------------------
def test_loader_reads_the_checkout_layout() -> None:
    tasks = load_tasks(CHECKOUT, ("delivery", "instore"))
    assert [(t.domain, t.task_id) for t in tasks] == [("delivery", "9001"), ("delivery", "9002"), ("instore", "9101")]
    first = tasks[0]
    assert first.rubrics == (
        "The order must contain exactly one Mild chicken noodle soup",
        "The order must be delivered to the office address",
        "The order must be paid",
    )
    assert first.tool_domains == ("delivery",) and first.reproduced and first.time == "2031-05-09 11:00:00"
    assert tasks[2].raw_domain == "in-store consumption" and tasks[2].tool_domains == ("instore",)
    assert [t.task_id for t in load_tasks(DELIVERY)] == ["9001", "9002"]  # a tasks file works too
    assert len(load_tasks(CHECKOUT / "data" / "vita" / "domains", ("instore",))) == 1


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda t: t.pop("instructions"), "field 'instructions'"),
        (lambda t: t["environment"].pop("time"), "field 'environment.time'"),
        (lambda t: t["user_scenario"].pop("user_profile"), "field 'user_scenario.user_profile'"),
        (lambda t: t.__setitem__("message_history", [{"role": "user", "content": "hi"}]), "message_history"),
        (lambda t: t["environment"].__setitem__("stores", []), "environment.stores"),
    ],
)
def test_loader_errors_name_file_row_and_field(tmp_path: Path, mutate, needle: str) -> None:
    rows = json.loads(DELIVERY.read_text())
    mutate(rows[1])
    folder = tmp_path / "delivery"
    folder.mkdir()
    (folder / "tasks_en.json").write_text(json.dumps(rows))
    with pytest.raises(VitaFormatError, match="tasks_en.json: row 1") as info:
        load_tasks(folder, ("delivery",))
    assert needle in str(info.value)


def test_loader_explains_missing_data(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="clone"):
        load_tasks(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="ota"):
        load_tasks(CHECKOUT, ("ota",))
    with pytest.raises(ValueError, match="valid"):
        load_tasks(CHECKOUT, ("flights",))
    with pytest.raises(VitaFormatError, match="no VitaBench domain folders"):
        load_tasks(tmp_path)


# ---- environment --------------------------------------------------------------------------------------
def test_delivery_order_lifecycle_and_numbers() -> None:
    ex = executor()
    order = ex.execute(order_call())
    assert order["order_id"] == "OD0001" and order["status"] == "unpaid" and order["total_price"] == 44.0
    # office (120.10, 30.20) to the store (120.10, 30.21): 0.01° of latitude = 1112 m → 25 + 7.24 min → 32
    assert order["shipping_time"] == 32.0 == delivery_minutes(1112)
    assert order["delivery_time"] == "2031-05-09 11:47:00"
    assert ex.execute(ToolCall("pay_delivery_order", {"order_id": "OD0001"}))["message"] == "Payment successful"
    assert "unpaid" in ex.execute(ToolCall("pay_delivery_order", {"order_id": "OD0001"}))["error"]
    assert ex.execute(ToolCall("get_delivery_order_status", {"order_id": "OD0001"}))["status"] == "paid"
    assert (
        ex.execute(ToolCall("search_delivery_orders", {"user_id": "U100", "status": "paid"}))["orders"][0]["order_id"]
        == "OD0001"
    )
    assert ex.execute(ToolCall("cancel_delivery_order", {"order_id": "OD0001"}))["message"].endswith("cancelled.")
    assert ex.state()["orders"]["OD0001"]["status"] == "cancelled" and ex.failures == 0


@pytest.mark.parametrize(
    ("overrides", "needle", "counted"),
    [
        ({"user_id": "U999"}, "does not match", False),
        ({"dispatch_time": "2031-05-09 10:00:00"}, "must be in the future", False),
        ({"dispatch_time": "noon"}, "invalid format", False),
        ({"product_cnts": [0]}, "list is invalid", False),
        ({"product_ids": ["P_NOPE"]}, "P_NOPE not found", True),
        ({"address": "Somewhere unknown on the moon"}, "not found for address", True),
    ],
)
def test_delivery_order_checks(overrides: dict, needle: str, counted: bool) -> None:
    ex = executor()
    result = ex.execute(order_call(**overrides))
    assert needle in result["error"] and ex.failures == int(counted) and not ex.state()["orders"]


def test_general_tools_and_search_ranking() -> None:
    ex = executor()
    assert (
        ex.execute(ToolCall("weather", {"address": OFFICE, "date_start": "2031-05-10", "date_end": "2031-05-12"}))[
            "weather"
        ][0]["category"]
        == "cloudy"
    )
    assert ex.execute(ToolCall("address_to_longitude_latitude", {"address": "Lumen Tower, 18 Harbour Road"})) == [
        120.1,
        30.2,
    ]
    ranked = ex.execute(ToolCall("delivery_product_search_recommand", {"keywords": ["mild noodle soup"]}))
    assert [p["product_id"] for p in ranked["products"]][0] == "P_SOUP"
    stores = ex.execute(ToolCall("delivery_store_search_recommand", {"keywords": ["Salad"]}))["stores"]
    assert stores[0]["store_id"] == "ST_SALAD" and "products" not in stores[0]
    nearby = ex.execute(ToolCall("get_nearby", {"longitude": 120.1, "latitude": 30.2, "range": 1500}))
    assert [s["store_id"] for s in nearby["results"]] == ["ST_NOODLE"]
    assert ex.execute(
        ToolCall(
            "longitude_latitude_to_distance",
            {"longitude1": 120.1, "latitude1": 30.2, "longitude2": 120.1, "latitude2": 30.21},
        )
    ) == {"distance_m": 1112.0}
    assert ex.execute(ToolCall("get_user_historical_behaviors", {}))["user id"] == "U100"


def test_unavailable_tools_and_bad_arguments_are_structured_errors() -> None:
    ex = executor()
    assert ex.execute(ToolCall("create_hotel_order", {}))["error"].startswith("NOT_REPRODUCED")
    assert ex.execute(ToolCall("get_holiday_date", {"year": "2031", "holiday_name": "x"}))["error"].startswith(
        "NOT_REPRODUCED"
    )
    assert ex.execute(ToolCall("instore_book", {}))["error"].startswith("UNKNOWN_TOOL")  # not a delivery tool
    assert "missing arguments ['order_id']" in ex.execute(ToolCall("pay_delivery_order", {}))["error"]
    assert (
        "unexpected arguments ['extra']"
        in ex.execute(ToolCall("get_delivery_order_status", {"order_id": "x", "extra": 1}))["error"]
    )
    assert ex.failures == 5 and ex.calls == 5


def test_existing_orders_and_instore_tools() -> None:
    ex = executor("9002")
    assert ex.execute(ToolCall("cancel_delivery_order", {"order_id": "9002O01"}))["message"].startswith("Order 9002O01")
    ins = executor("9101", "instore")
    book = ins.execute(
        ToolCall(
            "instore_book",
            {"user_id": "U200", "shop_id": "SH_BISTRO", "time": "2031-06-01 19:00:00", "customer_count": 2},
        )
    )
    assert book["status"] == "unpaid" and book["book_price"] == 20.0
    assert ins.execute(ToolCall("pay_instore_book", {"book_id": book["book_id"]}))["message"] == "Payment successful"
    assert (
        "does not support"
        in ins.execute(
            ToolCall("instore_book", {"user_id": "U200", "shop_id": "SH_YOGA", "time": "2031-06-01 19:00:00"})
        )["error"]
    )
    order = ins.execute(
        ToolCall("create_instore_product_order", {"user_id": "U200", "shop_id": "SH_BISTRO", "product_id": "P_SET2"})
    )
    assert order["total_price"] == 168.0 and order["products"][0]["quantity"] == 1
    res = ins.execute(
        ToolCall(
            "instore_reservation",
            {"user_id": "U200", "shop_id": "SH_YOGA", "time": "2031-06-02 08:00:00", "customer_count": 1},
        )
    )
    assert res["status"] == "unconsumed"
    moved = ins.execute(
        ToolCall("instore_modify_reservation", {"reservation_id": res["reservation_id"], "time": "2031-06-02 09:00:00"})
    )
    assert moved["reservation_time"] == "2031-06-02 09:00:00" and moved["customer_count"] == 1
    assert (
        ins.execute(ToolCall("search_instore_reservation", {"user_id": "U200"}))["reservations"][0]["status"]
        == "unconsumed"
    )
    state = ins.state()
    assert set(state["created"]) == {"OB0001", "OI0002", "OR0003"} and state["books"]["OB0001"]["status"] == "paid"


# ---- judge --------------------------------------------------------------------------------------------
def test_window_states_are_parsed_strictly() -> None:
    keys = ["rubric_0", "rubric_1"]
    ok = '```json\n[{"rubric_idx": "rubric_1", "justification": "x", "meetExpectation": true}]\n```'
    assert parse_window_states(ok, keys) == {"rubric_1": (True, "x")}
    for bad in (
        '[{"rubric_idx": "rubric_9", "meetExpectation": true}]',
        '[{"rubric_idx": "rubric_0", "meetExpectation": "true"}]',
        'Sure! [{"rubric_idx": "rubric_0", "meetExpectation": true}]',
        '"fine"',
    ):
        with pytest.raises(MalformedJudgement):
            parse_window_states(bad, keys)
    assert sliding_windows(25, 10, 2) == [(0, 10), (8, 18), (16, 25)] and sliding_windows(4, 10, 2) == [(0, 4)]
    text = render_transcript(
        [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "pay", "arguments": '{"order_id": "A1"}'}}],
            },
            {"role": "user", "content": "ok"},
        ],
        5,
    )
    assert text == "[6] assistant: pay(order_id='A1')\n[7] user: ok"


def test_judge_keeps_state_across_windows_and_retries() -> None:
    class TwoWindows:
        name = "two"

        def __init__(self) -> None:
            self.calls = 0

        def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
            self.calls += 1
            answers = [
                "not json",
                '[{"rubric_idx": "rubric_0", "justification": "[2] done", "meetExpectation": true}]',
                '[{"rubric_idx": "rubric_1", "justification": "[12] no", "meetExpectation": false}]',
            ]
            return [ChatOutput(answers[self.calls - 1])]

    backend = TwoWindows()
    transcript = [{"role": "user", "content": f"m{i}"} for i in range(12)]
    result = RubricJudge(backend, RubricJudgeConfig(**FAST)).judge("t", "time", "goal", ["a", "b"], transcript)
    assert [s.met for s in result.states] == [True, False] and result.requests == 3 and result.windows == 2
    assert result.reward == 0.0 and result.rubric_score == 0.5


# ---- whole episodes over HTTP -------------------------------------------------------------------------
def test_status_without_endpoints_and_failed_records() -> None:
    adapter = get_benchmark("vitabench", path=CHECKOUT)
    assert adapter.status()["status"] == NEEDS_ENDPOINTS
    run = evaluate(adapter, ScriptedAgent(), adapter.tasks(limit=1), progress=False)
    assert run.records[0].crashed and NEEDS_ENDPOINTS in run.records[0].error
    with pytest.raises(ValueError, match="checkout"):
        VitaBenchAdapter()


def test_episode_with_simulated_user_and_judge_over_http(endpoints) -> None:
    user, judge = ScriptedUser(USER_LINES), ScriptedJudge(bad=1)
    user_cfg, judge_cfg = endpoints(user, judge)
    adapter = VitaBenchAdapter(CHECKOUT, user_simulator=user_cfg, judge=judge_cfg, judge_config=FAST)
    assert adapter.status()["status"] == "runnable"
    task = adapter.tasks("delivery")[0]
    create = next(t["function"] for t in task.tools if t["function"]["name"] == "create_delivery_order")
    assert "Precondition: Store and products are known" in create["description"]  # from the checkout's table
    run = evaluate(adapter, ScriptedAgent(), [task], progress=False)
    record = run.records[0]
    info = record.info["vitabench"]
    assert record.error is None and record.score == 1.0 and record.success and info["rubric_score"] == 1.0
    assert info["end"] == "user_stop" and record.termination is Termination.FINAL_REPLY
    assert record.final_state["orders"]["OD0001"]["status"] == "paid" and record.real_calls == 3
    assert [m["role"] for m in info["transcript"]][:3] == ["assistant", "user", "assistant"]
    assert info["judge_requests"] == 3  # 12 messages = 2 windows, the first answered malformed once
    assert "Maplefield" in user.systems[0] and "mild chicken noodle soup" in user.systems[0]
    assert record.costs["user_simulator"]["calls"] == 3
    assert vitabench_report(run.records)["overall"] == {"n": 1, "success_rate": 1.0, "mean_rubric_score": 1.0}


def test_failed_judge_and_premature_ends(endpoints) -> None:
    user_cfg, judge_cfg = endpoints(ScriptedUser(USER_LINES), ScriptedJudge(bad=10_000))
    adapter = VitaBenchAdapter(
        CHECKOUT, user_simulator=user_cfg, judge=judge_cfg, judge_config={**FAST, "max_retries": 1}
    )
    failed = adapter.run_episode(ScriptedAgent(), adapter.tasks("delivery")[0])
    assert failed.error.startswith("JudgeFailed") and failed.info["vitabench"]["judge_status"] == "failed"
    report = vitabench_report([failed])
    assert report["n_judge_failed"] == 1 and report["overall"]["n"] == 0

    class Chatty:
        name = "chatty"

        def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
            return [ChatOutput(render_tool_calls([ToolCall("get_user_all_orders", {})])) for _ in requests]

    short = VitaBenchAdapter(CHECKOUT, user_simulator=user_cfg, judge=judge_cfg, max_steps=6)
    record = short.run_episode(Chatty(), short.tasks("delivery")[0])
    assert record.info["vitabench"]["end"] == "max_steps" and record.score == 0.0 and record.error is None
    assert record.info["vitabench"]["judge_status"].startswith("skipped")

    class Broken:
        name = "broken"

        def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
            return [ChatOutput("<tool_call>\n{not json\n</tool_call>") for _ in requests]

    bad = short.run_episode(Broken(), short.tasks("delivery")[0])
    assert bad.termination is Termination.ACT_PARSE_ERROR and bad.parse_failures == 1 and bad.score == 0.0


def test_per_rubric_mode_and_refused_rehearsal(endpoints) -> None:
    judge = ScriptedJudge(met=False)
    user_cfg, judge_cfg = endpoints(ScriptedUser(USER_LINES), judge)
    adapter = VitaBenchAdapter(
        CHECKOUT,
        user_simulator=user_cfg,
        judge=judge_cfg,
        judge_config={**FAST, "mode": "per_rubric", "concurrency": 2},
    )
    record = adapter.run_episode(ScriptedAgent(), adapter.tasks("delivery")[0])
    assert record.score == 0.0 and record.info["vitabench"]["judge_requests"] == 3 and judge.calls == 3
    assert all("<rubric>" in p for p in judge.prompts)
    with pytest.raises(ValueError, match="rehearsal is not supported"):
        next(adapter.episode_program(adapter.tasks()[0], turn_hook=lambda view: iter(())))


def test_subsets_and_unreproduced_tasks(tmp_path: Path) -> None:
    checkout = tmp_path / "vita"
    shutil.copytree(CHECKOUT, checkout)
    rows = json.loads(DELIVERY.read_text())
    rows[1]["environment"]["hotels"] = {"H1": {"hotel_id": "H1"}}
    (checkout / "data/vita/domains/delivery/tasks_en.json").write_text(json.dumps(rows))
    adapter = VitaBenchAdapter(checkout)
    assert [t.task_id for t in adapter.tasks()] == ["delivery/9001", "instore/9101"]
    assert adapter.status()["n_reproduced"] == 2
    everything = VitaBenchAdapter(checkout, include_unreproduced=True)
    hotel_task = everything.tasks("delivery")[1]
    assert "ota" in hotel_task.meta["vita_task"].tool_domains
    with pytest.raises(ValueError, match="not loaded"):
        adapter.tasks("ota")


def test_each_trial_draws_its_own_seeds_and_trial_zero_keeps_the_single_run_ones(endpoints) -> None:
    from envace.evaluation import with_trials

    class SeedRecorder(ScriptedAgent):
        def __init__(self) -> None:
            self.seeds: list[int] = []

        def generate(self, requests: Sequence[ChatRequest]) -> list[ChatOutput]:
            self.seeds += [r.seed for r in requests]
            return super().generate(requests)

    user_cfg, judge_cfg = endpoints(ScriptedUser(USER_LINES), ScriptedJudge())
    adapter = VitaBenchAdapter(CHECKOUT, user_simulator=user_cfg, judge=judge_cfg, judge_config=FAST)
    task = adapter.tasks("delivery")[0]
    single, trials = SeedRecorder(), SeedRecorder()
    evaluate(adapter, single, [task], progress=False)
    evaluate(adapter, trials, with_trials([task], 2), progress=False)
    n = len(single.seeds)
    assert n >= 3 and len(trials.seeds) == 2 * n
    assert trials.seeds[:n] == single.seeds and not set(trials.seeds[n:]) & set(single.seeds)
