"""One default per key, living in ``conf/``: a default the schema dataclasses declare is the value the
default composition's group file (or conf/config.yaml's own section) sets, so reading either never
disagrees. The verl-only engine options are null in the schema: null means their value in
conf/engine/verl.yaml."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from envace.config.load import CONF_DIR, flatten, to_plain
from envace.config.schema import Config, EngineConfig

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


def schema_values(section: str) -> dict[str, Any]:
    node = OmegaConf.structured(Config)[section]
    return flatten(OmegaConf.to_container(node, resolve=False, throw_on_missing=False))


def test_schema_defaults_equal_the_default_group_files() -> None:
    disagree = {}
    for section in default_options():
        schema = schema_values(section)
        for key, value in file_values(section).items():
            declared = schema.get(key, "???")
            if declared != "???" and not str(value).startswith("${") and to_plain(declared) != to_plain(value):
                disagree[f"{section}.{key}"] = (declared, value)
    assert not disagree, f"schema default != conf value: {disagree}"


def test_verl_only_engine_options_default_to_null_and_verl_yaml_sets_them() -> None:
    schema = EngineConfig()
    verl = OmegaConf.load(CONF_DIR / "engine" / "verl.yaml")
    for name in VERL_ONLY:
        assert getattr(schema, name) is None, name
        assert name in verl, name
