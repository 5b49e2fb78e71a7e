"""Composite judge: rules first, the LLM judge only for items rules cannot decide.

Every (step, item) goes to ``RuleJudge``; the UNDECIDABLE ones go to the ``LLMJudge`` when one is
configured and stay UNDECIDABLE otherwise (``score_checklist`` then reports JUDGE_FAILED unless another
step of the turn passed the item). On CPU with rule-checkable checklists no endpoint is needed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from envace.core.checklist import Checklist
from envace.core.checklist_reward import Verdict
from envace.judges.base import (
    LLM_SETTING_NAMES,
    JudgeCounters,
    JudgeReport,
    Messages,
    assemble_report,
    register_judge,
    steps_to_judge,
)
from envace.judges.llm import LLMJudge, make_llm_judge
from envace.judges.rule import RuleJudge

logger = logging.getLogger(__name__)


class CompositeJudge:
    name = "composite"

    def __init__(self, rule: RuleJudge, llm: LLMJudge | None = None) -> None:
        self.rule = rule
        self.llm = llm

    def judge(self, messages: Messages, checklist: Checklist, turns: Iterable[int] | None = None) -> JudgeReport:
        steps = steps_to_judge(messages, checklist, turns)
        verdicts = self.rule.verdicts(messages, checklist, steps)
        counters = JudgeCounters()
        if self.llm is not None:
            tasks = [
                (st, it)
                for st in steps
                for it in checklist.turns[st.turn]
                if verdicts[(st.message_index, it.id)].verdict is Verdict.UNDECIDABLE
            ]
            answers, counters = self.llm.judge_items(messages, tasks)
            for (st, it), verdict in zip(tasks, answers):
                verdicts[(st.message_index, it.id)] = verdict
        return assemble_report(steps, verdicts, checklist, counters)


@register_judge("composite")
def make_composite_judge(
    parse_pass_conditions: bool = True, llm: LLMJudge | None = None, **llm_kwargs: Any
) -> CompositeJudge:
    """Rule judge, plus an LLM judge when ``llm`` or LLM settings (``base_url``, ``backend``) are given."""
    unknown = sorted(set(llm_kwargs) - LLM_SETTING_NAMES)
    if unknown:
        raise TypeError(f"judge 'composite': unknown settings {unknown}; valid: {sorted(LLM_SETTING_NAMES)}")
    if llm is None and (llm_kwargs.get("base_url") or llm_kwargs.get("backend") is not None):
        llm = make_llm_judge(**llm_kwargs)
    if llm is None:
        logger.info("judge 'composite' without base_url/backend: rule-only, other items stay undecidable")
    return CompositeJudge(RuleJudge(parse_pass_conditions), llm)
