"""Optional SFT warm-up on gold trajectories of both roles.

Gold trajectories are built by a *teacher-forced rollout*: the same ``RolloutRunner`` that samples RL
trajectories is run with every output forced to its gold text, so the SFT streams have exactly the
shape RL streams have (same prompts, continuations and end-of-turn tokens). A REHEARSE prompt holds no
few-shot examples: the tool schemas and the gold trajectory's own history up to the call
(``envace.core.rehearse_context``).
ACT targets are the rendered gold tool calls of each step and the gold final reply of each turn;
REHEARSE targets are the real executor's responses (recorded in ``EpisodeSpec.gold``) rendered as
``<execution_result>`` blocks. Loss: mean negative log-likelihood over target tokens only (end-of-turn
token included), temperature 1. Specs without recorded gold responses are skipped (counted).

``warm_up`` is the engine's SFT phase: gold replay once, then ``cfg.sft.epochs`` epochs per trained model
(the shared policy, or the ACT then the REHEARSE copy with its own role), one optimiser per model for all its
epochs, its learning rate ``cfg.sft.lr`` or, with ``cfg.sft.schedule="cosine"``, warmed up then decayed over
the whole warm-up; with ``checkpoint_every`` > 0 it checkpoints after every epoch (``RunCheckpoints.save_sft``)
and a resumed run continues after the last epoch done.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from tqdm.auto import tqdm

from envace.core.prompts import ChatFormatter, sft_act_target, sft_rehearse_target
from envace.core.records import Role, Termination, Trajectory
from envace.core.seeds import derive_seed
from envace.core.wire import as_result_object
from envace.engines.base import EpisodeSpec, StepCallback
from envace.engines.local.batching import TrainRow, build_rows
from envace.engines.local.checkpoint import RunCheckpoints, sft_start_epoch
from envace.engines.local.config import LocalEngineConfig, OptimConfig, RolloutConfig, SFTConfig
from envace.engines.local.rollout import RolloutRunner
from envace.engines.local.rollout_records import ResponseSource
from envace.engines.local.trainer import PolicyUpdater, Slot, flat_gradients, make_optimizer, set_checkpointing
from envace.runtime.decode import DecodeGuide, OutputKey
from envace.runtime.precision import release_inference_copy
from envace.utils.malloc import trim_heap

logger = logging.getLogger(__name__)

REPLAY_SPECS = 4  # specs whose gold trajectories are replayed together (bounds the replay's KV caches)
SFT_EXPORT = "sft_final"  # under output_dir: the weights after the warm-up, as HF directories (one per model)


def flawed(task_id: str, rate: float) -> bool:
    """Whether the planted flaw hits task ``task_id``: a uniform draw seeded by the id alone, so the same tasks
    carry it in every run, seed and process."""
    return rate > 0 and random.Random(f"sft-flaw:{task_id}").random() < rate


def plant_answer_flaw(specs: Sequence[EpisodeSpec], cfg: SFTConfig) -> tuple[list[EpisodeSpec], int]:
    """The specs with the planted demonstrator flaw of ``cfg`` (``SFTConfig.flaw_*``) and how many carry it.

    A hit spec (its domain in ``flaw_domains``, then ``flawed(task_id, flaw_rate)``) keeps its calls and
    responses and has every gold final reply replaced by ``flaw_answer``: the demonstrator does the work and
    then fails to report it. Only the SFT targets change; the tasks' checks and every reward do not, so a reply
    like this fails every turn that has values to report, and RL can find that out.
    """
    if cfg.flaw_rate <= 0:
        return list(specs), 0
    present = {s.domain for s in specs}
    unknown = sorted(set(cfg.flaw_domains) - present)
    if unknown:
        raise ValueError(
            f"SFT flaw: train.sft_flaw_domains names {unknown}, which no SFT task has (domains present: "
            f"{sorted(present)}); name one of those"
        )
    out: list[EpisodeSpec] = []
    hits = 0
    for spec in specs:
        if spec.domain in cfg.flaw_domains and flawed(spec.task_id, cfg.flaw_rate):
            spec = replace(spec, gold_answers=tuple(cfg.flaw_answer for _ in spec.user_turns))
            hits += 1
        out.append(spec)
    return out, hits


def gold_targets(spec: EpisodeSpec, fmt: ChatFormatter) -> dict[Role, list[list[int]]] | None:
    """Token targets of every output of the gold trajectory, per role in output order (None: no responses)."""
    eot = [fmt.end_of_turn_token_ids[0]]
    act: list[list[int]] = []
    reh: list[list[int]] = []
    for t in range(len(spec.user_turns)):
        for step in spec.gold[t] if spec.gold else ():
            if step.responses is None:
                return None
            act.append(fmt.encode(sft_act_target(step.calls)) + eot)
            reh.extend(fmt.encode(sft_rehearse_target(as_result_object(r))) + eot for r in step.responses)
        answer = spec.gold_answers[t] if t < len(spec.gold_answers) else ""
        act.append(fmt.encode(sft_act_target((), answer)) + eot)
    return {Role.ACT: act, Role.REHEARSE: reh}


def gold_guide(
    specs: Mapping[Any, EpisodeSpec], fmt: ChatFormatter, strength: float | None = None, replay: bool = False
) -> DecodeGuide:
    """A guide steering each example's outputs toward its gold targets (keys: the rollout's example names).

    ``strength=None`` replays gold exactly (teacher forcing); a finite strength only biases sampling.
    Outputs past the gold ones (and examples without gold responses) are sampled freely.
    """
    targets = {name: gold_targets(spec, fmt) for name, spec in specs.items()}

    def lookup(key: OutputKey) -> list[int] | None:
        gold = targets.get(key.example)
        if gold is None:
            return None
        outs = gold[key.role]
        return outs[key.index] if key.index < len(outs) else None

    return DecodeGuide(lookup, strength=strength, replay=replay and strength is None)


def gold_trajectories(
    specs: Sequence[EpisodeSpec],
    model: Any,
    fmt: ChatFormatter,
    rollout: RolloutConfig,
    prompts: Any,
    precision: str = "fp32",
    replay_specs: int = REPLAY_SPECS,
) -> list[Trajectory]:
    """Teacher-forced gold trajectories (one per spec with gold responses) in the RL stream format, replayed
    ``replay_specs`` specs at a time (the same trajectories as one batch over all of them)."""
    usable = [(s, gold_targets(s, fmt)) for s in specs]
    usable = [(s, g) for s, g in usable if g is not None]
    if len(usable) < len(specs):
        logger.warning(
            "SFT: %d of %d specs have no recorded gold responses and are skipped", len(specs) - len(usable), len(specs)
        )
    if not usable:
        return []
    longest = max((len(x) for _, g in usable for outs in g.values() for x in outs), default=1)
    steps = max((len(s.gold[t]) for s, _ in usable for t in range(len(s.gold))), default=0) + 1
    forced = replace(
        rollout,
        samples_per_prompt=1,
        max_act_tokens=longest,
        max_rehearse_tokens=longest,
        max_steps_per_turn=max(steps, rollout.max_steps_per_turn),
        max_stream_tokens=1 << 30,
    )
    # replay: each gold output is fed in one forward (its log-probs are not needed for the NLL)
    guide = gold_guide({i: s for i, (s, _) in enumerate(usable)}, fmt, replay=True)
    runner = RolloutRunner(fmt, forced, prompts, guide=guide, precision=precision)
    trajectories: list[Trajectory] = []
    # a few specs at a time: every stream's KV cache grows with each turn until its episode ends (all 16 of
    # the cpu profile's SmolLM2 tasks at once held ~3.8 GB of caches). Each spec keeps its index as its name,
    # so guide lookups and seeds are those of one batch over all specs
    for start in range(0, len(usable), max(1, replay_specs)):
        part = usable[start : start + max(1, replay_specs)]
        names = range(start, start + len(part))
        batch = runner.run([s for s, _ in part], model, ResponseSource(model=model), examples=names)
        trajectories.extend(batch.trajectories)
    good = [t for t in trajectories if t.termination is Termination.FINAL_REPLY]
    if len(good) < len(trajectories):
        logger.warning(
            "SFT: %d gold trajectories did not replay to a final reply (dropped)", len(trajectories) - len(good)
        )
    return good


def sft_rows(trajectories: Sequence[Trajectory], roles: Sequence[Role]) -> list[TrainRow]:
    n_outputs = sum(len(t.outputs()) for t in trajectories)
    return build_rows(trajectories, [1.0] * n_outputs, frozenset(roles), {r: 1.0 for r in Role})


def sft_epoch(
    model: Any,
    optimizer: torch.optim.Optimizer,
    rows: Sequence[TrainRow],
    cfg: SFTConfig,
    *,
    epoch: int,
    seed: int,
    pad_id: int,
    device: Any = "cpu",
    optim: OptimConfig | None = None,
    precision: str = "fp32",
    total_steps: int = 0,
) -> dict[str, float]:
    """One pass of NLL on target tokens over shuffled batches; returns mean losses (all and per role).

    With ``total_steps`` > 0 (the whole warm-up's optimiser steps) each step's learning rate is
    ``cfg.lr_at(global step, total_steps)``, the global step counted from ``epoch`` x steps per epoch;
    with 0 the optimiser's own learning rate is left alone.

    A batch of ``cfg.batch_streams`` rows (``sft_batches``) is one optimiser step; with ``optim.share_prefix``
    (default) its rows are packed behind shared prefixes and split into token-budgeted micro-batches whose
    gradients accumulate (the same packed forward as the RL update; ``precision`` resolved).
    """
    optim = optim or OptimConfig()
    plan = sft_batches(rows, cfg, derive_seed(seed, "sft", epoch))
    model.train()
    sums = {"loss": 0.0, **{f"loss/{r.name.lower()}": 0.0 for r in Role}}
    counts = {k: 0 for k in sums}
    updater = PolicyUpdater(Slot("sft", model, frozenset(Role), optimizer), optim, seed, pad_id, device, precision)
    step = epoch * len(plan)
    try:
        for batch_index in plan:
            chosen = [rows[i] for i in batch_index]
            if total_steps > 0:
                for group in optimizer.param_groups:
                    group["lr"] = cfg.lr_at(step, total_steps)
            step += 1
            n = max(1, sum(r.n_tokens for r in chosen))
            optimizer.zero_grad(set_to_none=True)
            with flat_gradients(model):
                for batch in updater.batches(chosen):
                    logp = updater.grad_logprobs(batch)
                    (-(logp * batch.mask).sum() / n).backward()
                    _add_losses(sums, counts, logp.detach(), batch)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            trim_heap()  # hand back what this step's micro-batches freed (as after each RL update)
        optimizer.zero_grad(set_to_none=True)  # no gradients held between epochs (or into RL)
    finally:
        set_checkpointing(model, False)
        model.eval()
    return {f"sft/{k}": sums[k] / counts[k] for k in sums if counts[k]}


PREFIX_KEY_TOKENS = 256  # streams opening with the same this-many tokens share a batch under batching="prefix"


def sft_batches(rows: Sequence[TrainRow], cfg: SFTConfig, seed: int) -> list[list[int]]:
    """One epoch's optimiser steps as row indices (``cfg.batch_streams`` rows each, the last maybe fewer).

    ``shuffled``: the shuffled rows in order. ``prefix``: the shuffled rows grouped by their first
    ``PREFIX_KEY_TOKENS`` tokens, each group cut into full batches; the groups' remainders, in shuffled
    order, fill the last batches; then the batches are shuffled. The number of batches depends on the rows
    only, never on the seed (so the whole warm-up's step count is known before it starts).
    """
    size = max(1, cfg.batch_streams)
    rng = random.Random(seed)
    order = list(range(len(rows)))
    rng.shuffle(order)
    if cfg.batching == "shuffled":
        return [order[i : i + size] for i in range(0, len(order), size)]
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in order:
        groups.setdefault(tuple(rows[i].input_ids[:PREFIX_KEY_TOKENS].tolist()), []).append(i)
    batches, rest = [], []
    for members in groups.values():
        full = len(members) - len(members) % size
        batches.extend(members[j : j + size] for j in range(0, full, size))
        rest.extend(members[full:])
    place = {row: k for k, row in enumerate(order)}
    rest.sort(key=place.__getitem__)
    batches.extend(rest[j : j + size] for j in range(0, len(rest), size))
    rng.shuffle(batches)
    return batches


def steps_per_epoch(rows: Sequence[TrainRow], cfg: SFTConfig) -> int:
    return len(sft_batches(rows, cfg, 0))


def _add_losses(sums: dict[str, float], counts: dict[str, int], logp: torch.Tensor, batch: Any) -> None:
    sums["loss"] += float(-(logp * batch.mask).sum())
    counts["loss"] += int(batch.mask.sum())
    for role in Role:
        m = batch.mask & (batch.values["roles"] == int(role))
        if bool(m.any()):
            sums[f"loss/{role.name.lower()}"] += float(-(logp * m).sum())
            counts[f"loss/{role.name.lower()}"] += int(m.sum())


def warm_up(
    models: Mapping[str, torch.nn.Module],
    formatter: ChatFormatter,
    specs: Sequence[EpisodeSpec],
    cfg: LocalEngineConfig,
    *,
    role_prompts: Any,
    precision: str,
    pad_id: int,
    checkpoints: RunCheckpoints,
    callbacks: Sequence[StepCallback] = (),
) -> list[dict]:
    """The SFT warm-up of ``models`` (see the module docstring); returns its metrics history, one row per
    epoch and model (keys suffixed ``/<name>`` for a model other than ``policy``), and calls ``callbacks``
    with (epoch, row)."""
    if cfg.sft.epochs <= 0:
        return []
    policy = models.get("policy", models.get("act"))
    specs, n_flawed = plant_answer_flaw(specs, cfg.sft)
    if n_flawed:
        logger.info("SFT: planted flaw in %d of %d specs (%s)", n_flawed, len(specs), ", ".join(cfg.sft.flaw_domains))
    trajs = gold_trajectories(specs, policy, formatter, cfg.rollout, role_prompts, precision=precision)
    # the replay's bf16 decoding copy and freed KV caches would otherwise sit under every epoch's peak; the
    # first optimiser step makes the copy stale anyway, and a later rollout re-casts the same values
    release_inference_copy(policy)
    trim_heap()
    ckpt = checkpoints.resume_sft(models)  # after the gold replay, which an uninterrupted run also does first
    history = ckpt.history() if ckpt else []
    for index, (name, model) in enumerate(models.items()):
        roles = cfg.sft.roles if name == "policy" else [r for r in cfg.sft.roles if r.name.lower() == name]
        rows = sft_rows(trajs, roles)
        first = sft_start_epoch(ckpt, index, cfg.sft.epochs)
        if not rows or first >= cfg.sft.epochs:
            continue
        opt = make_optimizer(model, cfg.optim, lr=cfg.sft.lr)
        total_steps = cfg.sft.epochs * steps_per_epoch(rows, cfg.sft)  # the whole warm-up's, for the schedule
        if ckpt is not None and first > 0:
            opt.load_state_dict(ckpt.optimizer_state(name))
        for epoch in tqdm(
            range(first, cfg.sft.epochs),
            desc=f"sft[{name}]",
            disable=not cfg.progress,
            initial=first,
            total=cfg.sft.epochs,
        ):
            metrics = sft_epoch(
                model,
                opt,
                rows,
                cfg.sft,
                epoch=epoch,
                seed=derive_seed(cfg.seed, name),
                pad_id=pad_id,
                device=cfg.device,
                optim=cfg.optim,
                precision=precision,
                total_steps=total_steps,
            )
            metrics = {
                **metrics,
                "sft/epoch": float(epoch),
                "sft/gold_trajectories": float(len(trajs)),
                "sft/flawed_specs": float(n_flawed),
                "sft/lr_last": float(opt.param_groups[0]["lr"]),
            }
            metrics = {k if name == "policy" else f"{k}/{name}": v for k, v in metrics.items()}
            history.append(metrics)
            checkpoints.save_sft(index, name, epoch, models, opt, history)
            for cb in callbacks:
                cb(epoch, metrics)
    return history
