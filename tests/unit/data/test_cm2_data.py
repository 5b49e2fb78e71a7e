"""CM2 reader/validator: every malformed class lands in rejects with its reason; fuzzing never crashes."""

from __future__ import annotations

import copy
import json
import urllib.request
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envace.data.cm2 import (
    Cm2ValidationConfig,
    RawRow,
    RejectReason,
    cm2_row_to_episode_spec,
    dataset_stats,
    load_cm2,
    read_cm2_bytes,
    read_cm2_file,
    reject_counts,
    split_of,
    split_rows,
    validate_rows,
)

SAMPLE = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "cm2" / "checklist_annotated_sample.json"
R = RejectReason
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look something up.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
    },
}


def make_row(uuid: str = "row-0", n_turns: int = 2) -> dict:
    """A valid row: in turn t the assistant thinks, calls lookup(key=f"k{t}"), then replies."""
    messages: list[dict] = [{"role": "system", "content": "You are helpful."}]
    checklists: list[list[dict]] = []
    for t in range(n_turns):
        call = {
            "id": f"c{t}",
            "type": "function",
            "function": {"name": "lookup", "arguments": json.dumps({"key": f"k{t}"})},
        }
        messages += [
            {"role": "user", "content": f"question {t}"},
            {"role": "assistant", "content": "<think>\ncall it\n</think>", "tool_calls": [call]},
            {"role": "tool", "content": json.dumps({"value": t}), "tool_call_id": f"c{t}"},
            {"role": "assistant", "content": f"<think>ok</think>\n\nThe value is {t}."},
        ]
        checklists.append(
            [
                {
                    "id": "C0",
                    "question": "called lookup?",
                    "focus_on": "assistant.tool_calls",
                    "pass_condition": f'name=lookup and arguments.key == "k{t}"',
                    "failure_examples": [],
                    "evidence": [{"turn": t, "step": 0, "from": "assistant.tool_calls", "snippet": "lookup"}],
                    "weight": 0.7,
                    "required_for_next_turn": True,
                    "dependence": [],
                },
                {
                    "id": "C1",
                    "question": "reported?",
                    "focus_on": "assistant.content.user_visible_reply",
                    "pass_condition": f'The reply contains "value is {t}".',
                    "failure_examples": [],
                    "evidence": [],
                    "weight": 0.3,
                    "required_for_next_turn": False,
                    "dependence": ["C0"],
                },
            ]
        )
    return {"uuid": uuid, "messages": messages, "tools": [copy.deepcopy(TOOL)], "checklists": [checklists]}


def reason_of(row: object, config: Cm2ValidationConfig = Cm2ValidationConfig()) -> RejectReason | None:
    accepted, rejects = validate_rows([row], config)
    assert len(accepted) + len(rejects) == 1
    return rejects[0].reason_code if rejects else None


def mutate(fn) -> dict:
    row = make_row()
    fn(row)
    return row


# ---- the public sample ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sample_path() -> Path:
    if not SAMPLE.is_file():
        pytest.skip(f"CM2 sample not present at {SAMPLE}")
    return SAMPLE


def test_cm2_sample_is_accepted_with_stats_and_spec(sample_path: Path) -> None:
    accepted, rejects = load_cm2(sample_path)
    assert len(accepted) == 1 and reject_counts(rejects) == {}
    stats = dataset_stats(accepted)
    assert (stats.user_turns.total, stats.tools_per_row.total, stats.calls_per_turn.total) == (3, 1, 1)
    assert stats.items_per_turn.histogram == ((4, 2), (6, 1))
    assert stats.steps_per_turn.total == 4
    spec = cm2_row_to_episode_spec(accepted[0])
    assert spec.n_turns == 3 and spec.system_prompt == "" and spec.checklist.n_turns == 3
    assert [len(t) for t in spec.exchanges] == [1, 0, 0]
    exchange = spec.exchanges[0][0]
    assert exchange.call.name == "get_the_last_games_of_a_football_team"
    assert exchange.call.arguments == {"teamid": "Washington Huskies"}
    assert exchange.response["error"] == "Invalid tool call"
    assert spec.reference_replies[0].startswith("It looks like there was an issue")
    task = spec.to_task(split="val")
    assert task.task_id == spec.uuid and len(task.gold_calls[0]) == 1 and task.checklists[0][0]["id"] == "C0"


def test_cm2_sample_truncated_and_corrupted(sample_path: Path) -> None:
    data = sample_path.read_bytes()
    rows, rejects = read_cm2_bytes(data[: len(data) // 2])
    assert rows == [] and [r.reason_code for r in rejects] == [R.TRUNCATED_JSON]
    corrupted = data.replace(b"Washington Huskies", b"Washington \xff\xfeHuskies", 1)
    rows, rejects = read_cm2_bytes(corrupted)
    assert rows == [] and [r.reason_code for r in rejects] == [R.NON_UTF8]


# ---- reader ---------------------------------------------------------------------------------------


def test_reader_accepts_list_single_object_and_jsonl() -> None:
    a, b = make_row("a"), make_row("b")
    for data in [
        json.dumps([a, b]),
        json.dumps([a, b], indent=2),
        json.dumps(a) + "\n" + json.dumps(b) + "\n",
    ]:
        rows, rejects = read_cm2_bytes(data.encode())
        assert [r.value["uuid"] for r in rows] == ["a", "b"] and rejects == []
    rows, rejects = read_cm2_bytes(json.dumps(a, indent=2).encode())
    assert len(rows) == 1 and rejects == []
    assert read_cm2_bytes(b"") == ([], []) and read_cm2_bytes(b"\xef\xbb\xbf[]") == ([], [])


def test_truncated_list_keeps_complete_rows() -> None:
    data = json.dumps([make_row("a"), make_row("b"), make_row("c")], indent=1).encode()
    cut = data.index(b'"uuid": "c"') + 40
    rows, rejects = read_cm2_bytes(data[:cut])
    assert [r.value["uuid"] for r in rows] == ["a", "b"]
    assert [(r.reason_code, r.index) for r in rejects] == [(R.TRUNCATED_JSON, 2)]


def test_invalid_element_in_list_costs_one_row() -> None:
    good = json.dumps(make_row("a"))
    data = f'[{good}, {{"uuid": "x", "messages": [1, 2,, 3]}}, {json.dumps(make_row("b"))}]'.encode()
    rows, rejects = read_cm2_bytes(data)
    assert [r.value["uuid"] for r in rows] == ["a", "b"] and [r.index for r in rows] == [0, 2]
    assert [(r.reason_code, r.index) for r in rejects] == [(R.INVALID_JSON, 1)]


def test_jsonl_bad_lines_are_rejects() -> None:
    lines = [
        json.dumps(make_row("a")),
        '{"uuid": broken}',
        json.dumps(make_row("b")),
        json.dumps(make_row("c"))[:50],
    ]
    rows, rejects = read_cm2_bytes("\n".join(lines).encode())
    assert [r.value["uuid"] for r in rows] == ["a", "b"]
    assert [(r.reason_code, r.index) for r in rejects] == [(R.INVALID_JSON, 1), (R.TRUNCATED_JSON, 3)]


def test_non_utf8_rows_are_rejected_individually() -> None:
    good = json.dumps(make_row("a")).encode()
    bad = json.dumps(make_row("b")).encode().replace(b"question 0", b"question \x80\x81")
    for data in (b"[" + good + b"," + bad + b"]", good + b"\n" + bad):
        rows, rejects = read_cm2_bytes(data)
        assert [r.value["uuid"] for r in rows] == ["a"]
        assert [r.reason_code for r in rejects] == [R.NON_UTF8]


def test_load_reports_reader_and_validation_rejects(tmp_path: Path) -> None:
    path = tmp_path / "cm2.jsonl"
    lines = [json.dumps(make_row("a")), "{oops}", json.dumps(mutate(lambda r: r.pop("tools")))]
    path.write_text("\n".join(lines))
    accepted, rejects = load_cm2(path)
    assert len(accepted) == 1
    assert reject_counts(rejects) == {"invalid_json": 1, "missing_field": 1}
    assert [r.to_json()["reason_code"] for r in rejects] == ["invalid_json", "missing_field"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_cm2(tmp_path / "absent.json")


# ---- validation: one test row per malformed class --------------------------------------------------


def _set_weight(row: dict, value: object) -> None:
    row["checklists"][0][0][0]["weight"] = value


def _parameters(row: dict) -> dict:
    return row["tools"][0]["function"]["parameters"]


def _set_property(row: dict, keyword: str, value: object) -> None:
    _parameters(row)["properties"]["key"][keyword] = value


MALFORMED = {
    "row_not_object": ([1, 2], R.WRONG_TYPE),
    "messages_not_list": (mutate(lambda r: r.update(messages="hi")), R.WRONG_TYPE),
    "uuid_not_string": (mutate(lambda r: r.update(uuid=7)), R.WRONG_TYPE),
    "content_not_string": (mutate(lambda r: r["messages"][1].update(content=["x"])), R.WRONG_TYPE),
    "missing_tools": (mutate(lambda r: r.pop("tools")), R.MISSING_FIELD),
    "missing_uuid": (mutate(lambda r: r.pop("uuid")), R.MISSING_FIELD),
    "unknown_role": (mutate(lambda r: r["messages"][1].update(role="human")), R.BAD_MESSAGE),
    "empty_user": (mutate(lambda r: r["messages"][1].update(content="  ")), R.BAD_MESSAGE),
    "missing_tool_message": (mutate(lambda r: r["messages"].pop(3)), R.UNPAIRED_TOOL_CALL),
    "extra_tool_message": (
        mutate(lambda r: r["messages"].insert(4, {"role": "tool", "content": "{}"})),
        R.UNPAIRED_TOOL_CALL,
    ),
    "mismatched_call_id": (
        mutate(lambda r: r["messages"][3].update(tool_call_id="zzz")),
        R.UNPAIRED_TOOL_CALL,
    ),
    "two_users_in_a_row": (
        mutate(lambda r: r["messages"].insert(1, {"role": "user", "content": "hi"})),
        R.BAD_ROLE_ORDER,
    ),
    "ends_with_user": (
        mutate(lambda r: r["messages"].append({"role": "user", "content": "more"})),
        R.BAD_ROLE_ORDER,
    ),
    "system_in_middle": (
        mutate(lambda r: r["messages"].insert(5, {"role": "system", "content": "x"})),
        R.BAD_ROLE_ORDER,
    ),
    "arguments_not_json": (
        mutate(lambda r: r["messages"][2]["tool_calls"][0]["function"].update(arguments="{key: 1")),
        R.BAD_ARGUMENTS_JSON,
    ),
    "arguments_not_object": (
        mutate(lambda r: r["messages"][2]["tool_calls"][0]["function"].update(arguments="[1]")),
        R.BAD_ARGUMENTS_JSON,
    ),
    "call_without_function": (
        mutate(lambda r: r["messages"][2]["tool_calls"][0].pop("function")),
        R.BAD_TOOL_CALL,
    ),
    "unknown_tool": (
        mutate(lambda r: r["messages"][2]["tool_calls"][0]["function"].update(name="nope")),
        R.UNKNOWN_TOOL,
    ),
    "schema_not_object": (
        mutate(lambda r: r["tools"][0]["function"].update(parameters={"type": "array"})),
        R.BAD_TOOL_SCHEMA,
    ),
    "schema_bad_name": (
        mutate(lambda r: r["tools"][0]["function"].update(name="look up!")),
        R.BAD_TOOL_SCHEMA,
    ),
    "schema_required_undeclared": (
        mutate(lambda r: r["tools"][0]["function"]["parameters"].update(required=["zz"])),
        R.BAD_TOOL_SCHEMA,
    ),
    "duplicate_tool": (mutate(lambda r: r["tools"].append(copy.deepcopy(TOOL))), R.BAD_TOOL_SCHEMA),
    "two_think_blocks": (
        mutate(lambda r: r["messages"][4].update(content="<think>a</think><think>b</think>x")),
        R.THINK_TAGS,
    ),
    "unclosed_think": (mutate(lambda r: r["messages"][4].update(content="<think>a")), R.THINK_TAGS),
    "think_not_first": (
        mutate(lambda r: r["messages"][4].update(content="hi <think>a</think>")),
        R.THINK_TAGS,
    ),
    "think_in_user": (mutate(lambda r: r["messages"][1].update(content="<think>x</think>q")), R.THINK_TAGS),
    "weights_sum_wrong": (mutate(lambda r: _set_weight(r, 0.6)), R.BAD_WEIGHTS),
    "weight_string": (mutate(lambda r: _set_weight(r, "0.7")), R.BAD_WEIGHTS),
    "weight_negative": (mutate(lambda r: _set_weight(r, -0.7)), R.BAD_WEIGHTS),
    "checklist_item_no_question": (
        mutate(lambda r: r["checklists"][0][0][0].pop("question")),
        R.BAD_CHECKLIST,
    ),
    "checklist_empty": (mutate(lambda r: r.update(checklists=[])), R.BAD_CHECKLIST),
    "checklist_turn_missing": (mutate(lambda r: r["checklists"][0].pop()), R.CHECKLIST_TURN_MISMATCH),
    # the hand-written validator crashed on an unhashable role (TypeError); now it is a reject
    "role_unhashable": (mutate(lambda r: r["messages"][1].update(role=["user"])), R.BAD_MESSAGE),
    "tool_without_type": (mutate(lambda r: r["tools"][0].pop("type")), R.BAD_TOOL_SCHEMA),
    # invalid under the Draft 2020-12 meta-schema (accepted by the hand-written subset check)
    "property_type_null": (mutate(lambda r: _set_property(r, "type", None)), R.BAD_TOOL_SCHEMA),
    "pattern_not_a_regex": (mutate(lambda r: _set_property(r, "pattern", "(")), R.BAD_TOOL_SCHEMA),
    "keyword_wrong_type": (mutate(lambda r: _parameters(r).update(minProperties="a")), R.BAD_TOOL_SCHEMA),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_each_malformed_class_is_rejected_with_its_reason(case: str) -> None:
    row, reason = MALFORMED[case]
    assert reason_of(row) is reason


def test_valid_rows_and_tolerances() -> None:
    assert reason_of(make_row()) is None
    assert reason_of(mutate(lambda r: _set_weight(r, 0.7 + 5e-7))) is None  # within 1e-6
    no_system = mutate(lambda r: r["messages"].pop(0))
    assert reason_of(no_system) is None
    no_think = mutate(lambda r: r["messages"][4].update(content="plain reply"))
    assert reason_of(no_think) is None
    assert reason_of(no_think, Cm2ValidationConfig(require_think=True)) is R.THINK_TAGS


def test_huge_rows_and_duplicates() -> None:
    big = mutate(lambda r: r["messages"][1].update(content="x" * 5000))
    assert reason_of(big, Cm2ValidationConfig(max_row_bytes=4000)) is R.ROW_TOO_LARGE
    assert reason_of(big) is None
    accepted, rejects = validate_rows([make_row("a"), make_row("b"), make_row("a")])
    assert [r["uuid"] for r in accepted] == ["a", "b"]
    assert [(r.reason_code, r.index, r.row_id) for r in rejects] == [(R.DUPLICATE_UUID, 2, "a")]


def test_reject_records_carry_location() -> None:
    row = MALFORMED["arguments_not_json"][0]
    _, rejects = validate_rows([make_row("ok"), RawRow(17, row, "data/raw/cm2/x.jsonl")])
    (rej,) = rejects
    assert (rej.row_id, rej.index, rej.field) == ("row-0", 17, "messages[2].tool_calls[0].function.arguments")
    assert set(rej.to_json()) == {"source", "row_id", "index", "field", "reason_code", "message"}
    assert str(rej) == (
        "data/raw/cm2/x.jsonl row 17 (uuid 'row-0'): bad_arguments_json at "
        "messages[2].tool_calls[0].function.arguments: arguments are not valid JSON"
    )
    _, (plain,) = validate_rows([[1]], source="rows.json")
    assert str(plain) == "rows.json row 0: wrong_type at (row): a row must be a JSON object, got list"


def test_field_paths_of_schema_and_shape_problems() -> None:
    cases = [
        (MALFORMED["missing_tools"][0], "tools"),
        (MALFORMED["schema_required_undeclared"][0], "tools[0].function.parameters.required"),
        (MALFORMED["schema_bad_name"][0], "tools[0].function.name"),
        (MALFORMED["tool_without_type"][0], "tools[0].type"),
        (MALFORMED["pattern_not_a_regex"][0], "tools[0].function.parameters.properties.key.pattern"),
        (MALFORMED["keyword_wrong_type"][0], "tools[0].function.parameters.minProperties"),
        (MALFORMED["content_not_string"][0], "messages[1].content"),
        (MALFORMED["unknown_tool"][0], "messages[2].tool_calls[0].function.name"),
        (MALFORMED["missing_tool_message"][0], "messages[3]"),
        (MALFORMED["weight_string"][0], "checklists[0][0][0].weight"),
        (MALFORMED["checklist_turn_missing"][0], "checklists[0]"),
    ]
    for row, field in cases:
        (reject,) = validate_rows([row])[1]
        assert reject.field == field, (reject, field)


def _write_mixed_file(path: Path) -> list[tuple[int, RejectReason]]:
    """A JSONL file of good rows between bad ones of every kind; returns the bad (line, reason) pairs."""
    lines: list[bytes] = [
        json.dumps(make_row("good-0")).encode(),
        b'{"uuid": broken}',
        json.dumps(mutate(lambda r: r.pop("tools"))).encode(),
        json.dumps(make_row("good-1")).encode(),
        json.dumps(make_row("good-2")).encode().replace(b"question 0", b"question \xff"),
        json.dumps(MALFORMED["pattern_not_a_regex"][0] | {"uuid": "bad-schema"}).encode(),
        b"",  # blank lines are not rows
        json.dumps(make_row("good-0")).encode(),
        json.dumps(MALFORMED["mismatched_call_id"][0] | {"uuid": "bad-ids"}).encode(),
        json.dumps(make_row("good-3")).encode(),
        json.dumps(make_row("good-4"))[:300].encode(),
    ]
    path.write_bytes(b"\n".join(lines))
    return [
        (1, R.INVALID_JSON),
        (2, R.MISSING_FIELD),
        (4, R.NON_UTF8),
        (5, R.BAD_TOOL_SCHEMA),
        (7, R.DUPLICATE_UUID),
        (8, R.UNPAIRED_TOOL_CALL),
        (10, R.TRUNCATED_JSON),
    ]


def test_mixed_file_every_row_accepted_or_rejected_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "raw" / "mixed.jsonl"
    path.parent.mkdir()
    expected = _write_mixed_file(path)
    n_rows = sum(1 for line in path.read_bytes().split(b"\n") if line.strip())
    raw, read_rejects = read_cm2_file(path)  # the way prepare_data reads and validates
    accepted, rejects = validate_rows(raw)
    all_rejects = sorted(read_rejects + rejects, key=lambda r: r.index)
    assert len(accepted) + len(all_rejects) == n_rows == 10
    assert [r["uuid"] for r in accepted] == ["good-0", "good-1", "good-3"]
    assert [(r.index, r.reason_code) for r in all_rejects] == expected
    for reject in all_rejects:
        assert reject.source == str(path) and reject.to_json()["source"] == str(path)
        assert str(reject).startswith(f"{path} row {reject.index}")
        assert reject.reason_code.value in str(reject) and reject.message
    (duplicate,) = [r for r in all_rejects if r.reason_code is R.DUPLICATE_UUID]
    assert f"{path} row 0" in duplicate.message  # where the uuid was first accepted
    assert load_cm2(path) == (accepted, all_rejects)


def test_json_list_file_accounting_and_duplicates_across_files(tmp_path: Path) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps([make_row("a"), [1, 2], make_row("b")]))
    second.write_text(json.dumps([make_row("b"), MALFORMED["think_in_user"][0], make_row("c")]))
    raw, read_rejects = [], []
    for path in (first, second):
        rows, bad = read_cm2_file(path)
        raw += rows
        read_rejects += bad
    accepted, rejects = validate_rows(raw)
    assert read_rejects == [] and len(accepted) + len(rejects) == 6
    assert [r["uuid"] for r in accepted] == ["a", "b", "c"]
    assert [(r.source, r.index, r.reason_code) for r in rejects] == [
        (str(first), 1, R.WRONG_TYPE),
        (str(second), 0, R.DUPLICATE_UUID),
        (str(second), 1, R.THINK_TAGS),
    ]
    assert f"{first} row 2" in rejects[1].message


def test_tool_parameters_are_draft_2020_12_schemas() -> None:
    rich = {
        "type": "object",
        "properties": {
            "key": {"type": "string", "enum": ["a", "b"]},
            "when": {"type": ["string", "null"], "format": "date", "pattern": "^[0-9-]+$"},
            "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1},
            "limits": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]},
        },
        "required": ["key"],
        "additionalProperties": False,
        "$defs": {"item": {"type": "object", "properties": {"id": {"type": "integer"}}}},
    }
    assert reason_of(mutate(lambda r: r["tools"][0]["function"].update(parameters=rich))) is None
    assert reason_of(mutate(lambda r: r["tools"][0]["function"].update(parameters={}))) is None
    assert reason_of(mutate(lambda r: r["tools"][0]["function"].pop("parameters"))) is None
    not_schema = mutate(lambda r: _set_property(r, "items", 5))
    (reject,) = validate_rows([not_schema])[1]
    assert (reject.reason_code, reject.field) == (
        R.BAD_TOOL_SCHEMA,
        "tools[0].function.parameters.properties.key.items",
    )
    assert "Draft 2020-12" in reject.message


def test_call_arguments_checked_against_the_schema_only_when_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    fetched: list[object] = []

    def no_network(request: object, *args: object, **kwargs: object) -> None:
        fetched.append(request)
        raise OSError("this test allows no network")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    strict = Cm2ValidationConfig(check_call_arguments=True)
    wrong_type = mutate(lambda r: r["messages"][2]["tool_calls"][0]["function"].update(arguments='{"key": 5}'))
    assert reason_of(wrong_type) is None  # CM2 keeps deliberately wrong calls by default
    (reject,) = validate_rows([wrong_type], strict)[1]
    assert (reject.reason_code, reject.field) == (
        R.ARGUMENTS_VIOLATE_SCHEMA,
        "messages[2].tool_calls[0].function.arguments.key",
    )
    assert "5 is not of type 'string'" in reject.message
    missing = mutate(lambda r: r["messages"][6]["tool_calls"][0]["function"].update(arguments={}))
    (reject,) = validate_rows([missing], strict)[1]
    assert (reject.field, reject.reason_code) == (
        "messages[6].tool_calls[0].function.arguments",
        R.ARGUMENTS_VIOLATE_SCHEMA,
    )
    assert reason_of(make_row(), strict) is None
    remote_ref = mutate(lambda r: _set_property(r, "$ref", "https://example.invalid/schema.json"))
    assert reason_of(remote_ref) is None  # never resolved unless arguments are checked
    (reject,) = validate_rows([remote_ref], strict)[1]  # never fetched: a reject, not a crash
    assert (reject.reason_code, reject.field) == (R.BAD_TOOL_SCHEMA, "tools[0].function.parameters")
    assert fetched == []


def test_config_errors_name_the_setting() -> None:
    with pytest.raises(ValueError, match="tool_name_pattern='\\(' is not a regular expression"):
        Cm2ValidationConfig(tool_name_pattern="(")


# ---- splits, episode specs, rehearsal examples ---------------------------------------------------------


def test_split_is_deterministic_crc32() -> None:
    uuids = [f"u{k}" for k in range(2000)]
    first = [split_of(u, 0.2, seed=3) for u in uuids]
    assert first == [split_of(u, 0.2, seed=3) for u in uuids]
    assert first[0] == ("val" if zlib.crc32(b"3:u0") / 2**32 < 0.2 else "train")
    assert 0.15 < first.count("val") / len(uuids) < 0.25
    train, val = split_rows([{"uuid": u} for u in uuids], 0.2, seed=3)
    assert len(train) + len(val) == 2000 and {r["uuid"] for r in val}.isdisjoint(r["uuid"] for r in train)
    assert split_of("x", 0.0) == "train" and split_of("x", 1.0) == "val"
    with pytest.raises(ValueError):
        split_of("x", 1.5)


def test_episode_spec_of_synthetic_row() -> None:
    spec = cm2_row_to_episode_spec(make_row(n_turns=3))
    assert spec.system_prompt == "You are helpful."
    assert spec.user_turns == ("question 0", "question 1", "question 2")
    assert [[(e.turn, e.call.arguments["key"], e.response) for e in t] for t in spec.exchanges] == [
        [(0, "k0", {"value": 0})],
        [(1, "k1", {"value": 1})],
        [(2, "k2", {"value": 2})],
    ]
    assert spec.reference_replies == ("The value is 0.", "The value is 1.", "The value is 2.")
    with pytest.raises(ValueError, match="bad_arguments_json"):
        cm2_row_to_episode_spec(MALFORMED["arguments_not_json"][0])
    with pytest.raises(ValueError, match="variant 1"):
        cm2_row_to_episode_spec(make_row(), variant=1)


# ---- fuzzing --------------------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@FUZZ
@given(st.binary(max_size=400))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    rows, rejects = read_cm2_bytes(data)
    accepted, rejected = validate_rows(rows)
    assert len(accepted) + len(rejected) == len(rows)
    assert all(isinstance(r.reason_code, RejectReason) for r in rejects + rejected)


@FUZZ
@given(st.lists(JSON_VALUES, max_size=5))
def test_arbitrary_json_rows_are_accepted_or_rejected(rows: list) -> None:
    accepted, rejects = validate_rows(rows)
    assert len(accepted) + len(rejects) == len(rows)
    assert sorted(r.index for r in rejects) == sorted(set(r.index for r in rejects))


PATHS = [
    ("messages",),
    ("tools",),
    ("checklists",),
    ("uuid",),
    ("messages", 1),
    ("messages", 2, "tool_calls", 0),
    ("messages", 2, "tool_calls", 0, "function", "arguments"),
    ("messages", 3, "content"),
    ("tools", 0, "function"),
    ("checklists", 0, 0),
    ("checklists", 0, 0, 0, "weight"),
    ("checklists", 0, 1, 1),
]


@FUZZ
@given(path=st.sampled_from(PATHS), value=JSON_VALUES, delete=st.booleans())
def test_mutated_valid_rows_never_crash(path: tuple, value: object, delete: bool) -> None:
    row = make_row()
    parent = row
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    accepted, rejects = validate_rows([row])
    assert len(accepted) + len(rejects) == 1
    if accepted:
        cm2_row_to_episode_spec(accepted[0])  # what validation accepts, the spec builder handles


@FUZZ
@given(st.integers(0, 10_000), st.sampled_from([0, 2]))
def test_any_truncation_of_a_list_never_crashes(cut: int, indent: int) -> None:
    data = json.dumps([make_row("a"), make_row("b")], indent=indent or None).encode()
    rows, rejects = read_cm2_bytes(data[: cut % (len(data) + 1)])
    assert [r.value for r in rows] == [make_row("a"), make_row("b")][: len(rows)]
    assert len(rows) + len(rejects) <= 2
    assert all(r.reason_code in (R.TRUNCATED_JSON, R.INVALID_JSON) for r in rejects)


def test_engine_spec_of_cm2_row_keeps_recorded_responses_per_step() -> None:
    spec = cm2_row_to_episode_spec(make_row(n_turns=2))
    engine_spec = spec.to_engine_spec()
    assert engine_spec.task_id == "row-0" and engine_spec.source == "cm2"
    assert engine_spec.user_turns == spec.user_turns and len(engine_spec.checklists) == 2
    assert [len(steps) for steps in engine_spec.gold] == [1, 1]
    assert engine_spec.gold[0][0].responses == ({"value": 0},)
