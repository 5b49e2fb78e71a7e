"""τ²-Bench full sets (marker ``slow``): the solo oracle on all 114 telecom base tasks, and the
LLM-free scripted customer with the oracle on every airline and retail base task (plumbing check of the
real executors and tau2's evaluator; not a τ² score)."""

from __future__ import annotations

import pytest

from envace.envs.tau2 import Tau2Adapter, Tau2Oracle, run_tau2

pytestmark = pytest.mark.slow


def test_solo_oracle_on_all_telecom_base_tasks() -> None:
    adapter = Tau2Adapter()
    tasks = adapter.tasks("telecom")
    report = run_tau2(Tau2Oracle(tasks), "telecom", adapter=adapter, progress=False)
    row = report.domains["telecom:base"]
    assert row["n_tasks"] == len(tasks) == 114 and row["avg_reward"] == 1.0 and row["pass^1"] == 1.0


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_scripted_customer_oracle_on_all_base_tasks(domain: str) -> None:
    adapter = Tau2Adapter(mode="scripted_user")
    tasks = adapter.tasks(domain)
    report = run_tau2(Tau2Oracle(tasks), domain, adapter=adapter, progress=False)
    assert report.domains[f"{domain}:base"]["avg_reward"] == 1.0
