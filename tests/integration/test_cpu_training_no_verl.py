"""CPU training runs free of verl: the CPU stages and a local-engine training step never import verl or Ray.

verl (and Ray under it) is the GPU engine's dependency only (``envace/engines/verl/``); importing it costs
seconds and prints a handful of warnings. Each check runs in a fresh interpreter so that modules other
tests imported cannot hide a leak, and reports what it found as the last line of its stdout.
"""

from __future__ import annotations

from fresh_python import run_fresh

GPU_STACK = ("verl", "ray")

_REPORT = """
import json, sys
print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {stack!r})))
"""

_IMPORT_STAGES = """
import envace.stages.train, envace.stages.prepare_data, envace.stages.evaluate
import envace.stages.rehearsal_sweep, envace.stages.report, envace.stages.template_prompts
"""

# One update of the tiny model on one tool-world task: two guided samples with different rewards, so
# the advantages are non-zero and the clipped policy loss (with a KL term) runs forward and backward.
_TRAIN_ONE_STEP = """
import torch
torch.set_num_threads(1)
from envace.core.prompts import ChatFormatter
from envace.core.records import Role, TrajectoryStatus
from envace.core.reward import RewardOutcome
from envace.data.specs import episode_spec_from_task, executor_factory_for
from envace.engines import get_engine
from envace.engines.local import LocalEngineConfig, OptimConfig, RolloutConfig
from envace.engines.local.sft import gold_guide
from envace.envs.toolworld import ToolWorldEnv
from envace.models import ModelSpec, load_model_and_tokenizer

tiny = ModelSpec(kind="tiny", seed=3)
env = ToolWorldEnv()
tasks = [t for t in env.tasks("train") if len(t.user_turns) == 1 and len(t.gold_calls[0]) == 1][:1]
specs = [episode_spec_from_task(t, env.make_executor(t)) for t in tasks]
_, tokenizer = load_model_and_tokenizer(tiny)
guide = gold_guide(dict(enumerate(specs)), ChatFormatter(tokenizer), strength={Role.ACT: 12.0, Role.REHEARSE: 7.0})
engine = get_engine(
    "local",
    reward_fn=lambda spec, traj: RewardOutcome(float(traj.sample_index), TrajectoryStatus.OK, {}),
    guide=guide,
    executor_factory=executor_factory_for(env.make_executor, tasks),
)
config = LocalEngineConfig(
    model=tiny, steps=1, prompts_per_step=1, seed=5, progress=False,
    rollout=RolloutConfig(samples_per_prompt=2, max_act_tokens=48, max_rehearse_tokens=48, max_stream_tokens=2048),
    optim=OptimConfig(lr=1e-3, kl_coef=0.01),
)
history = []
engine.train(config, specs, callbacks=[lambda step, m: history.append(m)])
assert history and history[-1]["tokens_in_loss/act"] > 0, history
"""


def _run(body: str) -> tuple[list[str], str]:
    """Run ``body`` in a fresh interpreter; return the verl/Ray modules it loaded and its stderr."""
    return run_fresh(body + _REPORT.format(stack=GPU_STACK), timeout=300)


def test_cpu_stages_import_neither_verl_nor_ray() -> None:
    loaded, _ = _run(_IMPORT_STAGES)
    assert loaded == [], f"importing the CPU stages loaded {loaded}"


def test_local_training_step_imports_neither_verl_nor_ray() -> None:
    loaded, stderr = _run(_TRAIN_ONE_STEP)
    assert loaded == [], f"one local-engine training step loaded {loaded[:10]} ({len(loaded)} modules)"
    assert "verl" not in stderr and "accelerator" not in stderr, f"verl printed warnings:\n{stderr[-3000:]}"
