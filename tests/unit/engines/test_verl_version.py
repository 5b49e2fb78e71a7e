"""The verl engine refuses, at import, a verl other than the version pyproject.toml pins."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib import metadata

import pytest

from envace.engines.verl import UnsupportedVerlVersion, check_verl_version, installed_verl_version, pinned_verl_version

IMPORT_WITH_ANOTHER_VERL = """
from importlib import metadata
real = metadata.version
metadata.version = lambda name: "0.10.0" if name == "verl" else real(name)
import envace.engines.verl
"""


def test_the_pin_is_read_from_pyproject_and_matches_the_install() -> None:
    pinned = pinned_verl_version()
    assert pinned is not None, "envace's metadata has no exact verl== pin: reinstall with `pip install --no-deps -e .`"
    assert f"verl=={pinned}" in metadata.requires("envace")
    assert installed_verl_version() == metadata.version("verl") == pinned


def test_another_verl_version_is_refused_with_the_pin_and_the_fix() -> None:
    with pytest.raises(UnsupportedVerlVersion) as raised:
        check_verl_version("0.10.0", "0.9.1")
    message = str(raised.value)
    assert "verl 0.9.1" in message and "verl 0.10.0 is installed" in message
    assert "pyproject.toml" in message and "requirements/cpu.lock" in message and "pip install" in message
    check_verl_version("0.9.1", "0.9.1")
    check_verl_version(None, "0.9.1")  # no verl here (a launcher-only machine): nothing to check


def test_import_fails_loudly_under_another_verl() -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(IMPORT_WITH_ANOTHER_VERL)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0 and "UnsupportedVerlVersion" in done.stderr
    assert "verl 0.10.0 is installed" in done.stderr
