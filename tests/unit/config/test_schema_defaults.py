"""One home per default, ``conf/``: the schema dataclasses hold the types, and a key that conf/ sets has no
value in the schema (MISSING). The verl-only engine options are null in the schema: null means their value
in conf/engine/verl.yaml."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from envace.config.load import CONF_DIR, flatten, to_plain
from envace.config.schema import Config, EngineConfig
from envace.core.rehearsal import RehearsalConfig
from envace.engines.local.config import OptimConfig, RolloutConfig

VERL_ONLY = (
    "rollout_name",
    "tensor_parallel",
    "gpu_memory_utilization",
    "max_token_len_per_gpu",
    "agent_workers",
    "chat_template",
    "val_every",
)


def default_options() -> dict[str, str]:
    """group -> the option conf/config.yaml's defaults list selects (``profile`` and ``experiment`` excluded:
    they override the groups)."""
    options: dict[str, str] = {}
    for entry in OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"))["defaults"]:
        if isinstance(entry, dict):
            ((group, option),) = entry.items()
            if option is not None and group not in ("profile", "experiment"):
                options[group] = option
    return options


def file_values(section: str) -> dict[str, Any]:
    """The leaves the default composition's files set for ``section`` (its group file, then config.yaml)."""
    root = OmegaConf.load(CONF_DIR / "config.yaml")
    option = default_options().get(section)
    node = OmegaConf.load(CONF_DIR / section / f"{option}.yaml") if option else OmegaConf.create({})
    if section in root:
        node = OmegaConf.merge(node, root[section])
    return flatten(OmegaConf.to_container(node, resolve=False))


def schema_values(section: str | None = None) -> dict[str, Any]:
    node = OmegaConf.structured(Config)
    node = node[section] if section else node
    return flatten(OmegaConf.to_container(node, resolve=False, throw_on_missing=False))


def test_the_schema_declares_no_value_that_conf_sets() -> None:
    """A key the default composition's files set is MISSING in the schema: its value has one home."""
    declared = {}
    for section in default_options():
        schema = schema_values(section)
        declared |= {f"{section}.{k}": schema[k] for k in file_values(section) if schema.get(k, "???") != "???"}
    assert not declared, f"schema values for keys that conf/ sets: {declared}"


def test_the_schemas_only_defaults_mean_not_set() -> None:
    """What the schema does default is "not set" (null, an empty list or mapping), never a value."""
    values = {k: v for k, v in schema_values().items() if v != "???" and v not in (None, [], {})}
    assert not values, f"schema defaults that are values (move them to conf/): {values}"


def test_verl_only_engine_options_default_to_null_and_verl_yaml_sets_them() -> None:
    schema = EngineConfig()
    verl = OmegaConf.load(CONF_DIR / "engine" / "verl.yaml")
    for name in VERL_ONLY:
        assert getattr(schema, name) is None, name
        assert name in verl, name


def test_the_runtime_configs_defaults_follow_conf() -> None:
    """``RehearsalConfig``, ``RolloutConfig`` and ``OptimConfig`` keep defaults for code that builds them directly
    (tests, scripts); the pipeline passes every value conf/ holds (``rehearsal_config``, the train stage's
    ``local_engine_config``). Where a field has a conf key, its default is that key's value in the default
    group file, so that constructing one by hand runs what the pipeline runs."""
    groups = {
        RehearsalConfig: [("rehearsal", "default")],
        RolloutConfig: [("rollout", "default")],
        OptimConfig: [("algo", "envace"), ("engine", "local")],
    }
    disagree = {}
    for kind, files in groups.items():
        defaults = to_plain(kind())
        for group, option in files:
            values = to_plain(OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{option}.yaml")))
            for key in defaults.keys() & values.keys():
                if defaults[key] != values[key]:
                    disagree[f"{kind.__name__}.{key}"] = (defaults[key], f"conf/{group}/{option}.yaml: {values[key]}")
    assert not disagree, disagree
