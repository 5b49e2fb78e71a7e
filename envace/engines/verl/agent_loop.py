"""The act/rehearse agent loop for verl (``envace_act_rehearse``): one sample = one trajectory.

verl instantiates this class in its agent-loop workers (Ray actors) for every sample and awaits
``run(sampling_params, **dataset_row)``. We play the trajectory with ``EpisodeRunner`` over verl's server
manager (token ids in → token ids + log-probs out, one sticky request id per role stream so prefix
caching works), score it inside the loop (verifiable scorer or checklist judge, ``sources``) and return
**a list of outputs, one per role stream** (see ``envace.engines.verl.rows`` for why and for the extra
fields that carry per-token role ids to the trainer). The ACT row is last, so verl's "final output of
the session" (validation metrics, generation dumps) is the agent's conversation.

Masks: every generated token of a trainable role has response mask 1; prompt and scaffold tokens (tool
responses, user turns, call messages) and tokens of a frozen role have 0. A trajectory whose reward
could not be computed (judge failure) keeps its tokens but gets an all-zero mask and
``envace_exclude=True``: it enters neither the loss nor any baseline, and is counted. When the judge's failure
budget is exhausted (``JudgeFailureBudgetExceeded``) the trajectory is excluded the same way and its rows carry the
budget's message in ``envace_fatal``: the trainer raises it after the step's generation (``run_failure``), because
verl would only log an exception raised here.

Sampling: per-role temperatures from ``config.envace`` replace verl's rollout temperature during
training; when verl asks for different sampling (validation uses ``val_kwargs``) its value is kept.
Stopping: the server stops on the template's end-of-turn token and on every token of the tokenizer's EOS set
(``end_token_ids``: its eos token and the model's ``generation_config.json`` eos ids, on which vLLM stops anyway);
``EpisodeRunner`` keeps only the end-of-turn token in a stream (``envace.core.turn_end.generation_ending``).
A trajectory whose generation the server aborted is excluded like one whose reward failed.
Requires verl's v1 trainer (``trainer.use_v1=True``, the default), which accepts several outputs per sample.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from uuid import uuid4

from omegaconf import OmegaConf
from transformers import GenerationConfig
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
from verl.utils.profiler import simple_timer

from envace.core.prompts import CHATML_TOOL_TEMPLATE, DEFAULT_ROLE_PROMPTS, ChatFormatter, TemplateNotAppendOnlyError
from envace.core.records import NO_ROLE, EpisodeSpec, Role, TrajectoryStatus, outputs_through_turn
from envace.core.reward import RewardOutcome
from envace.engines.verl.episode import EpisodeOutcome, EpisodeRunner, Generation, RoleStream
from envace.engines.verl.episodes import EPISODE_COLUMN, ROW_COLUMN, spec_from_json
from envace.engines.verl.reward_sources import (
    cached,
    make_executor,
    reward_function,
    score_trajectory,
    simulator_backend,
)
from envace.engines.verl.rows import (
    EXCLUDE_KEY,
    INFO_KEY,
    NUM_OUTPUTS_KEY,
    ROLE_IDS_KEY,
    ROLE_KEY,
    TRAJECTORY_KEY,
)
from envace.engines.verl.run_failure import mark_fatal, score_or_stop
from envace.engines.verl.settings import AGENT_LOOP_NAME, SETTINGS_NODE, LoopSettings
from envace.judges.reward import required_items_gate

logger = logging.getLogger(__name__)


def settings_from_config(config: Any) -> LoopSettings:
    """``LoopSettings`` from verl's full config (the ``envace`` node; defaults when absent)."""
    node = config.get(SETTINGS_NODE) if hasattr(config, "get") else None
    values = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node or {})
    return LoopSettings.from_mapping(values)


def chat_formatter(tokenizer: Any, choice: str) -> ChatFormatter:
    """The (cached) formatter: the model's template when append-only (``auto``/``model``), else ChatML."""

    def build() -> ChatFormatter:
        if choice == "chatml":
            return ChatFormatter(tokenizer, template=CHATML_TOOL_TEMPLATE)
        try:
            return ChatFormatter(tokenizer)
        except (TemplateNotAppendOnlyError, ValueError) as exc:
            if choice == "model":
                raise
            logger.warning(
                "model chat template unusable for append-only streams (%s); using the ChatML tool template",
                str(exc)[:200],
            )
            return ChatFormatter(tokenizer, template=CHATML_TOOL_TEMPLATE)

    return cached(("formatter", id(tokenizer), choice), build)


def end_token_ids(tokenizer: Any, model_path: str | None) -> tuple[int, ...]:
    """The tokenizer's EOS set: its ``eos_token_id`` and the eos ids of the model's ``generation_config.json``
    (vLLM stops on those too; Qwen3's holds ``<|im_end|>`` and ``<|endoftext|>``). Cached per process."""

    def build() -> tuple[int, ...]:
        ids = [tokenizer.eos_token_id]
        try:
            ids.append(GenerationConfig.from_pretrained(model_path, local_files_only=True).eos_token_id)
        except (OSError, ValueError, TypeError):  # no generation_config.json (or no model dir): the tokenizer's only
            pass
        flat = [i for entry in ids for i in (entry if isinstance(entry, (list, tuple)) else [entry])]
        return tuple(dict.fromkeys(int(i) for i in flat if i is not None))

    return cached(("end_token_ids", id(tokenizer), str(model_path)), build)


def episode_from_row(row: dict[str, Any]) -> EpisodeSpec:
    """The episode of a dataset row (the ``envace_episode`` column, or the same key in ``extra_info``)."""
    text = row.get(EPISODE_COLUMN) or (row.get("extra_info") or {}).get(EPISODE_COLUMN)
    if not text:
        raise ValueError(
            f"dataset row (keys {sorted(row)[:12]}) has no {EPISODE_COLUMN!r}: the {AGENT_LOOP_NAME} loop needs the "
            "episode spec; build the parquet with envace.engines.verl.launcher.prepare_verl_data"
        )
    return spec_from_json(text)


@register(AGENT_LOOP_NAME)
class ActRehearseAgentLoop(AgentLoopBase):
    """ACT and REHEARSE generations of one policy through verl's server manager (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings = settings_from_config(self.config)
        self.formatter = chat_formatter(self.tokenizer, self.settings.chat_template)
        self.with_logprobs = bool(self.rollout_config.get("calculate_log_probs", False))
        model_path = self.config.actor_rollout_ref.model.get("path")
        ends = (*self.formatter.end_of_turn_token_ids, *end_token_ids(self.tokenizer, model_path))
        self.stop_token_ids = list(dict.fromkeys(ends))  # the template's end-of-turn token first

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        spec = episode_from_row(kwargs)
        session = int(kwargs.get("session_id", 0))
        trajectory_id = f"{kwargs.get('uid') or uuid4().hex}_{session}"
        settings = self.settings
        executor = (
            make_executor(settings.data_source, kwargs.get(ROW_COLUMN)) if settings.responses == "executor" else None
        )
        simulator = simulator_backend(settings.simulator) if settings.responses == "simulator" else None

        async def generate(role: Role, prompt_ids: list[int], max_new: int, temperature: float) -> Generation:
            return await self._generate(
                role,
                prompt_ids,
                max_new,
                temperature,
                sampling_params,
                f"{trajectory_id}-{role.name.lower()}",
                kwargs.get("priority"),
            )

        gate = required_items_gate() if settings.enforce_required_items else None
        runner = EpisodeRunner(
            spec,
            settings,
            self.formatter,
            DEFAULT_ROLE_PROMPTS,
            generate,
            sample_index=session,
            executor=executor,
            simulator=simulator,
            turn_gate=gate,
            end_token_ids=self.stop_token_ids,
        )
        timing: dict[str, float] = {}
        with simple_timer("generate_sequences", timing):
            outcome = await runner.run()
        reward_fn = reward_function(settings)
        with simple_timer("compute_score", timing):  # a spent judge budget: excluded here, the trainer stops the run
            reward, fatal = await asyncio.get_running_loop().run_in_executor(
                None, score_or_stop, score_trajectory, reward_fn, spec, outcome.trajectory
            )
        after = reward.info.get("terminated_after") if settings.enforce_required_items else None
        if after is not None:  # a required item failed where the online gate could not tell: later outputs out
            for role, n in outputs_through_turn(outcome.trajectory.turns, int(after)).items():
                if role in outcome.streams:
                    outcome.streams[role].drop_outputs_after(n)
        fallback_step = int(kwargs.get("global_steps", 0) or 0)
        return list(mark_fatal(self.rows(outcome, reward, trajectory_id, timing, fallback_step), fatal))

    async def _generate(
        self,
        role: Role,
        prompt_ids: list[int],
        max_new: int,
        temperature: float,
        sampling_params: dict[str, Any],
        request_id: str,
        priority: Any,
    ) -> Generation:
        params = dict(sampling_params)
        if params.get("temperature") == self.rollout_config.get("temperature"):
            params["temperature"] = temperature  # training: per-role temperature; validation keeps its own
        params["max_tokens"] = int(max_new)
        params["stop_token_ids"] = list(self.stop_token_ids)
        extra = {"priority": int(priority)} if priority is not None else {}
        out = await self.server_manager.generate(
            request_id=request_id, prompt_ids=list(prompt_ids), sampling_params=params, **extra
        )
        fields = out.extra_fields or {}
        step = fields.get("global_steps")
        return Generation(
            tuple(out.token_ids),
            tuple(out.log_probs) if out.log_probs else None,
            fields.get("min_global_steps", step),
            fields.get("max_global_steps", step),
            out.stop_reason,
        )

    # ---- outputs ---------------------------------------------------------------------------------
    def rows(
        self,
        outcome: EpisodeOutcome,
        reward: RewardOutcome,
        trajectory_id: str,
        timing: dict[str, float],
        fallback_step: int,
    ) -> list[AgentLoopOutput]:
        """One output per emitted role stream, ACT last (see ``envace.engines.verl.rows``)."""
        excluded = reward.status is not TrajectoryStatus.OK or outcome.trajectory.info.get("aborted", False)
        streams = outcome.streams
        emit = [streams[Role.REHEARSE]] if self._emits_rehearse(streams) else []
        emit.append(streams[Role.ACT])
        metrics = AgentLoopMetrics(
            generate_sequences=timing.get("generate_sequences", 0.0), compute_score=timing.get("compute_score", 0.0)
        )
        steps = {
            "min_global_steps": outcome.min_global_step if outcome.min_global_step is not None else fallback_step,
            "max_global_steps": outcome.max_global_step if outcome.max_global_step is not None else fallback_step,
        }
        summary = self._summary(outcome, reward)
        return [
            self._row(s, reward.reward, excluded, trajectory_id, metrics, outcome.num_messages, steps, summary)
            for s in emit
        ]

    def _emits_rehearse(self, streams: dict[Role, RoleStream]) -> bool:
        stream = streams.get(Role.REHEARSE)
        return stream is not None and Role.REHEARSE in self.settings.trainable_roles and stream.outputs > 0

    def _row(
        self,
        stream: RoleStream,
        reward: float,
        excluded: bool,
        trajectory_id: str,
        metrics: AgentLoopMetrics,
        num_turns: int,
        steps: dict[str, int],
        summary: dict[str, Any],
    ) -> AgentLoopOutput:
        ids, mask = list(stream.response_ids), list(stream.mask)
        role_ids, lps = list(stream.role_ids), list(stream.logprobs)
        if not ids:  # verl writes the reward on the last response token: keep at least one (mask 0)
            ids, mask, role_ids, lps = [self.formatter.end_of_turn_token_ids[0]], [0], [NO_ROLE], [0.0]
        if excluded:
            mask, role_ids = [0] * len(mask), [NO_ROLE] * len(role_ids)
        extra = {
            ROLE_KEY: int(stream.role),
            ROLE_IDS_KEY: role_ids,
            TRAJECTORY_KEY: trajectory_id,
            EXCLUDE_KEY: excluded,
            NUM_OUTPUTS_KEY: int(stream.outputs) if any(mask) else 0,
            INFO_KEY: summary,
            "turn_scores": [],
            "tool_rewards": [],
            "reward_extra_info": dict(summary["numbers"]),
            **steps,
        }
        return AgentLoopOutput(
            prompt_ids=list(stream.prompt_ids),
            response_ids=ids,
            response_mask=mask,
            response_logprobs=lps if self.with_logprobs else None,
            reward_score=float(reward),
            num_turns=num_turns,
            metrics=metrics.model_copy(),
            extra_fields=extra,
        )

    @staticmethod
    def _summary(outcome: EpisodeOutcome, reward: RewardOutcome) -> dict[str, Any]:
        traj = outcome.trajectory
        numbers = {
            "envace_judge_failed": float(reward.status is not TrajectoryStatus.OK),
            "envace_aborted": float(traj.info.get("aborted", False)),
            "envace_act_outputs": float(outcome.streams[Role.ACT].outputs),
            "envace_rehearse_outputs": float(outcome.streams[Role.REHEARSE].outputs)
            if Role.REHEARSE in outcome.streams
            else 0.0,
            "envace_parse_errors": float(len(traj.info.get("parse_errors", []))),
            "envace_steps": float(len(traj.turns)),
        }
        return {
            "termination": traj.termination.value,
            "status": reward.status.value,
            "reward_info": reward.info,
            "parse_errors": [f"{r}:{c}" for r, c in traj.info.get("parse_errors", [])],
            "numbers": numbers,
        }
