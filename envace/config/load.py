"""Loading a config: compose ``conf/`` (or read ``params.yaml``), check it, and turn it into what code takes.

``conf/config.yaml`` starts its defaults list with ``envace_schema`` — ``envace.config.schema.Config``,
registered in Hydra's ConfigStore when this module is imported — so every group file merges *into* a
typed, struct-mode node: an unknown key, a wrongly typed value or an enumerated value outside its set fails
at composition time with OmegaConf's message naming the full key (``full_key: algo.lr``) and, for enums,
the valid names (``envace.config.enums``). DVC composes ``conf/`` itself (``dvc exp run -S``); it finds
the schema through the ``hydra_plugins/envace_schemas`` package at the repo root, which imports this module.

Cross-field rules that a schema cannot express (``model.kind=path`` needs ``model.path``) live in
``validate_config``; a rule the runtime object already enforces is not repeated here — the rehearsal
grid is checked by building each cell's ``RehearsalConfig`` with ``rehearsal_config``, the one
conversion from the typed ``rehearsal`` section to the rehearsal code's config, and the rollout budget by building a
``RolloutBudget`` (``envace.core.rollout_budget``). ``typed_config`` turns a composed config into the
schema's ``Config`` dataclasses, what the engines' config builders, the rehearsal sweep and the evaluation
read (each stage converts once). Stages load ``params.yaml`` with
``load_params`` (same schema, same checks). Run ``python -m envace.config [OVERRIDES…]``
(``make params``) to regenerate ``params.yaml`` exactly as ``dvc exp run -S`` does.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from envace.config.enums import JudgeName, ModelKind
from envace.config.schema import GROUPS, Config, RehearsalSweepConfig
from envace.core.rehearsal import RehearsalConfig, RehearsalMode
from envace.core.rollout_budget import RolloutBudget, budget_values

logger = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
CONFIG_NAME = "config"
PARAMS_FILE = "params.yaml"
SCHEMA_NAME = "envace_schema"


class ConfigError(ValueError):
    """A configuration that composes but cannot run; the message names the key and the fix."""


def register_schemas() -> None:
    """Register ``Config`` in Hydra's ConfigStore (idempotent; called on import)."""
    ConfigStore.instance().store(name=SCHEMA_NAME, node=Config)


register_schemas()


# keys that were renamed: old dotted key -> new one (an old key still fails, and its message names the new one)
RENAMED_KEYS = {
    "rehearsal.n_attempts": "rehearsal.n_attempts_grid",
    "science.testtime_n_attempts": "science.testtime_n_attempts_grid",
    "science.testtime_other_seeds_n_attempts": "science.testtime_other_seeds_n_attempts_grid",
}


def _explain(exc: BaseException) -> str:
    """Hydra wraps OmegaConf's precise message (key, valid values) as the cause: show the whole chain, and name
    the new key where the failing key is one ``RENAMED_KEYS`` lists."""
    parts: list[str] = []
    while exc is not None:
        text = str(exc).strip()
        if text and text not in parts:
            parts.append(text)
        exc = exc.__cause__
    message = "\n".join(parts)
    renamed = [
        f"{old} is now {new}" for old, new in RENAMED_KEYS.items() if re.search(rf"\b{re.escape(old)}\b(?!_)", message)
    ]
    return "\n".join([message, *renamed])


def validate_config(cfg: DictConfig) -> DictConfig:
    """Re-check against the schema (keys added with Hydra's ``+`` bypass struct mode) and the rules
    the schema cannot express; raises ``ConfigError`` naming the key."""
    try:
        checked = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.to_container(cfg, enum_to_str=True))
        rehearsal = OmegaConf.to_object(checked.rehearsal)  # the typed section the sweep's cells are built from
    except OmegaConfBaseException as exc:
        raise ConfigError(f"config does not match the envace schema: {_explain(exc)}") from exc
    if cfg.model.kind == ModelKind.path and not cfg.model.path:
        raise ConfigError("model.kind=path needs model.path (a local HF checkpoint dir); set model.path=/dir")
    if cfg.train.steps < 0 or cfg.train.sft_epochs < 0:
        raise ConfigError(f"train.steps={cfg.train.steps}, train.sft_epochs={cfg.train.sft_epochs}: must be >= 0")
    if cfg.train.fidelity_every < 0 or (cfg.train.fidelity_every > 0 and cfg.train.fidelity_tasks < 1):
        raise ConfigError(
            f"train.fidelity_every={cfg.train.fidelity_every}, train.fidelity_tasks="
            f"{cfg.train.fidelity_tasks}: fidelity_every must be >= 0 (0 = off) and, when on, "
            "fidelity_tasks >= 1"
        )
    if cfg.algo.mini_batches < 1:
        raise ConfigError(f"algo.mini_batches={cfg.algo.mini_batches}: must be >= 1 (1 = one optimiser step per epoch)")
    if cfg.train.val_every < 0 or cfg.train.val_tasks < 0:
        raise ConfigError(
            f"train.val_every={cfg.train.val_every}, train.val_tasks={cfg.train.val_tasks}: both must be >= 0 "
            "(val_every 0 = off; val_tasks 0 = every validation task)"
        )
    try:
        RolloutBudget(**budget_values(cfg.rollout))  # the budget's range rules, stated once (its __post_init__)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    _check_rehearsal_grid(rehearsal, int(cfg.seed))
    if cfg.eval.benchmark not in list(cfg.eval.benchmarks):
        raise ConfigError(
            f"eval.benchmark={cfg.eval.benchmark.name} is not in eval.benchmarks="
            f"{[b.name for b in cfg.eval.benchmarks]}; add it there or pick one of those"
        )
    if not 0.0 <= cfg.data.val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction={cfg.data.val_fraction}: must be in [0, 1)")
    _check_judge(cfg.judge)
    _check_science_variants(cfg.science)
    return cfg


def group_options(group: str, conf_dir: Path | str = CONF_DIR) -> list[str]:
    """The option names of config group ``group`` (its ``conf/<group>/*.yaml`` files), sorted."""
    return sorted(p.stem for p in (Path(conf_dir) / group).glob("*.yaml"))


def _check_science_variants(science: DictConfig) -> None:
    options = group_options("algo")  # a science variant is an algo option (the cell switches to its file)
    unknown = [v for v in science.variants if v not in options]
    if unknown:
        raise ConfigError(f"science.variants has {unknown}, not conf/algo options; valid: {options}")
    if science.testtime_variant not in science.variants:
        raise ConfigError(
            f"science.testtime_variant={science.testtime_variant} is not in science.variants="
            f"{list(science.variants)}; add it there or pick one of those"
        )


def _check_judge(judge: DictConfig) -> None:
    """The judge's retry, timeout and failure-budget numbers (their ranges; defaults in conf/judge/)."""
    if judge.max_retries < 0 or judge.timeout_s <= 0 or not 0 <= judge.backoff_s <= judge.max_backoff_s:
        raise ConfigError(
            f"judge.max_retries={judge.max_retries}, judge.timeout_s={judge.timeout_s}, judge.backoff_s="
            f"{judge.backoff_s}, judge.max_backoff_s={judge.max_backoff_s}: need max_retries >= 0, "
            "timeout_s > 0 and 0 <= backoff_s <= max_backoff_s"
        )
    if not 0.0 <= judge.max_failure_rate <= 1.0 or judge.failure_window < 1:
        raise ConfigError(
            f"judge.max_failure_rate={judge.max_failure_rate}, judge.failure_window="
            f"{judge.failure_window}: need a rate in [0, 1] (1 = never stop) and a window >= 1"
        )
    if not 0.0 <= judge.argument_credit < 1.0:
        raise ConfigError(f"judge.argument_credit={judge.argument_credit}: must be in [0, 1) (0 = exact calls only)")
    if judge.argument_credit and judge.name != JudgeName.verifiable:
        raise ConfigError(
            f"judge.argument_credit={judge.argument_credit} is a setting of the verifiable reward, not of "
            f"judge={getattr(judge.name, 'value', judge.name)}; set judge=verifiable or judge.argument_credit=0"
        )


def _check_rehearsal_grid(rehearsal: RehearsalSweepConfig, seed: int) -> None:
    """Every cell of the sweep's grid as the ``RehearsalConfig`` it will run with, before any cell runs:
    ``RehearsalConfig`` holds the rules (N >= 0, temperatures >= 0, no parallel cell with N > 1 at
    ``rehearsal.act_temperature`` 0, which would run N identical attempts)."""
    modes = [to_plain(m) for m in rehearsal.modes]
    for n in sorted(rehearsal.n_attempts_grid):
        for mode in modes or [None]:
            try:
                rehearsal_config(rehearsal, seed, n, mode)
            except ValueError as exc:
                raise ConfigError(
                    f"{exc} (the sweep's cell n_attempts={n}, mode={mode}; rehearsal.n_attempts_grid="
                    f"{list(rehearsal.n_attempts_grid)}, rehearsal.modes={modes})"
                ) from exc


def rehearsal_config(
    rehearsal: RehearsalSweepConfig, seed: int, n_attempts: int = 0, mode: RehearsalMode | str | None = None
) -> RehearsalConfig:
    """The typed ``rehearsal`` section (with the run's ``seed``) as the rehearsal code's ``RehearsalConfig`` for
    one cell: ``n_attempts`` attempts in ``mode`` (None: ``RehearsalConfig``'s default; irrelevant for N=0).
    Every field the two share by name is taken from the section — one conversion, no field copied by hand."""
    shared = {f.name for f in fields(RehearsalConfig)} & {f.name for f in fields(rehearsal)}
    values = {name: getattr(rehearsal, name) for name in sorted(shared)}
    if mode is not None:
        values["mode"] = to_plain(mode)
    return RehearsalConfig(n_attempts=int(n_attempts), seed=int(seed), **values)


def compose(overrides: list[str] | tuple[str, ...] = (), conf_dir: Path | str = CONF_DIR) -> DictConfig:
    """Compose ``conf/config.yaml`` with Hydra overrides (``profile=smoke``, ``algo.lr=1e-6``)."""
    try:
        with initialize_config_dir(str(Path(conf_dir).resolve()), version_base=None):
            cfg = hydra_compose(config_name=CONFIG_NAME, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(
            f"cannot compose {conf_dir}/{CONFIG_NAME}.yaml with {list(overrides)}: {_explain(exc)}"
        ) from exc
    return validate_config(cfg)


def write_params(
    overrides: list[str] | tuple[str, ...] = (), root: Path | str = ".", conf_dir: Path | str | None = None
) -> Path:
    """Write ``<root>/params.yaml`` exactly the way ``dvc exp run -S`` does (DVC's own function)."""
    # lazy: dvc is slow to import and only `make params` (not a stage) writes params.yaml
    from dvc.utils.hydra import compose_and_dump

    root = Path(root).resolve()
    conf = Path(conf_dir).resolve() if conf_dir else root / "conf"
    out = root / PARAMS_FILE
    tmp = out.with_name(".params.tmp.yaml")  # DVC picks the dumper by suffix
    try:
        try:
            compose_and_dump(tmp, str(conf), None, CONFIG_NAME, str(root), list(overrides))
        except (HydraException, OmegaConfBaseException) as exc:
            raise ConfigError(
                f"cannot compose {conf}/{CONFIG_NAME}.yaml with {list(overrides)}: {_explain(exc)}"
            ) from exc
        load_params(tmp)  # the checks the schema cannot express, before params.yaml changes
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def group_switch(group: str, option: str, current: str, conf_dir: Path | str = CONF_DIR) -> list[str]:
    """The ``key=value`` overrides that turn a composed config's ``group`` from option ``current`` into
    ``option``: every key whose value differs between the two option files (``algo``: ``envace`` to
    ``grpo`` gives ``algo.name=grpo`` and ``algo.baseline=trajectory_mean``). What a profile set on top of
    the group stays, so a composed params.yaml can change group without recomposition."""
    files = {name: Path(conf_dir) / group / f"{name}.yaml" for name in (option, current)}
    for name, path in files.items():
        if not path.exists():
            valid = group_options(group, conf_dir)
            raise ConfigError(f"config group {group!r} has no option {name!r} ({path}); valid: {valid}")
    target, start = (OmegaConf.to_container(OmegaConf.load(files[name])) for name in (option, current))
    return [f"{group}.{k}={hydra_value(v)}" for k, v in target.items() if k != "defaults" and start.get(k) != v]


# strings a Hydra override may hold unquoted (anything else, and these words, are quoted)
_SAFE_STRING = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")
_RESERVED = {"null", "true", "false", "none", "nan", "inf"}


def hydra_value(value: Any) -> str:
    """A value written in Hydra's override grammar, read back as the same value by a dot-list override or
    ``compose`` (lists and nulls included; strings quoted unless plainly safe; enums as their values)."""
    value = to_plain(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"cannot write the non-finite number {value} as an override")
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    if _SAFE_STRING.match(text) and text.lower() not in _RESERVED:
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("${", "\\${") + "'"


def _is_group_override(item: str) -> bool:
    key = item.split("=", 1)[0].lstrip("+~")
    return key in GROUPS and "." not in key


def load_params(path: Path | str = PARAMS_FILE, overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Load a composed ``params.yaml`` into the schema and apply ``key=value`` overrides.

    Group selections (``profile=smoke``) cannot be applied to an already composed file: they raise
    with the command that does it (``make params ARGS=…`` or ``dvc exp run -S …``).
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path} not found; generate it with `make params` (or run from the repo root)")
    groups = [o for o in overrides if _is_group_override(o)]
    if groups:
        raise ConfigError(
            f"group selections {groups} need recomposition: run `make params ARGS='{' '.join(groups)}'` or "
            f"`dvc exp run -S {' -S '.join(groups)}`; a stage accepts only key=value overrides"
        )
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(path))
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{path} with overrides {list(overrides)}: {_explain(exc)}") from exc
    assert isinstance(cfg, DictConfig)
    return validate_config(cfg)


def typed_config(cfg: Config | DictConfig | Mapping[str, Any]) -> Config:
    """The composed config as the schema's ``Config`` dataclasses (enumerated values as enum members).

    A ``Config`` is returned as it is; a ``DictConfig`` (``compose``, ``load_params``) or a plain mapping of
    it (``OmegaConf.to_container``) is merged into the schema and converted once with ``OmegaConf.to_object``.
    A plain mapping holds resolved values: its strings are taken literally (a ``${`` in them is no interpolation).
    It converts, it does not validate: ``compose`` and ``load_params`` have checked their configs already.
    """
    if isinstance(cfg, Config):
        return cfg
    try:
        source = cfg if OmegaConf.is_config(cfg) else OmegaConf.create(_literal(dict(cfg)))
        typed = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), source))
    except OmegaConfBaseException as exc:
        raise ConfigError(f"config does not match the envace schema: {_explain(exc)}") from exc
    assert isinstance(typed, Config)
    return typed


def _literal(value: Any) -> Any:
    """A plain (already resolved) value with every ``${`` escaped, so OmegaConf keeps strings as they are."""
    if isinstance(value, str):
        return re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", value)
    if isinstance(value, Mapping):
        return {k: _literal(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_literal(v) for v in value]
    return value


def to_plain(node: Any) -> Any:
    """A DictConfig/ListConfig or a typed config (``typed_config``, or one of its sections) as plain Python
    (dicts, lists, enums as their string values) for libraries and MLflow."""
    if OmegaConf.is_config(node):
        return _strip_enums(OmegaConf.to_container(node, resolve=True, enum_to_str=True))
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return _strip_enums(dataclasses.asdict(node))
    return _strip_enums(node)


def _strip_enums(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _strip_enums(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strip_enums(v) for v in value]
    return value


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"algo": {"lr": 1e-5}}`` → ``{"algo.lr": 1e-5}`` (lists kept as values)."""
    plain = to_plain(node)
    out: dict[str, Any] = {}
    if isinstance(plain, dict):
        for key, value in plain.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, dict) and value:
                out.update(flatten(value, name))
            else:
                out[name] = value
    else:
        out[prefix] = plain
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m envace.config [OVERRIDES…]``: regenerate params.yaml from conf/."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    overrides = list(sys.argv[1:] if argv is None else argv)
    try:
        out = write_params(overrides, root=Path.cwd())
    except ConfigError as exc:
        logger.error("%s", exc)
        return 2
    logger.info("wrote %s (overrides: %s)", out, overrides or "none")
    return 0
