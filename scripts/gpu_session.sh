#!/usr/bin/env bash
# One GPU session on an H200 (torch 2.11, triton 3.6), from a checkout, in <= 8 minutes.
# Most important first, so a short session still ships a measured cost model:
#   1. costmodel calibrate qwen3-8b, torch-varlen, default sweep   <= 170 s (sweep ~90 s)
#      if it fails after measuring: refit from $OUT/$MODEL.partial.json (seconds, no GPU);
#      if it fails before: calibrate --quick with the sdpa backend instead (~40 s)
#   2. costmodel validate on random packed micro-batches           <= 140 s (stops at 100 s)
#   3. costmodel report --png                                      seconds
#   4. GPU pytest tests (-m gpu)                                   <= 100 s
#   5. kernel benchmarks (attention, MLP --quick), if time is left
#   6. costmodel bench-schedule with the fresh cost model (dp 8,16), if time is left
#      (stops measuring at 95 s, or at the step's SIGINT, and writes what it measured)
# STEPS picks and orders a subset, e.g. STEPS="bench_schedule pytest" with CAL=<a shipped
# profile> for a session that only needs those. At most 8 files come back from $OUT, so
# only these are written there: session.log, $MODEL.json (+ .partial.json on failure),
# $MODEL.png, pytest-gpu.xml, bench_attention.json, bench_mlp.json, bench_schedule.json.
# Every step has a timeout (SIGINT first, so Python saves what it can), the whole script
# skips steps past LIMIT_S, and a failing step never stops the next. Everything goes
# under "$OUT" (default ./out) with a log: session.log.
# Usage: OUT=/some/dir bash scripts/gpu_session.sh
# --gpu auto: the registry key is the device's (h200, or h200-nvl on an NVL that says so);
# ship the result afterwards (on the dev machine) under that key:
#   cp "$OUT/qwen3-8b.json" costmodel/profiles/<gpu.key in the file>/qwen3-8b.json
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/session.log") 2>&1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1   # progress lines reach the log as they happen
PY="${PYTHON:-python}"
LIMIT_S="${LIMIT_S:-470}"   # total wall budget; later steps are skipped past it
MODEL="${MODEL:-qwen3-8b}"
CAL="${CAL:-$OUT/$MODEL.json}"
STEPS="${STEPS:-calibrate validate report pytest bench_attention bench_mlp bench_schedule}"
STATUS=0
want() { [[ " $STEPS " == *" $1 "* ]]; }

step() {  # step NAME TIMEOUT_S CMD...: run with a timeout, log rc and time, never abort
  local name="$1" limit="$2"; shift 2
  local left=$((LIMIT_S - SECONDS))
  if (( left < 20 )); then echo "== SKIP $name: ${left}s left of ${LIMIT_S}s"; return 0; fi
  (( limit > left )) && limit=$left
  echo "== $name (timeout ${limit}s, t=${SECONDS}s): $*"
  local t0=$SECONDS
  timeout --signal=INT --kill-after=10 "$limit" "$@"
  local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0))s"
  (( rc != 0 )) && STATUS=1
  return 0
}

echo "== session start $(date -u +%FT%TZ) on $(hostname)"
timeout 20 nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit,memory.total \
  --format=csv || true
timeout 60 "$PY" - <<'PYEOF' || true
import importlib, sys
import torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
for name in ("triton", "numpy", "scipy", "matplotlib"):
    try:
        print(name, importlib.import_module(name).__version__)
    except ImportError:
        print(name, "MISSING")
PYEOF

if want calibrate; then
  step "calibrate $MODEL" 170 "$PY" -m costmodel -v calibrate --gpu auto --model "$MODEL" \
    --attention torch-varlen --dtype bf16 --modes train,forward --max-len 32768 -o "$CAL"
  if [[ ! -f "$CAL" && -f "$OUT/$MODEL.partial.json" ]]; then
    step "refit $MODEL from the partial measurements" 40 "$PY" -m costmodel -v calibrate \
      --refit "$OUT/$MODEL.partial.json" -o "$CAL"
  fi
  if [[ ! -f "$CAL" ]]; then
    step "calibrate $MODEL (fallback: sdpa, --quick)" 80 "$PY" -m costmodel -v calibrate \
      --gpu auto --model "$MODEL" --attention sdpa --dtype bf16 --modes train,forward \
      --max-len 32768 --quick -o "$CAL"
  fi
fi
if [[ -f "$CAL" ]]; then
  want validate && step "validate $MODEL" 140 "$PY" -m costmodel -v validate "$CAL" \
    --count 120 --layers 4 --time-limit-s 100
  want report && step "report $MODEL" 40 "$PY" -m costmodel report "$CAL" --png "$OUT/$MODEL.png"
else
  echo "== no $CAL: calibrate failed, skipping validate/report"
  STATUS=1
fi
want pytest && step "pytest -m gpu" 100 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/ \
  --junitxml="$OUT/pytest-gpu.xml"
want bench_attention && step "bench_attention --quick" 45 "$PY" benchmarks/bench_attention.py \
  --quick --backends torch-varlen triton --json "$OUT/bench_attention.json"
want bench_mlp && step "bench_mlp --quick" 40 "$PY" benchmarks/bench_mlp.py --quick \
  --json "$OUT/bench_mlp.json"
if want bench_schedule && [[ -f "$CAL" ]]; then
  step "bench-schedule $MODEL" 120 "$PY" -m costmodel -v bench-schedule --model "$MODEL" \
    --lengths rl --cap 16384 --dp 8,16 --cost-model "$CAL" --time-limit-s 95 \
    -o "$OUT/bench_schedule.json"
fi
echo "== session end after ${SECONDS}s, status $STATUS; files:"
ls -la "$OUT"
exit $STATUS
