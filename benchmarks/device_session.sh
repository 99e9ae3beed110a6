#!/usr/bin/env bash
# Issue 26's GPU session, one step per device call (docs/PERFORMANCE.md, "Time to evidence").
# Run from the repository root with MLX installed (PYTHONPATH holding it); each step's figures
# and files go to $OUT. The defaults are the H200's; the CPU rehearsal overrides them:
#   PRESET=tiny DTYPE=float32 CTX=128 E2E_CTX=128,256 BASE_STEP=64 PLANTED_STEP=16 CAL_RUNS=2 \
#   AAA_ROUNDS=8 E2E_ROUNDS=6 PYTHON=.venv/bin/python OUT=/tmp/out WORK=/tmp/work \
#   benchmarks/device_session.sh model
# Steps: model (write the checkpoint, probe the load gate), cal1 and cal2 (each CAL_RUNS
# calibration runs, seeds apart), merge, aaa (A/A/A through coldbench run with the calibration),
# e2e (the whole service: A/B of two refs of $BUNDLE), decided and decided-aa (JOBS jobs measuring
# until decided: the two refs, or the first against itself), summaries (the bundles' summaries,
# tarred).
set -euo pipefail
step=${1:?give a step: model, cal1, cal2, merge, aaa, e2e, decided, decided-aa, summaries}
PY=${PYTHON:-python3}
OUT=${OUT:?set OUT}
WORK=${WORK:-/tmp/cb}
PRESET=${PRESET:-llama-8b-shape}
DTYPE=${DTYPE:-bfloat16}
CTX=${CTX:-16384}
E2E_CTX=${E2E_CTX:-4096,16384}
BASE_STEP=${BASE_STEP:-4096}
PLANTED_STEP=${PLANTED_STEP:-3072}
CAL_ROUNDS=${CAL_ROUNDS:-12}
CAL_RUNS=${CAL_RUNS:-5}
AAA_ROUNDS=${AAA_ROUNDS:-24}
E2E_ROUNDS=${E2E_ROUNDS:-12}
BUNDLE=${BUNDLE:-.gpu/cb.bundle}
REFS=${REFS:-main e2e-wide}
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
mkdir -p "$WORK" "$OUT"
model=$WORK/model
clock() { date -u +%H:%M:%S; }
echo "[$(clock)] step $step, load average $(cut -d' ' -f1-3 /proc/loadavg)"
calibrate() {  # $1: part name, $2: first seed
  $PY -m coldbench calibrate --model "$model" --contexts "$CTX" --rounds "$CAL_ROUNDS" \
    --rounds-per-process "$CAL_ROUNDS" --jobs "$CAL_RUNS" --base-step "$BASE_STEP" \
    --planted-step "$PLANTED_STEP" --decode-tokens 2 --seed "$2" --out "$WORK/$1.json" \
    --bundles "$WORK/bundles-$1" --state-dir "$WORK/state-$1"
  cp "$WORK/$1.json" "$OUT/"
}
case $step in
  model)
    start=$(date +%s)
    [ -f "$model/config.json" ] || $PY -m coldbench model create --preset "$PRESET" --dtype "$DTYPE" --out "$model"
    echo "model written in $(( $(date +%s) - start )) s"
    $PY benchmarks/load_gate_probe.py --model "$model" | tee "$OUT/gate.json"
    ;;
  cal1) calibrate cal1 0 ;;
  cal2) calibrate cal2 100 ;;
  merge)
    $PY -m coldbench calibrate --merge "$WORK/cal1.json" --merge "$WORK/cal2.json" --out "$WORK/cal.json"
    cp "$WORK/cal.json" "$OUT/"
    ;;
  aaa)
    $PY benchmarks/time_to_evidence.py --model "$model" --contexts "$CTX" --rounds "$AAA_ROUNDS" \
      --variant a --variant b --variant c --calibration "$WORK/cal.json" --decode-tokens 2 \
      --workdir "$WORK/tte" --out "$OUT/tte.jsonl"
    ;;
  e2e)
    set -- $REFS
    $PY benchmarks/host_e2e.py --repo "$BUNDLE" --ref "$1" --ref "$2" --model "$model" \
      --contexts "$E2E_CTX" --rounds "$E2E_ROUNDS" --calibration "$WORK/cal.json" \
      --out "$WORK/e2e-out" --workdir "$WORK/e2e" --timeout-s 500 | tail -1 | tee "$OUT/e2e.json"
    ;;
  decided|decided-aa)
    # Measuring until decided through the whole service, JOBS jobs back to back: the A/B of the
    # two refs (decided), or main against itself (decided-aa); one JSON line a job.
    set -- $REFS
    if [ "$step" = decided ]; then variants="--ref $1 --ref $2"; else variants="--variant a:ref=$1 --variant b:ref=$1"; fi
    $PY benchmarks/host_e2e.py --repo "$BUNDLE" $variants --model "$model" --contexts "$CTX" \
      --until decided --rounds "${BUDGET:-40}" --jobs "${JOBS:-10}" --out "$WORK/$step-out" \
      --workdir "$WORK/$step" --timeout-s 900 | grep '^{' | tee "$OUT/$step.jsonl"
    ;;
  summaries)
    for zip in "$WORK"/e2e-out/*.zip; do  # the service's evidence: its views and timeline
      [ -f "$zip" ] && $PY -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2], [n for n in ("summary.md", "summary.json", "timeline.json", "provenance.json", "records.jsonl")])' "$zip" "$WORK/e2e-evidence"
    done
    (cd "$WORK" && find . -name summary.md -o -name summary.json -o -name timeline.json -o -name records.jsonl \
      -o -name provenance.json | grep -v '/state' | tar -czf "$OUT/summaries.tgz" -T -)
    ls -l "$OUT"
    ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
echo "[$(clock)] step $step done"
