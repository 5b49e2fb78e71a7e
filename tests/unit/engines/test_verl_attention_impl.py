"""The launcher's attention choice for verl's actor: flash-attn when installed, sdpa (logged) when not, refused
when flash attention is asked for and missing (issue 43, point 4). flash_attn cannot be installed on a CPU
machine, so the "installed" branch replaces ``importlib.util.find_spec``'s answer for it."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from envace.config.load import compose
from envace.engines.verl import attention_impl
from envace.engines.verl.attention_impl import (
    ATTN_KEY,
    INSTALL_LINE,
    REMOVE_PADDING_KEY,
    attention_overrides,
    override_value,
)
from envace.engines.verl.config_builder import VerlConfigError, compose_verl_config
from envace.engines.verl.launcher import plan_launch

FLASH_MISSING = not attention_impl.flash_attn_installed()


@pytest.fixture
def flash_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``find_spec("flash_attn")`` answers as if the package were installed."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args, **kwargs):
        return object() if name == "flash_attn" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def smoke_plan(tmp_path: Path, extra: list[str] = ()):
    cfg = OmegaConf.to_container(
        compose(["profile=smoke", "model.kind=path", f"model.path={tmp_path / 'model'}", "tracking=none"]), resolve=True
    )
    return plan_launch(cfg, output_dir=tmp_path / "run", dry_run=True, extra_overrides=list(extra))


def test_override_value_reads_the_last_setting_with_any_prefix() -> None:
    overrides = [f"+{ATTN_KEY}=eager", "trainer.nnodes=1", f"++{ATTN_KEY}='sdpa'"]
    assert override_value(overrides, ATTN_KEY) == "sdpa"
    assert override_value(overrides, REMOVE_PADDING_KEY) is None


@pytest.mark.skipif(not FLASH_MISSING, reason="flash_attn is installed here")
def test_without_flash_attn_the_actor_falls_back_to_sdpa(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert attention_overrides([], flash_installed=False) == [f"+{ATTN_KEY}=sdpa", f"{REMOVE_PADDING_KEY}=false"]
    with caplog.at_level(logging.WARNING, logger=attention_impl.__name__):
        plan = smoke_plan(tmp_path)
    assert f"+{ATTN_KEY}=sdpa" in plan.overrides and any(INSTALL_LINE in r.getMessage() for r in caplog.records)
    assert any("sdpa" in note for note in plan.notes)
    model = compose_verl_config(plan.overrides).actor_rollout_ref.model  # what verl's HFModelConfig reads
    assert model.override_config.attn_implementation == "sdpa" and model.use_remove_padding is False


def test_a_user_padding_choice_is_kept_in_the_fallback() -> None:
    assert attention_overrides([f"{REMOVE_PADDING_KEY}=true"], flash_installed=False) == [f"+{ATTN_KEY}=sdpa"]


def test_with_flash_attn_installed_verl_keeps_its_default(tmp_path: Path, flash_installed: None) -> None:
    assert attention_overrides([]) == []
    plan = smoke_plan(tmp_path)
    assert not any(ATTN_KEY in o for o in plan.overrides)
    model = compose_verl_config(plan.overrides).actor_rollout_ref.model
    assert "attn_implementation" not in model.override_config and model.use_remove_padding is True


@pytest.mark.skipif(not FLASH_MISSING, reason="flash_attn is installed here")
def test_explicit_flash_without_flash_attn_is_refused_with_the_install_line(tmp_path: Path) -> None:
    with pytest.raises(VerlConfigError, match="pip install flash-attn --no-build-isolation"):
        smoke_plan(tmp_path, [f"+{ATTN_KEY}=flash_attention_2"])
    with pytest.raises(VerlConfigError, match=ATTN_KEY.replace(".", r"\.")):
        attention_overrides([f"++{ATTN_KEY}=flash_attention_3"], flash_installed=False)


def test_an_explicit_choice_is_left_alone(flash_installed: None) -> None:
    assert attention_overrides([f"+{ATTN_KEY}=flash_attention_2"]) == []
    assert attention_overrides([f"+{ATTN_KEY}=eager"], flash_installed=False) == []
