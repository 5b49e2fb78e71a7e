"""LLM checklist judge: one chat request per (assistant step, checklist item), strict JSON verdicts.

The judge model sees the item (question, focus, pass condition, failure examples, reference snippets),
the earlier turns, and the current turn up to and including the step being graded with its tool
responses - the CM2 judging setup, with our own prompt. It must answer exactly one JSON object
``{"analysis": str, "answer": bool}`` (a leading ``<think>`` block or one enclosing code fence is
tolerated; anything else - prose around the object, ``"answer": "true"``, a missing key - is malformed).

Robustness, with one retry policy (``envace.inference.openai_client.RetryPolicy``: ``max_retries``,
exponential backoff with jitter, a cap) applied where each fault is seen:

* transport faults (timeouts, refused connections, 5xx/429, bodies that are not a chat completion) are
  retried inside the HTTP client; the judge does not retry them again, and non-retryable answers
  (HTTP 401, 404 ...) stop at once;
* a verdict that is not the strict JSON asked for is asked again with a different seed (a deterministic
  server can then answer differently), under the same policy.

An item that still has no verdict gets ``Verdict.ERROR``; ``score_checklist`` turns that into JUDGE_FAILED
(excluded and counted), never 0. Every item call is counted by a ``FailureBudget`` (``max_failure_rate``
over the last ``failure_window`` calls): past it the judge raises ``JudgeFailureBudgetExceeded`` and the
run stops instead of training on exclusions. At most ``concurrency`` requests are in flight.
``JudgeReport.n_requests`` counts HTTP attempts (the client's ``last_attempts``) when the backend reports
them, else one per backend call.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from envace.core.checklist import Checklist, ChecklistItem
from envace.core.checklist_reward import ItemVerdict, Verdict
from envace.core.conversation import ConversationStep, split_thinking
from envace.inference.base import ChatBackend, ChatRequest
from envace.inference.openai_client import OpenAIChatBackend, RetryPolicy
from envace.judges.base import (
    JudgeCounters,
    JudgeReport,
    Messages,
    assemble_report,
    forced_verdict,
    register_judge,
    steps_to_judge,
)
from envace.judges.budget import FailureBudget

logger = logging.getLogger(__name__)

_FENCE = re.compile(r"^```(?:json)?\s*\n?(?P<body>.*?)\n?```$", re.DOTALL | re.IGNORECASE)
_LEADING_THINK = re.compile(r"^<think>.*?</think>\s*", re.DOTALL)

JUDGE_SYSTEM_PROMPT = (
    "You grade one step of a tool-using assistant against a single checklist item. "
    'Reply with exactly one JSON object and nothing else: {"analysis": "<brief reasoning>", '
    '"answer": true or false}.'
)


class MalformedVerdictError(ValueError):
    """The judge model's text is not a strict ``{"analysis": str, "answer": bool}`` object."""


@dataclass(frozen=True)
class LLMJudgeConfig:
    max_retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    concurrency: int = 8
    temperature: float = 0.0
    max_new_tokens: int = 1024
    max_message_chars: int = 4000  # longer message contents are shortened in the middle
    max_failure_rate: float = 0.2  # more failed calls than this share of the window stops the run
    failure_window: int = 20  # judge calls (items) in the sliding window


def parse_verdict(text: str) -> tuple[bool, str]:
    """(answer, analysis) from the judge's text; ``MalformedVerdictError`` when it is not strict JSON."""
    body = _LEADING_THINK.sub("", text.strip(), count=1).strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group("body").strip()
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise MalformedVerdictError(f"verdict is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise MalformedVerdictError(f"verdict is a JSON {type(obj).__name__}, expected an object")
    if not isinstance(obj.get("answer"), bool):
        raise MalformedVerdictError(f"verdict 'answer' must be true or false, got {obj.get('answer')!r}")
    if not isinstance(obj.get("analysis"), str):
        raise MalformedVerdictError("verdict 'analysis' must be a string")
    return obj["answer"], obj["analysis"]


def _shorten(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = max(limit // 2, 1)
    return f"{text[:half]}\n…[{len(text) - 2 * half} characters omitted]…\n{text[-half:]}"


def render_message(msg: Mapping[str, Any], limit: int) -> str:
    """One message as labelled plain text; assistant messages split into thinking / reply / calls."""
    role = str(msg.get("role", "?"))
    content = msg.get("content")
    content = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    if role != "assistant":
        return f"[{role}]\n{_shorten(content, limit)}"
    thinking, reply = split_thinking(content)
    calls = json.dumps(msg.get("tool_calls") or [], ensure_ascii=False)
    return (
        f"[assistant]\nthinking: {_shorten(thinking, limit)}"
        f"\nuser_visible_reply: {_shorten(reply, limit) or '(none)'}"
        f"\ntool_calls: {_shorten(calls, limit)}"
    )


def _turn_start(messages: Messages, turn: int) -> int:
    seen = -1
    for i, msg in enumerate(messages):
        if msg.get("role") == "user":
            seen += 1
            if seen == turn:
                return i
    raise ValueError(f"the conversation has no user turn {turn}")


def build_judge_request(
    item: ChecklistItem, messages: Messages, step: ConversationStep, config: LLMJudgeConfig, seed: int = 0
) -> ChatRequest:
    """The chat request that asks the judge model about ``item`` at ``step``."""
    start = _turn_start(messages, step.turn)
    end = step.message_index + 1 + len(step.tool_messages)
    earlier = "\n\n".join(render_message(m, config.max_message_chars) for m in messages[:start]) or "(none)"
    current = "\n\n".join(render_message(m, config.max_message_chars) for m in messages[start:end])
    failures = "\n".join(f"- {f}" for f in item.failure_examples) or "- (none given)"
    snippets = "\n".join(f"- {e.snippet}" for e in item.evidence) or "- (none given)"
    prompt = (
        f"## Checklist item\nQuestion: {item.question}\nFocus on: {item.focus_on}\n"
        f"Pass condition: {item.pass_condition}\nFailure examples (any of them means false):\n{failures}\n"
        "Reference snippets from an annotated conversation (illustrations, not requirements):\n"
        f"{snippets}\n\n"
        f"## Earlier turns\n{earlier}\n\n## Current turn, up to the step being graded\n{current}\n\n"
        "## How to decide\n"
        "- Answer true only if the focused part is present in the current turn, the pass condition holds "
        "fully, and no failure example applies.\n"
        "- Tool calls written inside thinking text instead of tool_calls are not valid calls.\n"
        "- Judge only what the messages show.\n\n"
        '## Output\nOne JSON object: {"analysis": "<brief reasoning>", "answer": true or false}'
    )
    return ChatRequest(
        messages=({"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": prompt}),
        temperature=config.temperature,
        max_new_tokens=config.max_new_tokens,
        seed=seed,
    )


class LLMJudge:
    """Checklist judge backed by any ``ChatBackend`` (usually ``OpenAIChatBackend``)."""

    name = "llm"

    def __init__(self, backend: ChatBackend, config: LLMJudgeConfig = LLMJudgeConfig()) -> None:
        if config.concurrency < 1:
            raise ValueError("LLMJudgeConfig: need concurrency >= 1")
        self.backend = backend
        self.config = config
        self.policy = RetryPolicy(config.max_retries, config.backoff_s, config.max_backoff_s)
        self.budget = FailureBudget(
            config.max_failure_rate, config.failure_window, where=str(getattr(backend, "base_url", "") or backend.name)
        )

    def _sent(self) -> int:
        """HTTP attempts behind the backend call just made on this thread (1 for backends that do not say)."""
        return max(1, int(getattr(self.backend, "last_attempts", 1) or 1))

    def _ask(self, item: ChecklistItem, messages: Messages, step: ConversationStep) -> tuple[ItemVerdict, int]:
        """(verdict, number of requests sent) for one item at one step; malformed verdicts are asked again."""
        self.budget.check()
        sent = 0
        try:
            for attempt in self.policy.retrying(
                lambda e: isinstance(e, MalformedVerdictError), f"judge item {item.id}"
            ):
                with attempt:
                    seed = attempt.retry_state.attempt_number - 1
                    request = build_judge_request(item, messages, step, self.config, seed=seed)
                    try:
                        text = self.backend.generate([request])[0].text
                    finally:
                        sent += self._sent()
                    answer, analysis = parse_verdict(text)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an ERROR verdict, counted by the budget
            cause = f"{type(exc).__name__}: {exc}"
            logger.warning("judge item %s: no verdict after %d request(s): %s", item.id, sent, cause)
            self.budget.record(True, cause)
            return ItemVerdict(item.id, Verdict.ERROR, "llm", cause), sent
        self.budget.record(False)
        return ItemVerdict(item.id, Verdict.PASS if answer else Verdict.FAIL, "llm", analysis), sent

    def judge_items(
        self, messages: Messages, tasks: Sequence[tuple[ConversationStep, ChecklistItem]]
    ) -> tuple[list[ItemVerdict], JudgeCounters]:
        """Verdicts for (step, item) pairs, asked concurrently; tool-error items fail without a request."""
        results: list[ItemVerdict | None] = [forced_verdict(item, step) for step, item in tasks]
        todo = [k for k, v in enumerate(results) if v is None]
        sent = 0
        if todo:
            pool = ThreadPoolExecutor(max_workers=min(self.config.concurrency, len(todo)))
            try:
                futures = {k: pool.submit(self._ask, tasks[k][1], messages, tasks[k][0]) for k in todo}
                for k, fut in futures.items():
                    results[k], n = fut.result()
                    sent += n
            finally:  # an exhausted budget: drop the queued items instead of waiting for them
                pool.shutdown(wait=False, cancel_futures=True)
        return [v for v in results if v is not None], JudgeCounters(sent, sent - len(todo))

    def judge(self, messages: Messages, checklist: Checklist, turns: Iterable[int] | None = None) -> JudgeReport:
        steps = steps_to_judge(messages, checklist, turns)
        tasks = [(st, it) for st in steps for it in checklist.turns[st.turn]]
        verdicts, counters = self.judge_items(messages, tasks)
        by_key = {(st.message_index, it.id): v for (st, it), v in zip(tasks, verdicts)}
        return assemble_report(steps, by_key, checklist, counters)


@register_judge("llm")
def make_llm_judge(
    base_url: str | None = None,
    model: str | None = None,
    api_key_env: str | None = None,
    timeout_s: float = 60.0,
    backend: ChatBackend | None = None,
    **config: Any,
) -> LLMJudge:
    """An ``LLMJudge`` over ``backend``, or over an OpenAI-compatible endpoint at ``base_url``.

    ``config`` holds ``LLMJudgeConfig`` fields (max_retries, backoff_s, concurrency, max_failure_rate, ...).
    The endpoint's client retries transport faults with the same policy numbers (``max_retries``,
    ``backoff_s``, ``max_backoff_s``) and bounds each attempt by ``timeout_s``; ``api_key_env`` None means
    an endpoint without authentication.
    """
    valid = set(LLMJudgeConfig.__dataclass_fields__)
    if set(config) - valid:
        raise TypeError(f"judge 'llm': unknown settings {sorted(set(config) - valid)}; valid: {sorted(valid)}")
    cfg = replace(LLMJudgeConfig(), **config)
    if backend is None:
        if not base_url or not model:
            raise ValueError("judge 'llm' needs base_url and model (an OpenAI-compatible endpoint) or a backend")
        backend = OpenAIChatBackend(
            base_url,
            model,
            api_key_env=api_key_env,
            timeout=timeout_s,
            max_retries=cfg.max_retries,
            concurrency=cfg.concurrency,
            backoff_s=cfg.backoff_s,
            max_backoff_s=cfg.max_backoff_s,
        )
    return LLMJudge(backend, cfg)
