#!/usr/bin/env bash
# GPU smoke checks (< 10 minutes on one GPU, no network needed). See scripts/gpu_smoke.py for what is checked.
#
#   scripts/gpu_smoke.sh verl [--steps N]   # verl engine end to end: tiny model, vLLM rollouts, FSDP actor
#   scripts/gpu_smoke.sh bare               # PyTorch + transformers only: local engine on CUDA (bf16),
#                                           # estimator and loss on CUDA tensors (verl parts skipped if absent)
#   scripts/gpu_smoke.sh verl --dry-run     # CPU: everything up to the launch (model, data, composed config)
#   scripts/gpu_smoke.sh organism [--steps N] # PyTorch + transformers only: the model organism's training
#                                           # (stage train, local engine) on CUDA, 10 steps, validation curve
#
# Environment: PYTHON (default: python), OUT (report directory; default: a new temp dir),
# ENVACE_SMOKE_TIMEOUT (seconds, default 570). Exit status: 0 when every check passed.
set -euo pipefail

MODE="${1:-}"
if [[ "$MODE" != "verl" && "$MODE" != "bare" && "$MODE" != "organism" ]]; then
  sed -n '2,12p' "$0"
  exit 2
fi
shift

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
OUT="${OUT:-$(mktemp -d -t envace-gpu-smoke-XXXXXX)}"
mkdir -p "$OUT"

export DO_NOT_TRACK=true MLFLOW_DISABLE_TELEMETRY=true DVC_NO_ANALYTICS=1 DVC_STUDIO_OFFLINE=true
export PREFECT_SERVER_ANALYTICS_ENABLED=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export RAY_USAGE_STATS_ENABLED=0 VLLM_NO_USAGE_STATS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [[ " $* " != *" --dry-run "* ]]; then
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'CUDA is not available to torch')"
fi
"$PYTHON" - <<'EOF'
import importlib.util
found = {m: importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "verl", "vllm", "ray")}
print("packages:", found)
EOF

echo "gpu_smoke: mode=$MODE out=$OUT"
status=0
timeout "${ENVACE_SMOKE_TIMEOUT:-570}" "$PYTHON" scripts/gpu_smoke.py "$MODE" --out "$OUT" "$@" 2>&1 | tee "$OUT/smoke.log" \
  || status=$?
if [[ -f "$OUT/report.json" ]]; then
  echo "report: $OUT/report.json"
fi
if [[ $status -eq 124 ]]; then
  echo "gpu_smoke: timed out after ${ENVACE_SMOKE_TIMEOUT:-570}s" >&2
fi
exit "$status"
