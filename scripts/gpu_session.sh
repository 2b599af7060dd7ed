#!/usr/bin/env bash
# One GPU session on an H200 (torch 2.11, triton 3.6), from a checkout, in <= 8 minutes:
#   1. GPU pytest tests (-m gpu)                                  ~1.5 min cap
#   2. costmodel calibrate qwen3-8b, torch-varlen, default sweep   ~1.5-2.5 min cap
#   3. costmodel validate on random packed micro-batches          ~2 min cap
#   4. costmodel report --png                                      seconds
#   5. kernel benchmarks (attention, MLP --quick), if time is left
# Everything goes under "$OUT" (default ./out) with a log: session.log.
# Usage: OUT=/some/dir bash scripts/gpu_session.sh
# Ship the result afterwards (on the dev machine):
#   cp "$OUT/qwen3-8b.json" costmodel/profiles/h200/qwen3-8b.json
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/session.log") 2>&1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"
LIMIT_S="${LIMIT_S:-470}"   # total wall budget; later steps are skipped past it
MODEL="${MODEL:-qwen3-8b}"
STATUS=0

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
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv || true
"$PY" - <<'PYEOF' || true
import torch, sys
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
try:
    import triton; print("triton", triton.__version__)
except ImportError:
    print("triton missing")
PYEOF

step "pytest -m gpu" 100 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/ \
  --junitxml="$OUT/pytest-gpu.xml"
step "calibrate $MODEL" 170 "$PY" -m costmodel -v calibrate --gpu h200 --model "$MODEL" \
  --attention torch-varlen --dtype bf16 --modes train,forward --max-len 32768 \
  -o "$OUT/$MODEL.json"
if [[ -f "$OUT/$MODEL.json" ]]; then
  cp "$OUT/$MODEL.json" "$OUT/$MODEL.before-validate.json"
  step "validate $MODEL" 140 "$PY" -m costmodel -v validate "$OUT/$MODEL.json" --count 120 --layers 4
  step "report $MODEL" 40 sh -c "\"$PY\" -m costmodel report \"$OUT/$MODEL.json\" --png \"$OUT/$MODEL.png\" > \"$OUT/$MODEL.report.txt\"; rc=\$?; cat \"$OUT/$MODEL.report.txt\"; exit \$rc"
else
  echo "== no $OUT/$MODEL.json: calibrate failed, skipping validate/report"
  STATUS=1
fi
step "bench_attention --quick" 45 "$PY" benchmarks/bench_attention.py --quick \
  --backends torch-varlen triton --json "$OUT/bench_attention.json"
step "bench_mlp --quick" 40 "$PY" benchmarks/bench_mlp.py --quick --json "$OUT/bench_mlp.json"
echo "== session end after ${SECONDS}s, status $STATUS; files:"
ls -la "$OUT"
exit $STATUS
