#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv and install everything in the order that resolves.
#   scripts/install.sh VENV_DIR
# torch first (CPU wheel on disk), then the resolved set, then the --no-deps packages, then envace itself.
set -euo pipefail
VENV=${1:-.venv}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STAMP="$VENV/.envace-installed"
SPEC_HASH=$(cat "$ROOT/requirements/"*.txt "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SPEC_HASH" ]; then
  echo "[install] $VENV is up to date ($SPEC_HASH)"; exit 0
fi
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check"
$PIP install -q --upgrade pip wheel setuptools
echo "[install] torch==2.13.0 (CPU) first"
$PIP install -q torch==2.13.0
echo "[install] resolved set (requirements/cpu.txt)"
$PIP install -q -r "$ROOT/requirements/cpu.txt" torch==2.13.0
echo "[install] --no-deps set (requirements/nodeps.txt)"
$PIP install -q --no-deps -r "$ROOT/requirements/nodeps.txt"
echo "[install] envace (editable)"
$PIP install -q --no-deps -e "$ROOT"
echo "$SPEC_HASH" > "$STAMP"
echo "[install] done: $VENV"
