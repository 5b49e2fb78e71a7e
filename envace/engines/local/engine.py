"""The ``local`` engine: HF transformers + torch on CPU or one GPU, registered as ``get_engine("local")``.

``LocalEngine.train(config, data, callbacks)`` runs: optional SFT warm-up (``envace.engines.local.sft``'s
``warm_up``; skipped when resuming from a GRPO checkpoint; with ``checkpoint_every`` > 0 checkpointed
after every epoch and resumed from there) → ``config.steps`` role-wise GRPO steps, each = rollout
(``RolloutRunner``) → rewards (``RewardFn``) → per-output advantages → clipped updates of every trained
model (``PolicyUpdater``) → metrics to the callbacks → checkpoint every ``checkpoint_every`` steps (with
the metrics history, so a resumed run returns the whole history). Writing, checking and restoring the
run's checkpoints (GRPO and SFT) is ``envace.engines.local.checkpoint.RunCheckpoints``. ``engine.precision``
is decided once per run (``decide_run_precision``): by the first process, recorded in every checkpoint and
kept as ``precision_record`` (the train stage logs it), reused unprobed by a resumed process. With
``fidelity_every`` = k > 0 and a probe set, the REHEARSE model (the ``rehearse`` copy under ``per_role``,
else the policy) is scored against real tool responses after the SFT warm-up (a history row with ``step``
0), after every k-th step and after the last one (``envace.engines.local.fidelity``). With ``val_every`` = k > 0
and a validation set, the ACT model plays the validation tasks on the real environment on the same schedule
(``val/*`` metrics: ``envace.engines.local.validation``). Both are ``ScheduledProbe`` s
(``envace.engines.local.probing``: one schedule, weights and RNG left untouched). Variants
(``envace.engines.base.VARIANTS``) decide which models exist and which roles train them:

- ``envace``, ``frozen_act``, ``frozen_rehearse``: one shared policy plays both roles; its rows hold
  the outputs of the trainable roles only.
- ``per_role``: two copies of the initial model, one per role, each with its own optimiser.
- ``grpo``: the policy trains on ACT outputs with one baseline per prompt; responses come from a real
  executor per trajectory (``executor_factory``) or a frozen simulator (a frozen copy of the policy
  after SFT, or ``simulator_model``).

Deviation: data are visited in a seeded permutation per epoch, ``prompts_per_step`` prompts a step;
sampling seeds derive from (seed, step, example, position in the step, sample) — the rollout names each
chosen example ``"<data index>@<position>"`` (``step_names``). The position is there because a step that
straddles two epochs (``n_data % prompts_per_step != 0``) can hold the same example twice; keyed by the
example alone, its two groups would sample identical trajectories. Everything in a name is a function
of (seed, step), so a resumed run replays the exact same batches as an uninterrupted one (the resume
test asserts identical weights). A ``guide`` still sees the data index as ``OutputKey.example``.
"""

from __future__ import annotations

import copy
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from envace.core.prompts import DEFAULT_ROLE_PROMPTS, ChatFormatter, RolePrompts
from envace.core.records import EpisodeSpec, Role, Trajectory, truncate_after_turn
from envace.core.reward import RewardFn, RewardOutcome
from envace.core.seeds import derive_seed
from envace.data.specs import to_episode_spec
from envace.engines.base import Engine, StepCallback, TrainResult, get_variant, register_engine
from envace.engines.local.batching import build_rows
from envace.engines.local.checkpoint import RunCheckpoints
from envace.engines.local.config import LocalEngineConfig
from envace.engines.local.fidelity import make_probe
from envace.engines.local.lora import add_lora, merged_copy, unwrap
from envace.engines.local.metrics import rollout_metrics, running_totals, sft_real_calls
from envace.engines.local.probing import ScheduledProbe
from envace.engines.local.rollout import RolloutRunner
from envace.engines.local.rollout_records import ExecutorFactory, ResponseSource
from envace.engines.local.sft import SFT_EXPORT, warm_up
from envace.engines.local.trainer import (
    PolicyUpdater,
    Slot,
    compute_output_advantages,
    make_optimizer,
)
from envace.engines.local.validation import make_validation
from envace.envs.toolworld.reward import toolworld_verifiable_reward
from envace.evaluation.probes import ProbeSet, ValidationSet
from envace.judges.reward import required_items_gate
from envace.models import load_model_and_tokenizer
from envace.runtime.attention import use_gqa_attention
from envace.runtime.decode import DecodeGuide, OutputKey
from envace.runtime.gemm import resolve_fp32_linear, set_fp32_linear
from envace.runtime.precision import decide_run_precision
from envace.utils.malloc import fix_mmap_threshold, running_allocator, trim_heap

logger = logging.getLogger(__name__)


def step_examples(step: int, n_data: int, per_step: int, seed: int) -> list[int]:
    """Data indices of one step: position step*per_step.. in a seeded permutation per epoch."""
    out = []
    for pos in range(step * per_step, (step + 1) * per_step):
        epoch, offset = divmod(pos, n_data)
        order = list(range(n_data))
        random.Random(derive_seed(seed, "data", epoch)).shuffle(order)
        out.append(order[offset])
    return out


def step_names(indices: Sequence[int]) -> list[str]:
    """The rollout's name (seed key) of each example of one step: ``"<data index>@<position in the step>"``.

    Unique within a step even when an example appears twice in it (a step across an epoch boundary).
    """
    return [f"{index}@{position}" for position, index in enumerate(indices)]


def _guide_by_index(guide: DecodeGuide | None, names: Sequence[str], indices: Sequence[int]) -> DecodeGuide | None:
    """``guide`` looked up by data index (its key), for a rollout whose examples are named by ``step_names``."""
    if guide is None:
        return None
    index_of = dict(zip(names, indices))

    def targets(key: OutputKey):
        return guide.targets(replace(key, example=index_of.get(key.example, key.example)))

    return DecodeGuide(targets, strength=guide.strength)


def _frozen(model: torch.nn.Module) -> torch.nn.Module:
    frozen = copy.deepcopy(model).eval()
    for p in frozen.parameters():
        p.requires_grad_(False)
    return frozen


@register_engine("local")
class LocalEngine(Engine):
    """Local role-wise GRPO trainer. ``reward_fn`` defaults to ``toolworld_verifiable_reward``;
    ``fidelity_probe_set`` (``envace.evaluation.oracle_probe_set``) is what ``fidelity_every`` probes;
    ``validation_set`` (``envace.evaluation.probes.ValidationSet``) what ``val_every`` plays."""

    name = "local"

    def __init__(
        self,
        reward_fn: RewardFn | None = None,
        executor_factory: ExecutorFactory | None = None,
        role_prompts: RolePrompts = DEFAULT_ROLE_PROMPTS,
        guide: DecodeGuide | None = None,
        fidelity_probe_set: ProbeSet | None = None,
        validation_set: ValidationSet | None = None,
    ):
        self.reward_fn = reward_fn or toolworld_verifiable_reward
        self.executor_factory = executor_factory
        self.role_prompts = role_prompts
        self.guide = guide
        self.fidelity_probe_set = fidelity_probe_set
        self.validation_set = validation_set
        self.slots: dict[str, Slot] = {}
        self.frozen: dict[str, torch.nn.Module] = {}
        # optional observer of each RL step: (step, scored trajectories, per-output advantages); read-only
        # (e.g. envace.tracking.mlflow_logging.RolloutSampler logs a bounded sample); training does not depend on it
        self.sample_hook: Any = None

    # ---- setup ---------------------------------------------------------------------------------
    def _load(self, cfg: LocalEngineConfig, checkpoints: RunCheckpoints) -> None:
        """Load the model(s); decide the run's precision (``checkpoints``' record on a resume)."""
        model, tokenizer = load_model_and_tokenizer(cfg.model)
        model.to(cfg.device)
        use_gqa_attention(model)
        recorded = checkpoints.recorded_precision()
        self.precision_record = decide_run_precision(cfg.precision, cfg.device, model, recorded, str(checkpoints.root))
        self.precision = self.precision_record["precision"]
        checkpoints.precision = self.precision_record  # every checkpoint of the run records it
        logger.info("local engine: precision %s (engine.precision=%s) on %s", self.precision, cfg.precision, cfg.device)
        self.fp32_linear = resolve_fp32_linear(cfg.fp32_linear, self.precision, cfg.device, model)
        self.tokenizer = tokenizer
        self.formatter = ChatFormatter(tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else 0
        self.variant = get_variant(cfg.variant)
        # with LoRA: peft's wrapper (kept for export); the engine trains the HF model inside it
        loaded = add_lora(model, cfg.lora) if cfg.lora is not None else model
        set_fp32_linear(loaded, self.fp32_linear)  # before any copy: a deep copy keeps it
        if self.variant.separate_models:
            copies = {"act": loaded, "rehearse": copy.deepcopy(loaded)}
        else:
            copies = {"policy": loaded}
        self.adapters = dict(copies) if cfg.lora is not None else {}
        self.models = {name: unwrap(m) for name, m in copies.items()}
        if not self.variant.rehearse_by_policy and cfg.grpo_responses not in ("executor", "simulator"):
            raise ValueError(f"grpo_responses={cfg.grpo_responses!r}; valid: 'executor', 'simulator'")
        if not self.variant.rehearse_by_policy and cfg.grpo_responses == "executor" and self.executor_factory is None:
            raise ValueError(
                "variant 'grpo' with grpo_responses='executor' needs LocalEngine(executor_factory=...); "
                "pass one (e.g. the tool world's make_executor) or set grpo_responses='simulator'"
            )

    def _make_slots(self, cfg: LocalEngineConfig) -> None:
        """Trained models with their roles, optimisers, references; frozen simulator for grpo."""
        roles = self.variant.trainable_roles
        if self.variant.separate_models:
            wanted = {"act": frozenset({Role.ACT}) & roles, "rehearse": frozenset({Role.REHEARSE}) & roles}
        else:
            wanted = {"policy": roles}
        self.slots = {
            name: Slot(
                name,
                self.models[name],
                r,
                make_optimizer(self.models[name], cfg.optim),
                _frozen(self.models[name]) if cfg.optim.kl_coef > 0 else None,
            )
            for name, r in wanted.items()
            if r
        }
        self.frozen = {f"ref_{n}": s.ref for n, s in self.slots.items() if s.ref is not None}
        if not self.variant.rehearse_by_policy and cfg.grpo_responses == "simulator":
            if cfg.simulator_model is not None:
                sim, _ = load_model_and_tokenizer(cfg.simulator_model)
                use_gqa_attention(sim)
                set_fp32_linear(sim, self.fp32_linear)
                self.frozen["simulator"] = _frozen(sim.to(cfg.device))
            else:
                self.frozen["simulator"] = _frozen(self.models["policy"])

    def _response_source(self) -> ResponseSource:
        if self.variant.rehearse_by_policy:
            return ResponseSource(model=self.models.get("rehearse", self.models.get("policy")), trainable=True)
        if "simulator" in self.frozen:
            return ResponseSource(model=self.frozen["simulator"], trainable=False)
        return ResponseSource(executor_factory=self.executor_factory)

    # ---- one RL step ---------------------------------------------------------------------------
    def _score(
        self, specs: Sequence[EpisodeSpec], trajs: Sequence[Trajectory], enforce: bool = True
    ) -> list[Trajectory]:
        """Rewards; with ``enforce``, a judge's ``terminated_after`` (a required item that failed in a turn
        the rollout's rule gate could not decide) drops the later turns' outputs (``truncate_after_turn``)."""
        scored = []
        for traj, spec in zip(trajs, specs):
            reward, status, info = RewardOutcome(*self.reward_fn(spec, traj))
            traj = replace(traj, reward=float(reward), status=status, info={**traj.info, "reward_info": info})
            after = info.get("terminated_after") if enforce else None
            if after is not None and any(t.user_turn > after for t in traj.turns):
                traj = truncate_after_turn(traj, int(after))
            scored.append(traj)
        return scored

    def _rl_step(self, cfg: LocalEngineConfig, specs: Sequence[EpisodeSpec], step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        idx = step_examples(step, len(specs), cfg.prompts_per_step, cfg.seed)
        chosen, names = [specs[i] for i in idx], step_names(idx)
        guide = _guide_by_index(self.guide, names, idx)
        gate = required_items_gate() if cfg.rollout.enforce_required_items else None
        runner = RolloutRunner(
            self.formatter, cfg.rollout, self.role_prompts, guide, precision=self.precision, turn_gate=gate
        )
        act_model = self.models.get("act", self.models.get("policy"))
        batch = runner.run(chosen, act_model, self._response_source(), seed=cfg.seed, step=step, examples=names)
        k = cfg.rollout.samples_per_prompt
        trajs = self._score(
            [s for s in chosen for _ in range(k)], batch.trajectories, cfg.rollout.enforce_required_items
        )
        groups = [j // k for j in range(len(trajs))]
        adv = compute_output_advantages(trajs, groups, self.variant, cfg.optim)
        metrics = rollout_metrics(batch, trajs, adv)
        if self.sample_hook is not None:
            self.sample_hook(step + 1, trajs, adv)
        trim_heap()  # the rollout's KV caches are free now: keep them out of the update's peak
        t1 = time.perf_counter()
        temps = {r: cfg.rollout.temperature(r) for r in Role}
        stream_tokens = 0
        for name, slot in self.slots.items():
            rows = build_rows(trajs, adv.values.tolist(), slot.roles, temps, adv.excluded)
            stream_tokens += sum(int(r.input_ids.numel()) for r in rows)
            updater = PolicyUpdater(
                slot, cfg.optim, derive_seed(cfg.seed, name), self.pad_id, cfg.device, precision=self.precision
            )
            diff = updater.prepare(rows)
            prefix = "" if name == "policy" else f"{name}/"
            metrics.update({f"{prefix}{k2}": v for k2, v in updater.update(rows, step).items()})
            if diff is not None:
                metrics[f"{prefix}rollout/logprob_diff"] = diff
            trim_heap()
        t2 = time.perf_counter()
        metrics.update(
            {
                "time/rollout": t1 - t0,
                "time/update": t2 - t1,
                "time/step": t2 - t0,
                "engine/bf16": float(self.precision == "bf16"),
            }
        )
        metrics["tokens_per_s"] = sum(batch.generated_tokens.values()) / max(batch.seconds, 1e-9)
        metrics["update/stream_tokens"] = float(stream_tokens)
        metrics["update/tokens_per_s"] = stream_tokens * cfg.optim.ppo_epochs / max(t2 - t1, 1e-9)
        return metrics

    # ---- entry point ---------------------------------------------------------------------------
    def train(
        self, config: LocalEngineConfig, data: Sequence[Any], callbacks: Sequence[StepCallback] = ()
    ) -> TrainResult:
        cfg = config
        specs = [to_episode_spec(d) for d in data]
        if not specs:
            raise ValueError("LocalEngine.train: no training data; pass at least one EpisodeSpec or Task")
        torch.manual_seed(cfg.seed)
        fix_mmap_threshold()  # glibc: large freed blocks go back to the OS instead of fragmenting the heap
        logger.info("C allocator: %s (ENVACE_ALLOCATOR; envace.utils.malloc)", running_allocator())
        checkpoints = RunCheckpoints(cfg)
        self._load(cfg, checkpoints)
        has_checkpoint = checkpoints.latest() is not None
        history: list[dict[str, float]] = (
            []
            if has_checkpoint
            else list(
                warm_up(
                    self.models,
                    self.formatter,
                    specs,
                    cfg,
                    role_prompts=self.role_prompts,
                    precision=self.precision,
                    pad_id=self.pad_id,
                    checkpoints=checkpoints,
                    callbacks=callbacks,
                )
            )
        )
        if history and not has_checkpoint:  # the warm-up ran here: its weights are the run's baseline
            self._export(cfg, SFT_EXPORT)
        self._make_slots(cfg)
        scheduled = (
            ScheduledProbe(make_probe(cfg, self.fidelity_probe_set, self.precision), cfg.fidelity_every, "rehearse"),
            ScheduledProbe(make_validation(cfg, self.validation_set, self.precision), cfg.val_every, "act"),
        )

        def probes(step: int) -> dict[str, float]:  # the probes due after ``step`` updates (none: {})
            measured: dict[str, float] = {}
            for probe in scheduled:
                measured.update(probe.at(step, cfg.steps, self.models, self.tokenizer, self.formatter))
            return measured

        ckpt_models = {**self.models, **self.frozen}  # what a GRPO checkpoint holds
        optimizers = {name: slot.optimizer for name, slot in self.slots.items()}
        start, restored = checkpoints.resume(ckpt_models, optimizers)
        history = restored if has_checkpoint else history
        sft_calls = sft_real_calls(specs) if cfg.sft.epochs > 0 else 0  # real responses the warm-up used
        if start == 0 and (before := probes(0)):
            history.append({"step": 0.0, **before, **running_totals({}, None, sft_calls)})
            for cb in callbacks:
                cb(0, history[-1])
        end = cfg.steps if cfg.stop_after_steps is None else min(cfg.steps, start + cfg.stop_after_steps)
        last_ckpt = None
        for step in tqdm(
            range(start, end), desc=f"train[{cfg.variant}]", disable=not cfg.progress, initial=start, total=cfg.steps
        ):
            metrics = {
                "step": float(step + 1),
                **self._rl_step(cfg, specs, step),
                **probes(step + 1),
            }
            previous = next((h for h in reversed(history) if "step" in h), None)
            metrics.update(running_totals(metrics, previous, sft_calls))
            history.append(metrics)
            for cb in callbacks:
                cb(step + 1, metrics)
            if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0:
                last_ckpt = checkpoints.save(step + 1, ckpt_models, optimizers, history)
        if end > start and (not cfg.checkpoint_every or end % cfg.checkpoint_every):
            last_ckpt = checkpoints.save(end, ckpt_models, optimizers, history)
        artifacts = self._export(cfg) if end == cfg.steps else {}
        sft = Path(cfg.output_dir or ".") / SFT_EXPORT  # written by this run or by the one it resumed
        return TrainResult(
            steps_done=end,
            history=tuple(history),
            checkpoint_dir=last_ckpt,
            artifacts=artifacts,
            baseline={name: str(sft / name) for name in self.models if cfg.output_dir and (sft / name).is_dir()},
            models=dict(self.models),
        )

    def _export(self, cfg: LocalEngineConfig, folder: str = "final") -> dict[str, str]:
        """Weights + tokenizer as HF directories under ``output_dir/<folder>`` (what evaluation loads with
        kind='path'): ``final`` after the last step, ``SFT_EXPORT`` after the SFT warm-up (the baseline the
        trained model is compared with). With LoRA, ``<folder>/<name>`` holds the merged weights (merged on a
        copy) and ``<folder>/<name>-adapter`` peft's adapter."""
        if not cfg.output_dir:
            return {}
        out = {}
        for name, model in self.models.items():
            path = Path(cfg.output_dir) / folder / name
            adapter = self.adapters.get(name)
            (model if adapter is None else merged_copy(adapter)).save_pretrained(path)
            self.tokenizer.save_pretrained(path)
            out[name] = str(path)
            if adapter is not None:
                adapter.save_pretrained(path.with_name(f"{name}-adapter"))
                out[f"{name}-adapter"] = str(path.with_name(f"{name}-adapter"))
        (Path(cfg.output_dir) / folder / "config.txt").write_text(repr(asdict(cfg)))
        return out
