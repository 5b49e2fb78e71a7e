#!/usr/bin/env bash
# Create (or reuse) a virtualenv and install envace from the lock files.
#   scripts/install.sh VENV_DIR [SET ...]      SET: bench (TRL, for scripts/bench_peer_trl.py)
# requirements/cpu.lock pins the whole default set with hashes (resolved together by requirements/lock.sh),
# so every lock is installed with --no-deps --require-hashes: nothing is resolved here. Steps: check the
# Python; the locked pip; torch 2.13.0+cpu alone (a missing CPU wheel stops the install at once, with how
# to get it); the rest of cpu.lock and each SET's lock; remove what no lock lists (a reused venv ends up
# as a fresh one would); envace itself (editable); `pip check` against requirements/pip-check-expected.txt.
# TORCH_INDEX_URL: an index that serves torch 2.13.0+cpu, for a machine without the wheel on disk
# (https://download.pytorch.org/whl/cpu).
set -euo pipefail
VENV=${1:-.venv}
SETS=("${@:2}")
ROOT=$(cd "$(dirname "$0")/.." && pwd)
REQ="$ROOT/requirements"
PY=${PYTHON:-python3}
# the one Python the locks are built for: pyproject.toml's requires-python ("==3.11.*")
PY_NEEDED=$(sed -n 's/^requires-python = "==\(3\.[0-9]*\)\.\*".*/\1/p' "$ROOT/pyproject.toml")
STAMP="$VENV/.envace-installed"

die() { echo "[install] error: $*" >&2; exit 1; }
[ -n "$PY_NEEDED" ] || die "pyproject.toml's requires-python is not of the form \"==3.X.*\": it names the one Python \
the lock files are built for"

LOCKS=("$REQ/cpu.lock")
for set in "${SETS[@]}"; do
  LOCKS+=("$REQ/$set.lock")
  [ -f "$REQ/$set.lock" ] || die "unknown install set '$set': the sets are the requirements/*.lock files other \
than cpu ($(cd "$REQ" && ls ./*.lock | sed 's|^\./||; s|\.lock$||' | grep -vx cpu | paste -sd' ' -))"
done

SPEC_HASH=$( (cat "$REQ"/* "$ROOT/pyproject.toml" "$ROOT/scripts/install.sh"; echo "sets: ${SETS[*]}") | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SPEC_HASH" ]; then
  # a venv outside the clone (CI keeps one per spec hash) may have been built by a checkout at another
  # path: point its editable envace at this one, or every subprocess (`python -m envace.stages.*`, DVC's
  # stage commands) imports the other tree's code, or none. The check runs from / (so that the working
  # directory cannot supply envace), with the venv's python by its absolute path (VENV may be relative)
  venv_python="$(cd "$VENV" && pwd)/bin/python"
  where=$(cd / && "$venv_python" -c 'import envace, os; print(os.path.dirname(os.path.dirname(os.path.abspath(envace.__file__))))' 2>/dev/null || true)
  if [ "$where" != "$ROOT" ]; then
    echo "[install] envace (editable) -> $ROOT (it pointed at: ${where:-nothing importable})"
    "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$ROOT"
  fi
  echo "[install] $VENV is up to date ($SPEC_HASH)"; exit 0
fi

check_python() {  # check_python INTERPRETER WHAT: the locks and torch's CPU wheel are for CPython 3.11
  local found
  found=$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
    || die "cannot run $2 '$1'. Install Python $PY_NEEDED and run: PYTHON=python$PY_NEEDED bash scripts/install.sh $VENV"
  [ "$found" = "$PY_NEEDED" ] && return 0
  die "$2 '$1' is Python $found; envace's lock files (requirements/*.lock) and torch's CPU wheel are built \
for Python $PY_NEEDED. Install Python $PY_NEEDED (e.g. \`pyenv install 3.11\` or \`apt-get install python3.11 \
python3.11-venv\`) and run: PYTHON=python$PY_NEEDED bash scripts/install.sh $VENV$( [ -x "$VENV/bin/python" ] \
&& echo " (remove the old venv first: rm -r $VENV)")"
}
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) ;;
  *) die "the lock files are resolved for x86_64 Linux, this is $(uname -s)-$(uname -m): install with pip from \
pyproject.toml instead (see README, Quick start)" ;;
esac
if [ -x "$VENV/bin/python" ]; then
  check_python "$VENV/bin/python" "the existing venv's Python"
else
  check_python "$PY" "PYTHON"
  "$PY" -m venv "$VENV"
fi

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
LOCKED=(install -q --no-deps --require-hashes)
lock_entry() {  # lock_entry PACKAGE LOCK: that package's pinned line with its --hash continuation lines
  awk -v p="$1==" 'index(tolower($0), p) == 1 {on = 1} on {print; if ($0 !~ /\\$/) exit}' "$2"
}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

echo "[install] pip, then torch (CPU build) first, from requirements/cpu.lock"
for pkg in pip torch; do
  lock_entry $pkg "$REQ/cpu.lock" > "$tmp/$pkg.txt"
  [ -s "$tmp/$pkg.txt" ] || die "requirements/cpu.lock has no $pkg entry: regenerate it with bash requirements/lock.sh"
done
"${PIP[@]}" "${LOCKED[@]}" -r "$tmp/pip.txt"
"${PIP[@]}" "${LOCKED[@]}" ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} -r "$tmp/torch.txt" \
  || die "could not install $(head -1 "$tmp/torch.txt" | cut -d' ' -f1) (the CPU build). pip finds it on this \
project's machines in /opt/wheels (pip's find-links); elsewhere take it from PyTorch's CPU index: \
TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/install.sh $VENV"

for lock in "${LOCKS[@]}"; do
  echo "[install] ${lock#"$ROOT/"} (--no-deps, hashes checked)"
  "${PIP[@]}" "${LOCKED[@]}" -r "$lock"
done

# a reused venv keeps what an older lock (or a hand-run pip) put there: remove what no lock installed
locked=$(cat "${LOCKS[@]}" | sed -n 's/^\([A-Za-z0-9][A-Za-z0-9._-]*\)\(\[.*\]\)\{0,1\}==.*/\1/p')
stray=$("$VENV/bin/python" - $locked <<'PY'
import importlib.metadata as md, re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
keep = {norm(n) for n in sys.argv[1:]} | {"envace"}
print(" ".join(sorted({norm(d.metadata["Name"]) for d in md.distributions()} - keep)))
PY
)
if [ -n "$stray" ]; then
  echo "[install] removing packages no lock lists: $stray"
  "${PIP[@]}" uninstall -q -y $stray
fi

echo "[install] envace (editable)"
"${PIP[@]}" install -q --no-deps --no-build-isolation -e "$ROOT"

echo "[install] pip check"
"${PIP[@]}" check > "$tmp/check.txt" 2>&1 || true
grep -v '^#' "$REQ/pip-check-expected.txt" | sed '/^$/d' | LC_ALL=C sort > "$tmp/expected.txt"
sed '/^No broken requirements found/d; /^$/d' "$tmp/check.txt" | LC_ALL=C sort > "$tmp/found.txt"
if LC_ALL=C comm -23 "$tmp/found.txt" "$tmp/expected.txt" | grep -q .; then
  LC_ALL=C comm -23 "$tmp/found.txt" "$tmp/expected.txt" | sed 's/^/  /' >&2
  die "pip check reports the conflicts above, which requirements/pip-check-expected.txt does not explain: \
fix the lock (bash requirements/lock.sh) or add each line there with why it is harmless"
fi
echo "[install] pip check: $(wc -l < "$tmp/found.txt") known line(s), each explained in requirements/pip-check-expected.txt"
if LC_ALL=C comm -13 "$tmp/found.txt" "$tmp/expected.txt" | grep -q .; then
  echo "[install] note: requirements/pip-check-expected.txt lists lines pip check no longer reports (remove them):"
  LC_ALL=C comm -13 "$tmp/found.txt" "$tmp/expected.txt" | sed 's/^/  /'
fi

echo "$SPEC_HASH" > "$STAMP"
echo "[install] done: $VENV"
