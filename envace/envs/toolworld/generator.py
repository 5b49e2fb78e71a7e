"""Seeded generation of tool-world tasks and their train / val / test splits.

A task is one domain, a fresh random initial state and a *recipe*: 1–3 scenarios, one per user turn
(a follow-up scenario such as "invite Ben to it" may only directly follow a turn that provides what
it refers to). The recipe is executed on a real executor (``gold.GoldRecorder``), which yields the
gold calls, responses, answers, expected final state and checklists.

Hold-outs, to measure transfer:
- **domain**: ``held_out_domain`` (default ``todo``) appears only in test, tagged
  ``meta["held_out"] = "domain"``.
- **compositions**: a composition is a set of tools written ``"a+b"`` (sorted). A task *contains* it
  when its gold calls use all of those tools. No train task contains a held-out composition; val and
  test include tasks that do (``meta["held_out"] = "composition"``, ``meta["held_out_composition"]``).
  ``meta["composition"]`` is the full sorted tool set of a task.

Determinism: every random draw comes from ``random.Random(zlib.crc32(key))`` with keys built from
(seed, split, task index, attempt) — never ``hash()``. Splits are generated test → val → train and
no task (domain, user turns, initial state) appears twice anywhere, so the test set does not change
when ``n_train`` does.

Disjoint splits: a train draw whose instruction (its user turns, word for word) or gold-call sequence
(names and arguments of every gold call in order, call ids aside) equals that of a val or test task is
rejected and redrawn with the next attempt, as is a draw that repeats a task. So no val/test task
shares an instruction or a gold-call sequence with a train task, every split keeps its requested
size, and val/test stay exactly what they would be without the check. The number of rejected train
draws is logged; ``split_overlaps`` counts what is shared (all zeros for generated splits).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import random
import zlib
from dataclasses import dataclass
from typing import Any

from envace.core.env import Task
from envace.envs.toolworld.checklist import build_checklists
from envace.envs.toolworld.executor import ToolWorldExecutor
from envace.envs.toolworld.gold import GoldPlanError, GoldRecorder, RealizedTurn
from envace.envs.toolworld.planning import ScenarioInput
from envace.envs.toolworld.registry import DOMAINS, Domain, get_domain, get_tool

logger = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
DEFAULT_HELD_OUT_COMPOSITIONS = (
    "deposit+transfer",
    "add_attendee+reschedule_event",
    "place_order+search_products",
    "move_file+read_file",
)
MAX_ATTEMPTS = 64
_CONTINUATIONS = ("Also, ", "One more thing: ", "Next, ", "Thanks! Now ")


@dataclass(frozen=True)
class ToolWorldConfig:
    """Sizes, seed and hold-out settings of the generated benchmark."""

    seed: int = 0
    n_train: int = 300
    n_val: int = 50
    n_test: int = 100
    max_turns: int = 3
    turn_weights: tuple[float, ...] = (0.5, 0.35, 0.15)  # probability of 1, 2, 3 user turns
    held_out_domain: str | None = "todo"
    held_out_compositions: tuple[str, ...] = DEFAULT_HELD_OUT_COMPOSITIONS
    val_composition_fraction: float = 0.3
    test_composition_fraction: float = 0.25
    test_domain_fraction: float = 0.25

    def __post_init__(self) -> None:
        if min(self.n_train, self.n_val, self.n_test) < 0:
            raise ValueError("ToolWorldConfig: split sizes must be >= 0")
        if len(self.turn_weights) != self.max_turns or self.max_turns < 1 or min(self.turn_weights) < 0:
            raise ValueError(
                f"ToolWorldConfig: turn_weights needs {self.max_turns} non-negative entries "
                f"(one per turn count 1..max_turns), got {self.turn_weights}"
            )
        if self.held_out_domain is not None:
            get_domain(self.held_out_domain)
        fractions = (self.val_composition_fraction, self.test_composition_fraction, self.test_domain_fraction)
        if not all(0.0 <= f <= 1.0 for f in fractions) or fractions[1] + fractions[2] > 1.0:
            raise ValueError("ToolWorldConfig: fractions must lie in [0, 1] and test fractions sum to <= 1")
        for composition in self.held_out_compositions:
            composition_domain(composition, self.held_out_domain)

    @property
    def train_domains(self) -> tuple[str, ...]:
        return tuple(d for d in DOMAINS if d != self.held_out_domain)


def composition_domain(composition: str, held_out_domain: str | None = None) -> str:
    """The one domain whose tools form ``composition``; raises a ValueError explaining the problem."""
    tools = composition.split("+")
    if len(tools) < 2 or composition != "+".join(sorted(set(tools))):
        raise ValueError(
            f"held-out composition {composition!r} must be >= 2 distinct tool names, sorted, joined by '+'"
        )
    domains = {get_tool(t).domain for t in tools}
    if len(domains) != 1 or domains == {held_out_domain}:
        raise ValueError(
            f"held-out composition {composition!r} must use tools of one non-held-out domain, got {domains}"
        )
    return domains.pop()


def contains(tools: frozenset[str] | set[str], composition: str) -> bool:
    return set(composition.split("+")) <= set(tools)


@functools.cache
def domain_recipes(domain: str, max_turns: int) -> tuple[tuple[str, ...], ...]:
    """Every valid scenario sequence of 1..max_turns turns (no scenario twice)."""
    scenarios = get_domain(domain).scenarios
    by_name = {s.name: s for s in scenarios}
    out: list[tuple[str, ...]] = []
    frontier = [(s.name,) for s in scenarios if s.requires is None]
    while frontier:
        out.extend(frontier)
        if len(frontier[0]) == max_turns:
            break
        frontier = [
            r + (s.name,)
            for r in frontier
            for s in scenarios
            if s.name not in r and (s.requires is None or s.requires in by_name[r[-1]].provides)
        ]
    return tuple(out)


def recipe_tools(domain: str, recipe: tuple[str, ...]) -> frozenset[str]:
    found = get_domain(domain)
    return frozenset(t for name in recipe for t in found.scenario(name).tools)


@functools.cache
def eligible_recipes(
    domain: str, max_turns: int, held_out: tuple[str, ...], target: str | None
) -> tuple[tuple[str, ...], ...]:
    """Recipes containing ``target`` (a held-out composition), or none of ``held_out`` when None."""
    recipes = domain_recipes(domain, max_turns)
    if target is not None:
        return tuple(r for r in recipes if contains(recipe_tools(domain, r), target))
    return tuple(r for r in recipes if not any(contains(recipe_tools(domain, r), c) for c in held_out))


@dataclass(frozen=True)
class TaskSlot:
    """What one task of a split must be: its domain and hold-out category."""

    domain: str
    held_out: str | None = None  # None, "composition" or "domain"
    composition: str | None = None


def _round_robin(items: tuple[str, ...], count: int) -> list[str]:
    return [items[i % len(items)] for i in range(count)] if items else []


def plan_slots(config: ToolWorldConfig, split: str) -> list[TaskSlot]:
    """The (shuffled, deterministic) list of slots of one split."""
    size = {"train": config.n_train, "val": config.n_val, "test": config.n_test}[split]
    comps = config.held_out_compositions
    comp_fraction = {"train": 0.0, "val": config.val_composition_fraction, "test": config.test_composition_fraction}
    n_domain = round(size * config.test_domain_fraction) if split == "test" and config.held_out_domain else 0
    n_comp = min(round(size * comp_fraction[split]), size - n_domain) if comps else 0
    slots = [TaskSlot(config.held_out_domain, "domain") for _ in range(n_domain)]  # type: ignore[arg-type]
    slots += [TaskSlot(composition_domain(c), "composition", c) for c in _round_robin(comps, n_comp)]
    slots += [TaskSlot(d) for d in _round_robin(config.train_domains, size - n_domain - n_comp)]
    random.Random(zlib.crc32(f"toolworld|{config.seed}|{split}|slots".encode())).shuffle(slots)
    return slots


def _choose_recipe(rng: random.Random, config: ToolWorldConfig, slot: TaskSlot) -> tuple[str, ...]:
    held_out = () if slot.held_out == "domain" else config.held_out_compositions
    recipes = eligible_recipes(slot.domain, config.max_turns, held_out, slot.composition)
    if not recipes:
        raise ValueError(f"no recipe of domain {slot.domain!r} fits {slot}; change held_out_compositions")
    lengths = sorted({len(r) for r in recipes})
    length = rng.choices(lengths, weights=[config.turn_weights[n - 1] + 1e-9 for n in lengths])[0]
    # scenario by scenario over the next scenarios that can still complete a recipe (so scenarios with
    # many follow-ups do not crowd out the others); follow-ups, when possible, get half the mass
    domain = get_domain(slot.domain)
    candidates = [r for r in recipes if len(r) == length]
    prefix: tuple[str, ...] = ()
    while len(prefix) < length:
        options = sorted({r[len(prefix)] for r in candidates})
        follow = [o for o in options if domain.scenario(o).requires is not None]
        fresh = len(options) - len(follow)
        weights = [fresh / len(follow) if o in follow and fresh else 1.0 for o in options]
        prefix += (rng.choices(options, weights=weights)[0],)
        candidates = [r for r in candidates if r[: len(prefix)] == prefix]
    return prefix


def _continuation(rng: random.Random, text: str) -> str:
    first_word = text.split(" ", 1)[0]
    keep = first_word == "I" or first_word.startswith("I'")
    return rng.choice(_CONTINUATIONS) + (text if keep else text[:1].lower() + text[1:])


Realized = tuple[dict[str, Any], list[RealizedTurn], dict[str, Any]]


def realize_recipe(rng: random.Random, domain: Domain, recipe: tuple[str, ...]) -> Realized | None:
    """Seed a state and execute the recipe: (initial state, realized turns, final state) or None when
    a scenario cannot be built on the drawn state."""
    executor = ToolWorldExecutor.from_state({domain.name: domain.seed_state(rng)}, domain.tool_names)
    initial = executor.state()
    recorder = GoldRecorder(executor)
    context: dict[str, Any] = {}
    turns: list[RealizedTurn] = []
    for turn, name in enumerate(recipe):
        scenario = domain.scenario(name)
        planned = scenario.build(ScenarioInput(rng, executor.state()[domain.name], context, turn, recorder.responses))
        if planned is None:
            return None
        if set(planned.provides) != set(scenario.provides):
            raise GoldPlanError(
                f"scenario {domain.name}/{name} declares provides={scenario.provides} but its "
                f"turn provides {sorted(planned.provides)}"
            )
        if turn > 0 and scenario.requires is None:
            planned = dataclasses.replace(planned, user=_continuation(rng, planned.user))
        turns.append(recorder.run_turn(planned))
        context = dict(planned.provides)
    return initial, turns, executor.state()


def system_prompt(domain: Domain) -> str:
    return (
        f"You are a helpful assistant for {domain.description}. Use the tools to do what the user asks, "
        "then reply briefly with the result."
    )


def _json_clean(value: Any) -> Any:
    """Tuples → lists etc., so a task's meta equals its own JSON round trip."""
    return json.loads(json.dumps(value))


def assemble_task(
    task_id: str, split: str, domain: Domain, recipe: tuple[str, ...], slot: TaskSlot, realized: Realized, seed: int
) -> Task:
    initial, turns, final = realized
    tools_used = sorted({c.name for t in turns for step in t.steps for c in step})
    meta = {
        "composition": "+".join(tools_used),
        "scenarios": list(recipe),
        "held_out": slot.held_out,
        "held_out_composition": slot.composition,
        "answer_values": [list(t.key_values) for t in turns],
        "answer_bindings": [list(t.answer_bindings) for t in turns],
        "bindings": {k: v for t in turns for k, v in t.bindings.items()},
        "expected_errors": {k: v for t in turns for k, v in t.expected_errors.items()},
        "steps_per_turn": [len(t.steps) for t in turns],
        "seed": seed,
    }
    return Task(
        task_id=task_id,
        domain=domain.name,
        split=split,
        system_prompt=system_prompt(domain),
        tools=tuple(spec.openai_schema() for spec in domain.tools),
        user_turns=tuple(t.user for t in turns),
        gold_calls=tuple(t.steps for t in turns),
        gold_answers=tuple(t.answer for t in turns),
        checklists=build_checklists(turns),
        initial_state=initial,
        expected_state=final,
        meta=_json_clean(meta),
    )


def _fingerprint(task: Task) -> str:
    return json.dumps([task.domain, task.user_turns, task.initial_state], sort_keys=True)


def instruction_key(task: Task) -> str:
    """A task's instruction: its user turns, word for word."""
    return json.dumps(list(task.user_turns))


def gold_calls_key(task: Task) -> str:
    """A task's gold-call sequence: per turn, per step, (name, arguments) of each call; ids left out."""
    return json.dumps(
        [[[[c.name, c.arguments] for c in step] for step in turn] for turn in task.gold_calls], sort_keys=True
    )


@dataclass
class _Reserved:
    """Instructions and gold-call sequences of val/test tasks, which train draws must not repeat."""

    instructions: set[str] = dataclasses.field(default_factory=set)
    gold_calls: set[str] = dataclasses.field(default_factory=set)
    rejected: int = 0

    def add(self, task: Task) -> None:
        self.instructions.add(instruction_key(task))
        self.gold_calls.add(gold_calls_key(task))

    def repeats(self, task: Task) -> bool:
        return instruction_key(task) in self.instructions or gold_calls_key(task) in self.gold_calls


def _make_task(
    config: ToolWorldConfig, split: str, index: int, slot: TaskSlot, seen: set[str], reserved: _Reserved | None = None
) -> Task:
    domain = get_domain(slot.domain)
    for attempt in range(MAX_ATTEMPTS):
        rng = random.Random(zlib.crc32(f"toolworld|{config.seed}|{split}|{index}|{attempt}".encode()))
        recipe = _choose_recipe(rng, config, slot)
        realized = realize_recipe(rng, domain, recipe)
        if realized is None:
            continue
        task = assemble_task(
            f"toolworld-s{config.seed}-{split}-{index:04d}", split, domain, recipe, slot, realized, config.seed
        )
        fingerprint = _fingerprint(task)
        if fingerprint in seen:
            continue
        if reserved is not None and reserved.repeats(task):
            reserved.rejected += 1
            continue
        seen.add(fingerprint)
        return task
    raise RuntimeError(
        f"toolworld: no new task for {split}[{index}] ({slot}) after {MAX_ATTEMPTS} attempts; "
        "lower the split sizes or add scenarios"
    )


def split_overlaps(splits: dict[str, list[Task]]) -> dict[str, dict[str, int]]:
    """Per split other than train: how many of its tasks repeat a train task's instruction, gold-call
    sequence, or either."""
    train = splits.get("train", [])
    instructions, gold = {instruction_key(t) for t in train}, {gold_calls_key(t) for t in train}
    out = {}
    for split, tasks in splits.items():
        if split == "train":
            continue
        same_text = [instruction_key(t) in instructions for t in tasks]
        same_calls = [gold_calls_key(t) in gold for t in tasks]
        out[split] = {
            "instruction": sum(same_text),
            "gold_calls": sum(same_calls),
            "either": sum(a or b for a, b in zip(same_text, same_calls)),
        }
    return out


def generate_tasks(config: ToolWorldConfig | None = None, **overrides: Any) -> dict[str, list[Task]]:
    """Generate every split: ``{"train": [...], "val": [...], "test": [...]}``.

    ``overrides`` replace config fields, e.g. ``generate_tasks(seed=3, n_train=50)``.
    """
    config = dataclasses.replace(config or ToolWorldConfig(), **overrides)
    seen: set[str] = set()
    reserved = _Reserved()
    out: dict[str, list[Task]] = {}
    for split in ("test", "val", "train"):
        avoid = reserved if split == "train" else None
        slots = plan_slots(config, split)
        out[split] = [_make_task(config, split, i, slot, seen, avoid) for i, slot in enumerate(slots)]
        if split != "train":
            for task in out[split]:
                reserved.add(task)
    logger.info(
        "toolworld: generated %s tasks (seed %d); %d train draws redrawn for repeating a val/test "
        "instruction or gold-call sequence",
        {s: len(out[s]) for s in SPLITS},
        config.seed,
        reserved.rejected,
    )
    return {split: out[split] for split in SPLITS}
