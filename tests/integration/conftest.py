"""Shared set-up of the local-engine integration tests."""

from __future__ import annotations

from typing import Any

import pytest

from envace.core.prompts import ChatFormatter
from envace.core.records import Role
from envace.data.specs import episode_spec_from_task
from envace.engines.local.sft import gold_guide
from envace.envs.toolworld import ToolWorldEnv
from envace.models import ModelSpec, load_model_and_tokenizer

TINY = ModelSpec(kind="tiny", seed=3)


@pytest.fixture(scope="module")
def guided_world() -> dict[str, Any]:
    """Four one-call training tasks of the tool world, their episode specs and a gold decode guide
    for the tiny model (fresh per test module: specs hold executors)."""
    env = ToolWorldEnv()
    tasks = [t for t in env.tasks("train") if len(t.user_turns) == 1 and len(t.gold_calls[0]) == 1][:4]
    specs = [episode_spec_from_task(t, env.make_executor(t)) for t in tasks]
    _, tokenizer = load_model_and_tokenizer(TINY)
    guide = gold_guide(dict(enumerate(specs)), ChatFormatter(tokenizer), strength={Role.ACT: 12.0, Role.REHEARSE: 7.0})
    return {"env": env, "tasks": tasks, "specs": specs, "guide": guide}
