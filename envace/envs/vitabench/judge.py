"""VitaBench rubric judging over an OpenAI-compatible endpoint, with strict JSON verdicts.

The reference (``vita/evaluator/evaluator_traj.py``, evaluation type ``trajectory``) grades a finished
conversation against the task's rubrics with an LLM: every rubric starts unmet; the transcript is cut into
windows of 10 messages overlapping by 2; for each window in order, the judge sees the environment time,
the user's full instruction, the window and the current rubric states, and returns updated states (a rubric
may become met when the *assistant* achieved it in this window, or unmet again when the assistant undid
it). Reward = 1 when every rubric ends met (and there is at least one), else 0; the rubric score is the
share met. Our prompts are our own texts with the same rules.

Modes (``RubricJudgeConfig.mode``):

* ``sliding_window`` (reference) — the judge must answer one JSON array of
  ``{"rubric_idx": "rubric_<k>", "justification": str, "meetExpectation": bool}`` objects (one leading
  ``<think>`` block or one enclosing code fence is tolerated; unknown ids, non-bool states, prose around the
  JSON are malformed). Rubrics it leaves out keep their state.
* ``per_rubric`` — one request per rubric on the whole transcript, answered with the judge infrastructure's
  strict ``{"analysis": str, "answer": bool}`` verdict (``envace.judges.llm.parse_verdict``); requests run
  concurrently, at most ``concurrency`` at a time.

One retry policy (``envace.inference.openai_client.RetryPolicy``: ``max_retries``, exponential backoff with
jitter, a cap): transport errors are retried by the HTTP client, malformed answers are asked again here with
a new seed; when either runs out, ``JudgeFailed`` is raised — the caller records the task as *not judged*,
never as a zero reward (docs/method.md §5).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from envace.core.seeds import derive_seed
from envace.inference.base import ChatBackend, ChatRequest
from envace.inference.openai_client import RetryPolicy
from envace.judges.llm import MalformedVerdictError, parse_verdict

logger = logging.getLogger(__name__)
T = TypeVar("T")
JUDGE_MODES = ("sliding_window", "per_rubric")
_FENCE = re.compile(r"^```(?:json)?\s*\n?(?P<body>.*?)\n?```$", re.DOTALL | re.IGNORECASE)
_THINK = re.compile(r"^<think>.*?</think>\s*", re.DOTALL)

RULES = (
    "Rules:\n"
    "- Judge what the assistant did: its replies to the user and the tool calls it requested. The user's words only "
    "guide the assistant; they do not change the rubric.\n"
    "- Tool results are seen by the assistant only. Information counts once the assistant tells the user; an "
    "assistant that invents tool results fails.\n"
    "- A rubric about an order, booking or reservation needs the operation to have actually succeeded through a tool "
    "call (a failed call, or the user saying they will do it themselves, does not count).\n"
    "- Quantities and times in order rubrics must match exactly (no fewer items, no later delivery), even if the "
    "user says a compromise is fine.\n"
    "- Addresses and order notes pass when they serve the same purpose (locate the place, convey the need) even if "
    "worded differently.\n"
    "- If the user changes their mind (e.g. cancels after ordering), do not revoke a rubric that was met for the "
    "earlier request."
)

WINDOW_SYSTEM = (
    "You grade a conversation between a user and a tool-using assistant against rubrics (scoring points of the "
    "user's goal).\n"
    "# System information\n"
    "{env_info}\n"
    "# The user's full instruction\n"
    "{instruction}\n"
    "# Procedure\n"
    "The conversation is long, so you see it in windows of messages; rubric states carry over between windows. This "
    "is window {window} of {total}. Every rubric started as false. Set a rubric to true only if the assistant "
    "achieved it in this window; set a true rubric back to false only if the assistant reversed it in this window; "
    "otherwise keep its state and restate the reason. Append short evidence with message numbers [k] to each "
    "justification.\n"
    "{rules}\n"
    "# Output\n"
    'Exactly one JSON array, one object per rubric you assess: {{"rubric_idx": "rubric_<k>", "justification": '
    '"<text>", "meetExpectation": true or false}}. No other text.'
)

RUBRIC_SYSTEM = (
    "You grade a conversation between a user and a tool-using assistant against one rubric.\n"
    "# System information\n"
    "{env_info}\n"
    "# The user's full instruction\n"
    "{instruction}\n"
    "{rules}\n"
    'Reply with exactly one JSON object and nothing else: {{"analysis": "<brief reasoning>", "answer": true or false}} '
    "(true when the rubric is met)."
)


class JudgeFailed(RuntimeError):
    """The judge gave no usable verdict within its retries."""


class MalformedJudgement(ValueError):
    """A judge answer that is not the strict JSON the prompt asks for."""


@dataclass(frozen=True)
class RubricJudgeConfig:
    mode: str = "sliding_window"
    window_size: int = 10
    overlap: int = 2
    max_retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    concurrency: int = 4
    temperature: float = 0.0
    max_new_tokens: int = 2048
    max_message_chars: int = 4000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in JUDGE_MODES:
            raise ValueError(f"RubricJudgeConfig.mode={self.mode!r}; valid: {list(JUDGE_MODES)}")
        if not 0 <= self.overlap < self.window_size:
            raise ValueError("RubricJudgeConfig: need 0 <= overlap < window_size")
        if self.concurrency < 1 or self.max_retries < 0:
            raise ValueError("RubricJudgeConfig: need concurrency >= 1 and max_retries >= 0")


@dataclass(frozen=True)
class RubricState:
    rubric: str
    met: bool = False
    justification: str = "Not evaluated yet"

    def to_json(self) -> dict[str, Any]:
        return {"rubric": self.rubric, "met": self.met, "justification": self.justification}


@dataclass(frozen=True)
class RubricJudgement:
    states: tuple[RubricState, ...]
    requests: int
    windows: int = 0

    @property
    def reward(self) -> float:
        return 1.0 if self.states and all(s.met for s in self.states) else 0.0

    @property
    def rubric_score(self) -> float:
        return sum(s.met for s in self.states) / len(self.states) if self.states else 0.0


# ---- transcript rendering -----------------------------------------------------------------------------
def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]} …[{len(text) - limit} chars]… {text[-limit // 2 :]}"


def render_transcript(messages: Sequence[Mapping[str, Any]], start: int = 0, limit: int = 4000) -> str:
    """``[k] role: text`` lines; assistant tool calls as ``name(key=value, …)``; empty messages skipped."""
    lines = []
    for offset, message in enumerate(messages):
        text = str(message.get("content") or "")
        calls = []
        for call in message.get("tool_calls") or []:
            fn = call.get("function", call)
            args = fn.get("arguments", {})
            args = json.loads(args) if isinstance(args, str) and args.strip().startswith("{") else args
            shown = ", ".join(f"{k}={v!r}" for k, v in args.items()) if isinstance(args, dict) else str(args)
            calls.append(f"{fn.get('name')}({shown})")
        full = " ".join(p for p in (text, ".".join(calls)) if p)
        if full:
            lines.append(f"[{start + offset + 1}] {message.get('role', '?')}: {_clip(full, limit)}")
    return "\n".join(lines)


def sliding_windows(n: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """(start, end) message ranges: windows of ``size`` moving by ``size - overlap``; one window if short."""
    if n <= size:
        return [(0, n)]
    out, step, i = [], size - overlap, 0
    while True:
        out.append((i, min(i + size, n)))
        if i + size >= n:
            return out
        i += step


# ---- strict parsing ------------------------------------------------------------------------------------
def _strip_wrappers(text: str) -> str:
    body = _THINK.sub("", text.strip(), count=1).strip()
    fenced = _FENCE.match(body)
    return fenced.group("body").strip() if fenced else body


def parse_window_states(text: str, known: Sequence[str]) -> dict[str, tuple[bool, str]]:
    """``{rubric_idx: (met, justification)}`` from a window answer; ``MalformedJudgement`` otherwise."""
    try:
        data = json.loads(_strip_wrappers(text))
    except (ValueError, RecursionError) as exc:
        raise MalformedJudgement(f"judge answer is not JSON: {exc}") from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise MalformedJudgement(f"judge answer is a JSON {type(data).__name__}, expected an array")
    out = {}
    for k, item in enumerate(data):
        if not isinstance(item, dict):
            raise MalformedJudgement(f"item {k} is not an object")
        idx, met = item.get("rubric_idx"), item.get("meetExpectation")
        if idx not in known:
            raise MalformedJudgement(f"item {k}: rubric_idx {idx!r} is not one of {list(known)}")
        if not isinstance(met, bool):
            raise MalformedJudgement(f"item {k}: meetExpectation must be true or false, got {met!r}")
        out[idx] = (met, str(item.get("justification") or ""))
    return out


# ---- the judge -------------------------------------------------------------------------------------------
class RubricJudge:
    """Grades a VitaBench transcript against its rubrics (see the module docstring)."""

    def __init__(self, backend: ChatBackend, config: RubricJudgeConfig = RubricJudgeConfig()) -> None:
        self.backend = backend
        self.config = config

    def _request(self, system: str, user: str, seed: int) -> ChatRequest:
        return ChatRequest(
            messages=({"role": "system", "content": system}, {"role": "user", "content": user}),
            temperature=self.config.temperature,
            max_new_tokens=self.config.max_new_tokens,
            seed=seed,
        )

    def _ask(self, build: Callable[[int], ChatRequest], parse: Callable[[str], T], what: str) -> tuple[T, int]:
        """(parsed answer, requests sent), malformed answers asked again; ``JudgeFailed`` when it runs out."""
        cfg, sent = self.config, 0
        policy = RetryPolicy(cfg.max_retries, cfg.backoff_s, cfg.max_backoff_s)
        try:
            for attempt in policy.retrying(
                lambda e: isinstance(e, (MalformedJudgement, MalformedVerdictError)), f"VitaBench judge ({what})"
            ):
                with attempt:
                    try:
                        text = self.backend.generate([build(attempt.retry_state.attempt_number - 1)])[0].text
                    finally:
                        sent += max(1, int(getattr(self.backend, "last_attempts", 1) or 1))
                    answer = parse(text)
        except Exception as exc:  # noqa: BLE001 - reported as JudgeFailed, with the cause
            logger.warning("VitaBench judge (%s): no usable verdict after %d request(s): %s", what, sent, exc)
            raise JudgeFailed(
                f"judge gave no usable verdict for {what} after {sent} request(s): {type(exc).__name__}: {exc}"
            ) from exc
        return answer, sent

    def judge(
        self,
        task_id: str,
        env_info: str,
        instruction: str,
        rubrics: Sequence[str],
        transcript: Sequence[Mapping[str, Any]],
    ) -> RubricJudgement:
        if not rubrics:
            return RubricJudgement((), 0)
        if self.config.mode == "per_rubric":
            return self._per_rubric(task_id, env_info, instruction, rubrics, transcript)
        return self._sliding(task_id, env_info, instruction, rubrics, transcript)

    def _sliding(
        self,
        task_id: str,
        env_info: str,
        instruction: str,
        rubrics: Sequence[str],
        transcript: Sequence[Mapping[str, Any]],
    ) -> RubricJudgement:
        cfg = self.config
        keys = [f"rubric_{k}" for k in range(len(rubrics))]
        states = {key: RubricState(r) for key, r in zip(keys, rubrics)}
        windows = sliding_windows(len(transcript), cfg.window_size, cfg.overlap)
        sent = 0
        for w, (lo, hi) in enumerate(windows):
            system = WINDOW_SYSTEM.format(
                env_info=env_info, instruction=instruction, window=w + 1, total=len(windows), rules=RULES
            )
            current = [
                {"rubric_idx": k, "rubric": s.rubric, "justification": s.justification, "meetExpectation": s.met}
                for k, s in states.items()
            ]
            user = (
                f"<window_content>\n{render_transcript(transcript[lo:hi], lo, cfg.max_message_chars)}\n"
                f"</window_content>\n<current_rubrics>\n{json.dumps(current, ensure_ascii=False, indent=1)}\n"
                "</current_rubrics>"
            )
            update, n = self._ask(
                lambda a, s=system, u=user, w=w: self._request(s, u, derive_seed(cfg.seed, task_id, "judge", w, a)),
                lambda text: parse_window_states(text, keys),
                f"task {task_id} window {w + 1}",
            )
            sent += n
            for key, (met, why) in update.items():
                states[key] = RubricState(states[key].rubric, met, why)
        return RubricJudgement(tuple(states.values()), sent, len(windows))

    def _per_rubric(
        self,
        task_id: str,
        env_info: str,
        instruction: str,
        rubrics: Sequence[str],
        transcript: Sequence[Mapping[str, Any]],
    ) -> RubricJudgement:
        cfg = self.config
        system = RUBRIC_SYSTEM.format(env_info=env_info, instruction=instruction, rules=RULES)
        text = render_transcript(transcript, 0, cfg.max_message_chars)

        def one(k: int) -> tuple[tuple[bool, str], int]:
            user = f"<conversation>\n{text}\n</conversation>\n<rubric>\n{rubrics[k]}\n</rubric>"
            return self._ask(
                lambda a: self._request(system, user, derive_seed(cfg.seed, task_id, "rubric", k, a)),
                _strict_verdict,
                f"task {task_id} rubric {k}",
            )

        with ThreadPoolExecutor(max_workers=min(cfg.concurrency, len(rubrics))) as pool:
            results = list(pool.map(one, range(len(rubrics))))
        states = tuple(RubricState(r, met, why) for r, ((met, why), _) in zip(rubrics, results))
        return RubricJudgement(states, sum(n for _, n in results), 1)


def _strict_verdict(text: str) -> tuple[bool, str]:
    try:
        return parse_verdict(text)
    except MalformedVerdictError as exc:
        raise MalformedJudgement(str(exc)) from None
