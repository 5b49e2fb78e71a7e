"""Tool responses for FinMCP-Bench episodes: replayed from the sample's record, never from a live server.

FinMCP-Bench's tools are live MCP servers; the samples keep the responses recorded when the ground-truth
conversation was made. ``ReplayResponder`` answers a policy's call with the recorded response of a call
with the same tool name and the same arguments (canonical JSON: sorted keys, integral floats as ints).
Several records with one key are served in recorded order, preferring records of the current user turn;
once all are served, the first is served again (a repeated read returns the same data).

A call that matches no record (``UnrecordedMode``):

* ``error`` (default) — a structured ``{"error": {"code": "NOT_RECORDED", …}}`` response, as a server
  would answer a request it cannot serve; the agent may recover;
* ``rehearse`` — the REHEARSE role (``envace.core.prompts`` role prompts) imagines the response: the
  policy itself (seat ``ACTOR``) or a configured ``fallback_backend``; few-shot examples are the recorded
  pairs of *earlier* user turns and the responses served so far in this episode — never unserved records
  of the current turn (docs/method.md §2: no future ground truth);
* ``simulate`` — a configured simulator backend (e.g. an OpenAI-compatible endpoint) with a plain
  "you are the tool server" prompt; a bare JSON answer is accepted as well as the REHEARSE wire format.

A call to a tool that is not in the task's tool list always gets ``UNKNOWN_TOOL`` (inside the ACT loop
such a call never gets here: the loop answers it by ``envace.core.unknown_tool``). A fallback answer that
does not parse becomes ``{"error": {"code": "SIMULATION_FAILED", …}}`` (the episode goes on). Every answer's
origin is counted in ``stats`` and the fallback calls are listed in ``fallback_calls``. Every response that
is not a recorded one (unknown tool, not recorded, fallback) is marked in ``ResponseBatch.stand_ins``, hence
in ``Turn.stand_ins``, so that fidelity studies skip it: it was made up here, not served by the server.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from envace.core.prompts import DEFAULT_ROLE_PROMPTS, RolePrompts, compact_json, tool_function
from envace.core.records import ToolCall
from envace.core.rehearse_context import Answered, Event, rehearse_context
from envace.core.seeds import derive_seed
from envace.core.wire import as_result_object, parse_rehearsal
from envace.envs.finmcp.data import RecordedCall
from envace.evaluation.episode import ResponseBatch
from envace.evaluation.programs import ACTOR, GenerationCall, GenerationLedger, GenerationReply, Program, generate_one
from envace.inference.base import ChatBackend, ChatOutput, ChatRequest

SIMULATOR_SYSTEM_PROMPT = (
    "You stand in for a financial data MCP server. For each tool call you receive, reply with the JSON "
    "response that server would return for exactly these arguments, consistent with the tool's schema and "
    "with the earlier responses of this session; return an error object for an invalid call. Reply with "
    "the JSON only, inside <execution_result></execution_result>.\nTools:\n{tools}\n{examples}"
)


class UnrecordedMode(str, enum.Enum):
    ERROR = "error"
    REHEARSE = "rehearse"
    SIMULATE = "simulate"


@dataclass(frozen=True)
class ReplayConfig:
    unrecorded: UnrecordedMode = UnrecordedMode.ERROR
    max_new_tokens: int = 512
    temperature: float = 0.0
    seed: int = 0
    role_prompts: RolePrompts = DEFAULT_ROLE_PROMPTS


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def call_key(name: str, arguments: Mapping[str, Any]) -> str:
    """Matching key of a call: tool name + canonical JSON of its arguments."""
    return (
        name + "|" + json.dumps(_canonical(dict(arguments)), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    )


def error_response(code: str, message: str, tool: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "tool": tool}}


def _parse_simulated(text: str, lenient: bool) -> Any | None:
    parsed = parse_rehearsal(text)
    if parsed.ok:
        return parsed.result
    if lenient:
        try:
            return as_result_object(json.loads(text.strip()))
        except ValueError:
            return None
    return None


class RecordIndex:
    """Recorded (call, response) pairs keyed by ``call_key``; serves each record once, then repeats."""

    def __init__(self, recorded: Sequence[RecordedCall]) -> None:
        self.records = [r for r in recorded if r.has_response]
        self._served = [False] * len(self.records)
        self._by_key: dict[str, list[int]] = {}
        for i, r in enumerate(self.records):
            self._by_key.setdefault(call_key(r.call.name, r.call.arguments), []).append(i)

    def lookup(self, call: ToolCall, turn: int | None = None) -> tuple[str, Any]:
        """("replayed" | "repeated" | "missing", response); records of ``turn`` are preferred."""
        matches = self._by_key.get(call_key(call.name, call.arguments), [])
        if not matches:
            return "missing", None
        fresh = sorted((i for i in matches if not self._served[i]), key=lambda i: (self.records[i].turn != turn, i))
        if fresh:
            self._served[fresh[0]] = True
            return "replayed", self.records[fresh[0]].response
        return "repeated", self.records[matches[0]].response


class ReplayExecutor:
    """``core.env.Executor`` over the record (no fallback): the "real environment" of fidelity studies."""

    def __init__(self, recorded: Sequence[RecordedCall]) -> None:
        self._index = RecordIndex(recorded)
        self.calls = 0

    def lookup(self, call: ToolCall, turn: int | None = None) -> tuple[str, Any]:
        """("replayed" | "repeated" | "missing", response) of one call; records of ``turn`` preferred."""
        self.calls += 1
        return self._index.lookup(call, turn)

    def execute(self, call: ToolCall) -> Any:
        status, response = self.lookup(call)
        if status == "missing":
            return error_response("NOT_RECORDED", "no recorded response for this tool with these arguments", call.name)
        return response

    def state(self) -> dict[str, Any]:
        return {"calls": self.calls}


class ReplayResponder:
    """Answers calls from the record (see the module docstring); holds no live tool server."""

    rehearsed = False

    def __init__(
        self,
        task_id: str,
        recorded: Sequence[RecordedCall],
        tools: Sequence[Mapping[str, Any]],
        config: ReplayConfig,
        ledger: GenerationLedger,
        fallback_backend: ChatBackend | None = None,
        executor: Any | None = None,
    ) -> None:
        if config.unrecorded is UnrecordedMode.SIMULATE and fallback_backend is None:
            raise ValueError("ReplayResponder: unrecorded='simulate' needs a simulator backend (simulator=...)")
        self._task_id = task_id
        self._index = RecordIndex(recorded)
        # recorded responses are served by the (possibly wrapped) real executor: a recording wrapper sees
        # every lookup of the committed episode
        self._executor = executor if executor is not None else ReplayExecutor(recorded)
        self._tools = {tool_function(t).get("name"): t for t in tools}
        self._config = config
        self._ledger = ledger
        self._backend = fallback_backend
        self._history: list[tuple[ToolCall, Any]] = []  # (call, response) served in this episode
        self.stats = {
            "replayed": 0,
            "repeated": 0,
            "unrecorded": 0,
            "unknown_tool": 0,
            "fallback_ok": 0,
            "fallback_failed": 0,
        }
        self.fallback_calls: list[dict[str, Any]] = []

    def _examples(self, turn: int) -> list[tuple[ToolCall, Any]]:
        earlier = [(r.call, r.response) for r in self._index.records if r.turn < turn]
        return [(c, as_result_object(r)) for c, r in earlier + self._history]

    # ---- fallbacks ----
    def _fallback_request(self, call: ToolCall, turn: int, user_text: str, history: Sequence[Event]) -> ChatRequest:
        cfg = self._config
        if cfg.unrecorded is UnrecordedMode.REHEARSE:  # the REHEARSE layout, over the conversation so far
            messages = rehearse_context(cfg.role_prompts, list(self._tools.values()), history, call)
        else:
            examples = self._examples(turn)
            tools = "\n".join(compact_json(dict(tool_function(t))) for t in self._tools.values())
            shown = "".join(f"Call {c.name} {compact_json(c.arguments)} -> {compact_json(r)}\n" for c, r in examples)
            system = SIMULATOR_SYSTEM_PROMPT.format(tools=tools, examples=("Earlier calls:\n" + shown) if shown else "")
            messages = [
                {"role": "system", "content": system},
                {
                    "role": "user",
                    "content": f"User request: {user_text}\nCall {call.name} {compact_json(call.arguments)}",
                },
            ]
        seed = derive_seed(cfg.seed, self._task_id, "unrecorded", turn, len(self.fallback_calls))
        return ChatRequest(
            messages=tuple(messages),
            tools=None,
            temperature=cfg.temperature,
            max_new_tokens=cfg.max_new_tokens,
            seed=seed,
        )

    def _generate_direct(self, request: ChatRequest) -> Program[ChatOutput | None]:
        call = GenerationCall("fallback", f"unrecorded_{self._config.unrecorded.value}", request)
        start = time.perf_counter()
        try:
            output, error = self._backend.generate([request])[0], None  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - a failing simulator is a failed answer, not a crash
            output, error = None, exc
        self._ledger.add(call, GenerationReply(output, error, time.perf_counter() - start))
        return output
        yield []  # pragma: no cover - makes this method a generator

    def _fallback(self, call: ToolCall, turn: int, user_text: str, history: Sequence[Event]) -> Program[Any]:
        request = self._fallback_request(call, turn, user_text, history)
        if self._backend is None:  # REHEARSE role played by the policy itself
            output = yield from generate_one(GenerationCall(ACTOR, "rehearse_unrecorded", request), self._ledger)
        else:
            output = yield from self._generate_direct(request)
        result = (
            None
            if output is None
            else _parse_simulated(output.text, lenient=self._config.unrecorded is UnrecordedMode.SIMULATE)
        )
        ok = result is not None
        self.stats["fallback_ok" if ok else "fallback_failed"] += 1
        self.fallback_calls.append({"turn": turn, "name": call.name, "arguments": call.arguments, "ok": ok})
        if ok:
            return result
        return error_response("SIMULATION_FAILED", "the tool simulator gave no usable response", call.name)

    def _lookup(self, call: ToolCall, turn: int) -> tuple[str, Any]:
        """The executor's lookup; a wrapper offering only ``execute`` gets "missing" for NOT_RECORDED."""
        if hasattr(self._executor, "lookup"):
            return self._executor.lookup(call, turn)
        value = self._executor.execute(call)
        missing = (
            isinstance(value, dict)
            and isinstance(value.get("error"), dict)
            and value["error"].get("code") == "NOT_RECORDED"
        )
        return ("missing", None) if missing else ("replayed", value)

    def respond(
        self, calls: tuple[ToolCall, ...], user_turn: int, user_text: str, history: tuple[Event, ...] = ()
    ) -> Program[ResponseBatch]:
        responses, stand_ins = [], []
        events = list(history)
        for index, call in enumerate(calls):
            status = "unknown_tool"
            if call.name not in self._tools:
                self.stats["unknown_tool"] += 1
                response = error_response("UNKNOWN_TOOL", f"tool {call.name!r} is not offered in this task", call.name)
            else:
                status, response = self._lookup(call, user_turn)
                if status != "missing":
                    self.stats[status] += 1
                elif self._config.unrecorded is UnrecordedMode.ERROR:
                    self.stats["unrecorded"] += 1
                    response = error_response(
                        "NOT_RECORDED",
                        "no recorded response for this tool with these arguments; the benchmark "
                        "replays recorded MCP responses only",
                        call.name,
                    )
                else:
                    self.stats["unrecorded"] += 1
                    response = yield from self._fallback(call, user_turn, user_text, events)
            if status not in ("replayed", "repeated"):  # made up here, not a recorded server response
                stand_ins.append(index)
            self._history.append((call, response))
            events.append(Answered(call, response))
            responses.append(response)
        return ResponseBatch(tuple(responses), stand_ins=tuple(stand_ins))
