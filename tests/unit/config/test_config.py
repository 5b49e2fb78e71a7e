"""Config composition and validation: every group option and experiment file composes; bad keys,
bad types and bad enumerated values fail naming the key; params.yaml matches conf/."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from envace.config.enums import AlgoName, Benchmark, JudgeName
from envace.config.load import (
    RENAMED_KEYS,
    ConfigError,
    compose,
    flatten,
    group_options,
    group_switch,
    load_params,
    to_plain,
    write_params,
)
from envace.config.schema import GROUPS, SuitesConfig

CONF = Path(__file__).resolve().parents[3] / "conf"
OPTIONS = sorted((p.parent.name, p.stem) for p in CONF.glob("*/*.yaml"))


def test_every_group_has_options_and_the_groups_match_the_schema():
    on_disk = {p.name for p in CONF.iterdir() if p.is_dir()}
    assert on_disk == set(GROUPS)
    assert {group for group, _ in OPTIONS} == set(GROUPS)


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_group_option_composes(group, option):
    cfg = compose([f"{group}={option}"])
    if group in ("model", "algo", "engine", "judge", "tracking", "data"):
        # the option's own values survive (profiles may not override the selected group's identity)
        on_disk = yaml.safe_load((CONF / group / f"{option}.yaml").read_text())
        key = {
            "model": "name",
            "algo": "name",
            "engine": "name",
            "judge": "name",
            "tracking": "backend",
            "data": "source",
        }[group]
        assert to_plain(cfg[group][key]) == on_disk[key]
    if group == "profile":
        assert to_plain(cfg.profile) == option
    if group == "experiment":
        assert cfg.experiment_name == option


def test_default_is_the_cpu_profile_with_smollm2_on_the_tool_world():
    cfg = compose()
    assert to_plain(cfg.profile) == "cpu"
    assert to_plain(cfg.model.kind) == "smollm2"
    assert to_plain(cfg.data.source) == "toolworld"
    assert to_plain(cfg.engine.name) == "local"
    assert cfg.train.sft_epochs > 0 and 5 <= cfg.train.steps <= 60  # sized to finish in < 1 h on 2 cores
    # a result with intervals: the trained model vs its SFT'd start on >= 30 test tasks, a sweep on >= 10
    assert cfg.data.n_test >= 30 and to_plain(cfg.eval.baseline) in ("auto", "sft")
    assert cfg.rehearsal.n_tasks >= 10 and list(cfg.rehearsal.n_attempts_grid) == [0, 1, 2]


def test_profiles_set_model_and_sizes():
    smoke, paper = compose(["profile=smoke"]), compose(["profile=paper"])
    assert to_plain(smoke.model.kind) == "tiny" and smoke.train.steps <= 5 and smoke.data.n_train <= 10
    assert to_plain(paper.model.kind) == "path" and "Qwen3-8B" in paper.model.path
    assert to_plain(paper.engine.name) == "verl" and to_plain(paper.data.source) == "cm2"
    assert paper.train.steps == 470 and paper.algo.lr == pytest.approx(1e-6)


def test_profiles_set_the_training_time_fidelity_probe():
    smoke, cpu, paper = (compose([f"profile={p}"]) for p in ("smoke", "cpu", "paper"))
    assert (smoke.train.fidelity_every, smoke.train.fidelity_tasks) == (1, 1)
    assert (cpu.train.fidelity_every, cpu.train.fidelity_tasks) == (4, 2)
    assert paper.train.fidelity_every == 0  # verl on CM2: no in-training probe (evaluate measures fidelity)


def test_experiment_rows_select_the_paper_recipe_and_their_row():
    row = compose(["experiment=main_envace-1.7b"])
    assert to_plain(row.profile) == "paper" and "Qwen3-1.7B" in row.model.path
    ablation = compose(["experiment=ablation_grpo"])
    assert to_plain(ablation.algo.name) == "grpo" and "Qwen3-8B" in ablation.model.path
    base = compose(["experiment=main_qwen3-8b"])
    assert base.train.steps == 0
    testtime = compose(["experiment=testtime_sequential_base"])
    assert to_plain(testtime.rehearsal.modes) == ["sequential"] and to_plain(testtime.rehearsal.rehearsers) == ["base"]
    # command-line choices still win over the experiment's
    assert to_plain(compose(["experiment=ablation_grpo", "model=tiny"]).model.kind) == "tiny"
    assert compose(["experiment=ablation_grpo", "profile=smoke"]).train.steps <= 5


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("algo.name=bogus", ["algo.name", "envace", "grpo", "per_role", "frozen_act", "frozen_rehearse"]),
        ("algo.lr=abc", ["algo.lr", "abc"]),
        ("rollout.samples_per_prompt=many", ["rollout.samples_per_prompt"]),
        ("+algo.foo=1", ["algo.foo"]),
        ("+bogus_key=1", ["bogus_key"]),
        ("eval.benchmarks=[toolworld,nope]", ["eval.benchmarks", "nope", "toolworld"]),
        ("algo=nope", ["algo/nope", "envace", "grpo"]),
        ("model.kind=path", ["model.path"]),
        ("eval.suites.bfcl.splitt=x", ["eval.suites.bfcl.splitt"]),
        ("eval.suites.nope.split=x", ["eval.suites.nope"]),
        ("train.fidelity_every=-1", ["train.fidelity_every"]),
        ("train.fidelity_tasks=0", ["train.fidelity_tasks"]),
        ("judge.argument_credit=1.0", ["judge.argument_credit=1.0", "[0, 1)"]),
    ],
)
def test_bad_values_fail_naming_the_key(override, expected):
    with pytest.raises(ConfigError) as err:
        compose([override])
    for text in expected:
        assert text in str(err.value)


def test_argument_credit_belongs_to_the_verifiable_reward():
    assert compose(["judge.argument_credit=0.5"]).judge.argument_credit == 0.5
    with pytest.raises(ConfigError, match=r"judge.argument_credit=0.5 .* not of judge=rule; set judge=verifiable"):
        compose(["judge=rule", "judge.argument_credit=0.5"])


def copy_conf(tmp_path: Path) -> Path:
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    return conf


def test_a_wrong_key_in_a_group_file_fails_at_start(tmp_path):
    conf = copy_conf(tmp_path)
    path = conf / "algo" / "envace.yaml"
    path.write_text(path.read_text().replace("clip_ratio:", "clip_ration:"))
    with pytest.raises(ConfigError, match=r"clip_ration"):
        compose([], conf_dir=conf)


def test_a_wrong_typed_value_in_a_group_file_fails_naming_it(tmp_path):
    conf = copy_conf(tmp_path)
    path = conf / "rollout" / "default.yaml"
    path.write_text(path.read_text().replace("prompts_per_step: 2", "prompts_per_step: two"))
    with pytest.raises(ConfigError, match=r"prompts_per_step"):
        compose(["profile=smoke"], conf_dir=conf)


def test_enumerated_names_match_the_registries():
    from envace.engines import VARIANTS
    from envace.evaluation import benchmark_names
    from envace.judges import judge_names

    assert {a.value for a in AlgoName} == set(VARIANTS)
    assert {b.value for b in Benchmark} <= set(benchmark_names())
    from envace.stages.suites import BENCHMARK_KWARGS

    assert set(SuitesConfig.__dataclass_fields__) == {b.value for b in Benchmark} == set(BENCHMARK_KWARGS)
    assert {j.value for j in JudgeName} - {"verifiable"} <= set(judge_names())


def _keys(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{prefix}{key}"
            yield from _keys(value, f"{prefix}{key}.")


@pytest.mark.parametrize("profile", ["smoke", "cpu", "paper"])
def test_no_yaml_11_boolean_keys(profile):
    """`N`, `y`, `no`… are booleans to YAML 1.1 readers (DVC's params parser among them)."""
    booleans = {"n", "y", "no", "yes", "on", "off", "true", "false"}
    plain = to_plain(compose([f"profile={profile}"]))
    assert not [k for k in _keys(plain) if k.rsplit(".", 1)[-1].lower() in booleans]


def _main_profile(repo_root: Path) -> str:
    """The Makefile's default PROFILE (the main job's profile)."""
    found = re.search(r"^PROFILE \?= (\S+)$", (repo_root / "Makefile").read_text(), re.MULTILINE)
    assert found, "Makefile: no `PROFILE ?= <profile>` line"
    return found.group(1)


def test_committed_params_yaml_is_the_main_profile_composition(tmp_path, repo_root):
    """`dvc repro` reads params.yaml: it must equal what `make params` writes from conf/ for the main job's
    profile (the Makefile's PROFILE), so a plain `dvc repro` runs what `make pipeline` runs."""
    profile = _main_profile(repo_root)
    assert profile in group_options("profile", repo_root / "conf")
    fresh = write_params([f"profile={profile}"], root=tmp_path, conf_dir=repo_root / "conf")
    assert fresh.read_text() == (repo_root / "params.yaml").read_text(), "run `make params` and commit params.yaml"


def test_dvc_composes_conf_in_a_fresh_interpreter(tmp_path, repo_root):
    """`dvc exp run -S` composes in DVC's own process: the schema must reach it via hydra_plugins/."""
    script = (
        "import sys; from dvc.utils.hydra import compose_and_dump\n"
        f"compose_and_dump({str(tmp_path / 'p.yaml')!r}, {str(repo_root / 'conf')!r}, None, 'config', "
        f"{str(repo_root)!r}, ['profile=smoke', 'algo=grpo'])\n"
        "assert 'envace.config.load' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=tmp_path, check=True, timeout=120)
    params = yaml.safe_load((tmp_path / "p.yaml").read_text())
    assert params["profile"] == "smoke" and params["algo"]["name"] == "grpo"


def test_load_params_applies_dotlist_overrides_and_refuses_group_selections(tmp_path):
    params = write_params(["profile=smoke"], root=tmp_path, conf_dir=CONF)
    cfg = load_params(params, ["train.steps=7", "algo.lr=0.5"])
    assert cfg.train.steps == 7 and cfg.algo.lr == 0.5
    with pytest.raises(ConfigError, match="train.steps"):
        load_params(params, ["train.steps=many"])
    with pytest.raises(ConfigError, match="dvc exp run -S profile=cpu"):
        load_params(params, ["profile=cpu"])
    with pytest.raises(ConfigError, match="make params"):
        load_params(tmp_path / "missing.yaml")


def test_flatten_gives_plain_dotted_params():
    flat = flatten(compose(["profile=smoke"]))
    assert flat["algo.name"] == "envace" and flat["rollout.samples_per_prompt"] == 2
    assert flat["rehearsal.n_attempts_grid"] == [0, 1, 2, 3]
    assert all(not OmegaConf.is_config(v) for v in flat.values())


def test_group_switch_gives_the_differing_keys_of_two_options():
    assert group_switch("algo", "grpo", "envace") == ["algo.name=grpo", "algo.baseline=trajectory_mean"]
    assert group_switch("algo", "envace", "envace") == []
    with pytest.raises(ConfigError, match=r"no option 'gpro'.*valid: \['envace'"):
        group_switch("algo", "gpro", "envace")
    # the frozen-simulator arm is an algo option of its own: the engine's variant grpo, simulator responses
    assert group_switch("algo", "grpo_simulator", "envace") == [
        "algo.name=grpo",
        "algo.baseline=trajectory_mean",
        "algo.grpo_responses=simulator",
    ]


def test_science_variants_are_algo_options():
    cfg = compose(["profile=organism", "science.variants=[envace,grpo,grpo_simulator]"])
    assert list(cfg.science.variants) == ["envace", "grpo", "grpo_simulator"]
    with pytest.raises(ConfigError, match=r"science.variants has \['grpo_sim'\].*grpo_simulator"):
        compose(["science.variants=[envace,grpo_sim]"])
    with pytest.raises(ConfigError, match="science.testtime_variant=per_role is not in science.variants"):
        compose(["science.variants=[envace,grpo]", "science.testtime_variant=per_role"])


@pytest.mark.parametrize("old", sorted(RENAMED_KEYS))
def test_a_renamed_key_fails_naming_its_new_name(old):
    with pytest.raises(ConfigError, match=rf"{re.escape(old)} is now {re.escape(RENAMED_KEYS[old])}"):
        compose([f"{old}=[0,2]"])
