"""The ``local`` engine: HF transformers + torch on CPU or one GPU, registered as ``get_engine("local")``.

``LocalEngine.train(config, data, callbacks)`` runs: optional SFT warm-up (skipped when resuming from a
GRPO checkpoint; with ``checkpoint_every`` > 0 checkpointed after every epoch and resumed from there) →
``config.steps`` role-wise GRPO steps, each = rollout (``RolloutRunner``) → rewards (``RewardFn``) →
per-output advantages → clipped updates of every trained model (``PolicyUpdater``) → metrics to the
callbacks → checkpoint every ``checkpoint_every`` steps (with the metrics history, so a resumed run
returns the whole history). With ``fidelity_every`` = k > 0 and a probe set, the REHEARSE model (the
``rehearse`` copy under ``per_role``, else the policy) is scored against real tool responses after the
SFT warm-up (a history row with ``step`` 0), after every k-th step and after the last one
(``envace.engines.local.fidelity``; it leaves weights and RNG untouched). Variants
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
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from envace.core.prompts import DEFAULT_ROLE_PROMPTS, ChatFormatter, RolePrompts
from envace.core.records import Role, Trajectory, truncate_after_turn
from envace.core.seeds import derive_seed
from envace.engines.base import (
    Engine,
    EpisodeSpec,
    RewardFn,
    RewardOutcome,
    StepCallback,
    TrainResult,
    get_variant,
    register_engine,
    to_episode_spec,
    toolworld_verifiable_reward,
)
from envace.engines.local.attention import use_gqa_attention
from envace.engines.local.batching import build_rows
from envace.engines.local.checkpoint import (
    SFT_DIR,
    Checkpoint,
    load_latest,
    save_checkpoint,
    sft_start_epoch,
)
from envace.engines.local.config import LocalEngineConfig
from envace.engines.local.decode import DecodeGuide, OutputKey
from envace.engines.local.fidelity import FidelityProbe, probe_due
from envace.engines.local.lora import add_lora, lora_record, merged_copy, unwrap
from envace.engines.local.metrics import rollout_metrics
from envace.engines.local.precision import resolve_precision, trim_heap
from envace.engines.local.rollout import ExecutorFactory, ResponseSource, RolloutRunner
from envace.engines.local.sft import gold_trajectories, sft_epoch, sft_rows
from envace.engines.local.trainer import (
    PolicyUpdater,
    Slot,
    compute_output_advantages,
    make_optimizer,
)
from envace.evaluation.probes import ProbeSet
from envace.judges.reward import required_items_gate
from envace.models import load_model_and_tokenizer

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
    ``fidelity_probe_set`` (``envace.evaluation.oracle_probe_set``) is what ``fidelity_every`` probes."""

    name = "local"

    def __init__(
        self,
        reward_fn: RewardFn | None = None,
        executor_factory: ExecutorFactory | None = None,
        role_prompts: RolePrompts = DEFAULT_ROLE_PROMPTS,
        guide: DecodeGuide | None = None,
        fidelity_probe_set: ProbeSet | None = None,
    ):
        self.reward_fn = reward_fn or toolworld_verifiable_reward
        self.executor_factory = executor_factory
        self.role_prompts = role_prompts
        self.guide = guide
        self.fidelity_probe_set = fidelity_probe_set
        self.slots: dict[str, Slot] = {}
        self.frozen: dict[str, torch.nn.Module] = {}
        # optional observer of each RL step: (step, scored trajectories, per-output advantages); read-only
        # (e.g. envace.mlflow_logging.RolloutSampler logs a bounded sample); training does not depend on it
        self.sample_hook: Any = None

    # ---- setup ---------------------------------------------------------------------------------
    def _load(self, cfg: LocalEngineConfig) -> None:
        model, tokenizer = load_model_and_tokenizer(cfg.model)
        model.to(cfg.device)
        use_gqa_attention(model)
        self.precision = resolve_precision(cfg.precision, cfg.device)
        logger.info("local engine: precision %s (engine.precision=%s) on %s", self.precision, cfg.precision, cfg.device)
        self.tokenizer = tokenizer
        self.formatter = ChatFormatter(tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else 0
        self.variant = get_variant(cfg.variant)
        # with LoRA: peft's wrapper (kept for export); the engine trains the HF model inside it
        loaded = add_lora(model, cfg.lora) if cfg.lora is not None else model
        if self.variant.separate_models:
            copies = {"act": loaded, "rehearse": copy.deepcopy(loaded)}
        else:
            copies = {"policy": loaded}
        self.adapters = dict(copies) if cfg.lora is not None else {}
        self.models = {name: unwrap(m) for name, m in copies.items()}
        if not self.variant.rehearse_by_policy and cfg.grpo_responses not in ("executor", "simulator"):
            raise ValueError(f"grpo_responses={cfg.grpo_responses!r}; valid: 'executor', 'simulator'")
        if not self.variant.rehearse_by_policy and cfg.grpo_responses == "executor" and self.executor_factory is None:
            raise ValueError("variant 'grpo' with grpo_responses='executor' needs LocalEngine(executor_factory=...); "
                             "pass one (e.g. the tool world's make_executor) or set grpo_responses='simulator'")

    def _make_slots(self, cfg: LocalEngineConfig) -> None:
        """Trained models with their roles, optimisers, references; frozen simulator for grpo."""
        roles = self.variant.trainable_roles
        if self.variant.separate_models:
            wanted = {"act": frozenset({Role.ACT}) & roles, "rehearse": frozenset({Role.REHEARSE}) & roles}
        else:
            wanted = {"policy": roles}
        self.slots = {
            name: Slot(name, self.models[name], r, make_optimizer(self.models[name], cfg.optim),
                       _frozen(self.models[name]) if cfg.optim.kl_coef > 0 else None)
            for name, r in wanted.items() if r
        }
        self.frozen = {f"ref_{n}": s.ref for n, s in self.slots.items() if s.ref is not None}
        if not self.variant.rehearse_by_policy and cfg.grpo_responses == "simulator":
            if cfg.simulator_model is not None:
                sim, _ = load_model_and_tokenizer(cfg.simulator_model)
                use_gqa_attention(sim)
                self.frozen["simulator"] = _frozen(sim.to(cfg.device))
            else:
                self.frozen["simulator"] = _frozen(self.models["policy"])

    def _response_source(self) -> ResponseSource:
        if self.variant.rehearse_by_policy:
            return ResponseSource(model=self.models.get("rehearse", self.models.get("policy")), trainable=True)
        if "simulator" in self.frozen:
            return ResponseSource(model=self.frozen["simulator"], trainable=False)
        return ResponseSource(executor_factory=self.executor_factory)

    # ---- SFT -----------------------------------------------------------------------------------
    def _sft(
        self, cfg: LocalEngineConfig, specs: Sequence[EpisodeSpec], callbacks: Sequence[StepCallback]
    ) -> list[dict]:
        if cfg.sft.epochs <= 0:
            return []
        policy = self.models.get("policy", self.models.get("act"))
        trajs = gold_trajectories(specs, policy, self.formatter, cfg.rollout, self.role_prompts,
                                  precision=self.precision)
        ckpt = self._resume_sft(cfg)  # after the gold replay, which an uninterrupted run also does first
        history = ckpt.history() if ckpt else []
        for index, (name, model) in enumerate(self.models.items()):
            roles = cfg.sft.roles if name == "policy" else [r for r in cfg.sft.roles if r.name.lower() == name]
            rows = sft_rows(trajs, roles)
            first = sft_start_epoch(ckpt, index, cfg.sft.epochs)
            if not rows or first >= cfg.sft.epochs:
                continue
            opt = make_optimizer(model, cfg.optim, lr=cfg.sft.lr)
            if ckpt is not None and first > 0:
                opt.load_state_dict(ckpt.optimizer_state(name))
            for epoch in tqdm(range(first, cfg.sft.epochs), desc=f"sft[{name}]", disable=not cfg.progress,
                              initial=first, total=cfg.sft.epochs):
                metrics = sft_epoch(model, opt, rows, cfg.sft, epoch=epoch, seed=derive_seed(cfg.seed, name),
                                    pad_id=self.pad_id, device=cfg.device, optim=cfg.optim, precision=self.precision)
                metrics = {**metrics, "sft/epoch": float(epoch), "sft/gold_trajectories": float(len(trajs))}
                metrics = {k if name == "policy" else f"{k}/{name}": v for k, v in metrics.items()}
                history.append(metrics)
                if cfg.output_dir and cfg.checkpoint_every:
                    state = {"model_index": index, "model": name, "epoch": epoch, **self._identity(cfg)}
                    save_checkpoint(Path(cfg.output_dir) / "checkpoints" / SFT_DIR, index * cfg.sft.epochs + epoch + 1,
                                    self.models, {name: opt}, state, keep=cfg.keep_checkpoints, history=history)
                for cb in callbacks:
                    cb(epoch, metrics)
        return history

    def _resume_sft(self, cfg: LocalEngineConfig) -> Checkpoint | None:
        """The latest SFT checkpoint restored into the models and RNG (None: none, or resume off)."""
        ckpt = load_latest(Path(cfg.output_dir) / "checkpoints" / SFT_DIR) if cfg.output_dir and cfg.resume else None
        if ckpt is None:
            return None
        self._check_checkpoint(ckpt, cfg)
        for name, model in self.models.items():
            ckpt.restore_model(name, model)
        ckpt.restore_rng()
        logger.info("resumed the SFT warm-up from %s (model %s, epoch %d done)", ckpt.path, ckpt.state["model"],
                    int(ckpt.state["epoch"]) + 1)
        return ckpt

    # ---- one RL step ---------------------------------------------------------------------------
    def _score(self, specs: Sequence[EpisodeSpec], trajs: Sequence[Trajectory],
               enforce: bool = True) -> list[Trajectory]:
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
        runner = RolloutRunner(self.formatter, cfg.rollout, self.role_prompts, guide, precision=self.precision,
                               turn_gate=gate)
        act_model = self.models.get("act", self.models.get("policy"))
        batch = runner.run(chosen, act_model, self._response_source(), seed=cfg.seed, step=step, examples=names)
        k = cfg.rollout.samples_per_prompt
        trajs = self._score([s for s in chosen for _ in range(k)], batch.trajectories,
                            cfg.rollout.enforce_required_items)
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
            updater = PolicyUpdater(slot, cfg.optim, derive_seed(cfg.seed, name), self.pad_id, cfg.device,
                                    precision=self.precision)
            diff = updater.prepare(rows)
            prefix = "" if name == "policy" else f"{name}/"
            metrics.update({f"{prefix}{k2}": v for k2, v in updater.update(rows, step).items()})
            if diff is not None:
                metrics[f"{prefix}rollout/logprob_diff"] = diff
            trim_heap()
        t2 = time.perf_counter()
        metrics.update({"time/rollout": t1 - t0, "time/update": t2 - t1, "time/step": t2 - t0,
                        "engine/bf16": float(self.precision == "bf16")})
        metrics["tokens_per_s"] = sum(batch.generated_tokens.values()) / max(batch.seconds, 1e-9)
        metrics["update/stream_tokens"] = float(stream_tokens)
        metrics["update/tokens_per_s"] = stream_tokens * cfg.optim.ppo_epochs / max(t2 - t1, 1e-9)
        return metrics

    # ---- checkpoints ---------------------------------------------------------------------------
    def _save(self, cfg: LocalEngineConfig, step: int, history: Sequence[dict[str, float]]) -> str | None:
        if not cfg.output_dir:
            return None
        models = {**self.models, **self.frozen}
        optims = {n: s.optimizer for n, s in self.slots.items()}
        state = {"data_position": step * cfg.prompts_per_step, **self._identity(cfg)}
        path = save_checkpoint(Path(cfg.output_dir) / "checkpoints", step, models, optims, state,
                               keep=cfg.keep_checkpoints, history=history)
        shutil.rmtree(Path(cfg.output_dir) / "checkpoints" / SFT_DIR, ignore_errors=True)  # superseded
        return str(path)

    @staticmethod
    def _identity(cfg: LocalEngineConfig) -> dict[str, Any]:
        """What a checkpoint records of the run that wrote it (``_check_checkpoint`` compares it)."""
        return {"variant": cfg.variant, "seed": cfg.seed, "lora": lora_record(cfg.lora)}

    @staticmethod
    def _check_checkpoint(ckpt: Checkpoint, cfg: LocalEngineConfig) -> None:
        if ckpt.state.get("variant") != cfg.variant:
            raise ValueError(f"checkpoint {ckpt.path} is for variant {ckpt.state.get('variant')!r}, config asks "
                             f"{cfg.variant!r}; use another output_dir or set resume=False")
        if ckpt.state.get("lora") != lora_record(cfg.lora):
            raise ValueError(f"checkpoint {ckpt.path} was written with lora={ckpt.state.get('lora')}, config asks "
                             f"lora={lora_record(cfg.lora)} (algo.lora_*); use another output_dir or set resume=False")

    def _resume(self, cfg: LocalEngineConfig) -> tuple[int, list[dict[str, float]]]:
        """(step, metrics history) of the latest checkpoint, restored into models/optimisers/RNG; (0, [])."""
        if not (cfg.output_dir and cfg.resume):
            return 0, []
        ckpt = load_latest(Path(cfg.output_dir) / "checkpoints")
        if ckpt is None:
            return 0, []
        self._check_checkpoint(ckpt, cfg)
        for name, model in {**self.models, **self.frozen}.items():
            ckpt.restore_model(name, model)
        for name, slot in self.slots.items():
            slot.optimizer.load_state_dict(ckpt.optimizer_state(name))
        ckpt.restore_rng()
        logger.info("resumed from %s (step %d)", ckpt.path, ckpt.step)
        return ckpt.step, ckpt.history()

    # ---- world-model fidelity ------------------------------------------------------------------
    def _fidelity_probe(self, cfg: LocalEngineConfig) -> FidelityProbe | None:
        if cfg.fidelity_every <= 0:
            return None
        if self.fidelity_probe_set is None:
            raise ValueError(f"fidelity_every={cfg.fidelity_every} needs LocalEngine(fidelity_probe_set=...) (e.g. "
                             "envace.evaluation.oracle_probe_set on validation tasks); or set fidelity_every=0")
        return FidelityProbe(self.fidelity_probe_set, max_new_tokens=cfg.rollout.max_rehearse_tokens,
                             seed=cfg.seed, progress=cfg.progress, precision=self.precision,
                             context_tokens=cfg.rollout.rehearse_context_tokens)

    def _probe(self, probe: FidelityProbe | None, cfg: LocalEngineConfig, step: int) -> dict[str, float]:
        """``fidelity/*`` metrics of the REHEARSE model after ``step`` updates when a probe is due, else {}."""
        if probe is None or not probe_due(step, cfg.fidelity_every, cfg.steps):
            return {}
        return probe.measure(self.models.get("rehearse", self.models.get("policy")), self.tokenizer, self.formatter)

    # ---- entry point ---------------------------------------------------------------------------
    def train(
        self, config: LocalEngineConfig, data: Sequence[Any], callbacks: Sequence[StepCallback] = ()
    ) -> TrainResult:
        cfg = config
        specs = [to_episode_spec(d) for d in data]
        if not specs:
            raise ValueError("LocalEngine.train: no training data; pass at least one EpisodeSpec or Task")
        torch.manual_seed(cfg.seed)
        self._load(cfg)
        has_checkpoint = bool(cfg.output_dir and cfg.resume and load_latest(Path(cfg.output_dir) / "checkpoints"))
        history: list[dict[str, float]] = [] if has_checkpoint else list(self._sft(cfg, specs, callbacks))
        self._make_slots(cfg)
        probe = self._fidelity_probe(cfg)
        start, restored = self._resume(cfg)
        history = restored if has_checkpoint else history
        if start == 0 and (before := self._probe(probe, cfg, 0)):
            history.append({"step": 0.0, **before})
            for cb in callbacks:
                cb(0, history[-1])
        end = cfg.steps if cfg.stop_after_steps is None else min(cfg.steps, start + cfg.stop_after_steps)
        last_ckpt = None
        for step in tqdm(range(start, end), desc=f"train[{cfg.variant}]", disable=not cfg.progress,
                         initial=start, total=cfg.steps):
            metrics = {"step": float(step + 1), **self._rl_step(cfg, specs, step), **self._probe(probe, cfg, step + 1)}
            history.append(metrics)
            for cb in callbacks:
                cb(step + 1, metrics)
            if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0:
                last_ckpt = self._save(cfg, step + 1, history)
        if end > start and (not cfg.checkpoint_every or end % cfg.checkpoint_every):
            last_ckpt = self._save(cfg, end, history)
        artifacts = self._export(cfg) if end == cfg.steps else {}
        return TrainResult(steps_done=end, history=tuple(history), checkpoint_dir=last_ckpt,
                           artifacts=artifacts, models=dict(self.models))

    def _export(self, cfg: LocalEngineConfig) -> dict[str, str]:
        """Final weights + tokenizer as HF directories (what evaluation loads with kind='path'); with LoRA,
        ``final/<name>`` holds the merged weights (merged on a copy) and ``final/<name>-adapter`` peft's adapter."""
        if not cfg.output_dir:
            return {}
        out = {}
        for name, model in self.models.items():
            path = Path(cfg.output_dir) / "final" / name
            adapter = self.adapters.get(name)
            (model if adapter is None else merged_copy(adapter)).save_pretrained(path)
            self.tokenizer.save_pretrained(path)
            out[name] = str(path)
            if adapter is not None:
                adapter.save_pretrained(path.with_name(f"{name}-adapter"))
                out[f"{name}-adapter"] = str(path.with_name(f"{name}-adapter"))
        (Path(cfg.output_dir) / "final" / "config.txt").write_text(repr(asdict(cfg)))
        return out
