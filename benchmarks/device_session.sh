#!/usr/bin/env bash
# The GPU session of the time-to-evidence targets, one step per device call (docs/PERFORMANCE.md, "Time to evidence").
# Run from the repository root with MLX installed (PYTHONPATH holding it); each step's figures
# and files go to $OUT. The defaults are docs/PERFORMANCE.md's (written for the H200; on an 80 GB
# H100 the memory plan runs in turns what does not fit side by side, as the calibration did
# there); the CPU rehearsal overrides them:
#   PRESET=tiny DTYPE=float32 CTX=128 E2E_CTX=128,256 BASE_STEP=64 PLANTED_STEP=16 CAL_RUNS=2 \
#   AAA_ROUNDS=8 E2E_ROUNDS=6 DUTY_ROUNDS=4 DUTY_RPP=2 MOE_PRESET=tiny-moe MOE_DTYPE=float32 \
#   MOE_CTX=128 MOE_ROUNDS=10 PYTHON=.venv/bin/python OUT=/tmp/out WORK=/tmp/work \
#   benchmarks/device_session.sh model
# (with COLDBENCH_DEVICE_MEMORY_BYTES=1000000000 the CPU's moe step runs in turns, as on the GPU)
# Steps: model (write the checkpoint, probe the load gate), cal1 and cal2 (each CAL_RUNS
# calibration runs, seeds apart), merge, aaa (A/A/A through coldbench run with the calibration),
# e2e (the whole service: A/B of two refs of $BUNDLE), decided and decided-aa (JOBS jobs measuring
# until decided: the two refs, or the first against itself), alternate (JOBS pairs of those two
# jobs, one after the other, each job's line as it ends), duty (the duty cycle of an A/B in
# turns beside one side by side, benchmarks/time_to_evidence.py --compare residency),
# duty-kernels (side by side, an empty MLX kernel cache beside the host's: --compare kernel-cache), moe-model
# and moe (variants in turns: write $MOE_PRESET and probe its load beside the page cache's read of
# its weights, then an A/B of it, one process more than half of the device, which runs in turns; on
# a machine of its own, its checkpoint is about 46 GB), two-first and two-second (one job
# reproduced on two machines through the service, benchmarks/two_hosts.py: the first packs
# $OUT/state.tgz, the second takes it as $STATE), planted-repo ($WORK/two/repo alone), load (benchmarks/load_floor.py on $LOAD_MODEL,
# $WORK/model by default: mlx-lm's one-thread load beside the engine's reads by several threads),
# summaries (the bundles' summaries, tarred).
# MODEL names another checkpoint folder for the steps that use $WORK/model (two-first writes
# $WORK/two/model-llama-8b-shape-bfloat16, and its repository $WORK/two/repo holds main and
# planted-2pct: BUNDLE and REFS for decided and alternate; TWO_ARGS passes on options such as
# --model and --contexts); TIMEOUT_S bounds a service job (900), MOE_TIMEOUT_S the moe run (none).
# Every step can be run again in place: it replaces its own output.
set -euo pipefail
step=${1:?give a step: model, cal1, cal2, merge, aaa, e2e, decided, decided-aa, alternate, duty, duty-kernels, moe-model, moe, two-first, two-second, planted-repo, load, summaries}
PY=${PYTHON:-python3}
OUT=${OUT:?set OUT}
WORK=${WORK:-/tmp/cb}
PRESET=${PRESET:-llama-8b-shape}
DTYPE=${DTYPE:-bfloat16}
CTX=${CTX:-16384}
E2E_CTX=${E2E_CTX:-4096,16384}
BASE_STEP=${BASE_STEP:-4096}
PLANTED_STEP=${PLANTED_STEP:-2048}
# 10 process pairs of 2 rounds a job: the fewest whose verdict 2 stalled pairs at each end cannot
# decide, both variance components measured. In turns on an 80 GB H100 a run pays 40 turn starts
# of about 5.3 s (load 3.3 s, warm-ups 1.8 s) beside 80 timed cells: 5 min 8 s and 5 min 48 s
# there (2026-12-07), so one run a part keeps a part within one 10-minute device call
CAL_ROUNDS=${CAL_ROUNDS:-20}
CAL_RPP=${CAL_RPP:-2}
CAL_RUNS=${CAL_RUNS:-1}
AAA_ROUNDS=${AAA_ROUNDS:-24}
E2E_ROUNDS=${E2E_ROUNDS:-12}
BUNDLE=${BUNDLE:-.gpu/cb.bundle}
REFS=${REFS:-main e2e-wide}
# 2 blocks of 12 rounds: on the H100 a block start of the 8B at 16K costs about 10 s side by side
# and 16 s in turns against 1.15 s a round, so 3 rounds a process cannot reach the duty targets
# 2 pairs of runs (side by side, in turns, twice): a machine's first run compiles the kernels its
# warm-ups need (14-19 s at its first block on the H100s, against 5 s once MLX's kernel cache
# holds them: the duty-kernels step)
DUTY_ROUNDS=${DUTY_ROUNDS:-24}
DUTY_RPP=${DUTY_RPP:-12}
MOE_PRESET=${MOE_PRESET:-qwen3-moe-45g-shape}
MOE_DTYPE=${MOE_DTYPE:-bfloat16}
MOE_CTX=${MOE_CTX:-16384}
# measuring until decided: a look at 10 blocks (one process pair each), a second at 20
MOE_ROUNDS=${MOE_ROUNDS:-20}
MOE_RPP=${MOE_RPP:-1}
TIMEOUT_S=${TIMEOUT_S:-900}
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
mkdir -p "$WORK" "$OUT"
model=${MODEL:-$WORK/model}
moe=$WORK/moe
clock() { date -u +%H:%M:%S; }
# a service bundle's summaries (and any further names given) out of its zip into a folder
evidence_files() {
  $PY -c 'import sys, zipfile
bundle = zipfile.ZipFile(sys.argv[1])
wanted = {"summary.md", "summary.json", "timeline.json", "provenance.json", *sys.argv[3:]}
bundle.extractall(sys.argv[2], [n for n in bundle.namelist() if n in wanted])' "$@"
}
echo "[$(clock)] step $step, load average $(cut -d' ' -f1-3 /proc/loadavg)"
calibrate() {  # $1: part name, $2: first seed
  # an earlier attempt's result must not outlive a failed run (the merge would take it)
  rm -f "$WORK/$1.json"
  $PY -m coldbench calibrate --model "$model" --contexts "$CTX" --rounds "$CAL_ROUNDS" \
    --rounds-per-process "$CAL_RPP" --jobs "$CAL_RUNS" --base-step "$BASE_STEP" \
    --planted-step "$PLANTED_STEP" --decode-tokens 2 --seed "$2" --out "$WORK/$1.json" \
    --bundles "$WORK/bundles-$1" --force --state-dir "$WORK/state-$1"
  cp "$WORK/$1.json" "$OUT/"
}
case $step in
  model)
    start=$(date +%s)
    [ -f "$model/config.json" ] || $PY -m coldbench model create --preset "$PRESET" --dtype "$DTYPE" --out "$model"
    echo "model written in $(( $(date +%s) - start )) s"
    [ "${GATE_PROBE:-1}" = 0 ] || $PY benchmarks/load_gate_probe.py --model "$model" | tee "$OUT/gate.json"
    ;;
  cal1) calibrate cal1 0 ;;
  cal2) calibrate cal2 100 ;;
  merge)
    $PY -m coldbench calibrate --merge "$WORK/cal1.json" --merge "$WORK/cal2.json" --out "$WORK/cal.json"
    cp "$WORK/cal.json" "$OUT/"
    ;;
  aaa)
    rm -f "$OUT/tte.jsonl"
    $PY benchmarks/time_to_evidence.py --model "$model" --contexts "$CTX" --rounds "$AAA_ROUNDS" \
      --variant a --variant b --variant c --calibration "$WORK/cal.json" --decode-tokens 2 \
      --workdir "$WORK/tte" --out "$OUT/tte.jsonl"
    ;;
  e2e)
    rm -rf "$WORK/e2e-out" "$WORK/e2e" "$WORK/e2e-evidence"
    set -- $REFS
    $PY benchmarks/host_e2e.py --repo "$BUNDLE" --ref "$1" --ref "$2" --model "$model" \
      --contexts "$E2E_CTX" --rounds "$E2E_ROUNDS" --calibration "$WORK/cal.json" \
      --out "$WORK/e2e-out" --workdir "$WORK/e2e" --timeout-s 500 | tail -1 | tee "$OUT/e2e.json"
    ;;
  decided|decided-aa)
    # Measuring until decided through the whole service, JOBS jobs back to back: the A/B of the
    # two refs (decided), or main against itself (decided-aa); one JSON line a job.
    rm -rf "$WORK/$step-out" "$WORK/$step"
    set -- $REFS
    if [ "$step" = decided ]; then variants="--ref $1 --ref $2"; else variants="--variant a:ref=$1 --variant b:ref=$1"; fi
    $PY benchmarks/host_e2e.py --repo "$BUNDLE" $variants --model "$model" --contexts "$CTX" \
      --until decided --rounds "${BUDGET:-40}" --jobs "${JOBS:-10}" --out "$WORK/$step-out" \
      --workdir "$WORK/$step" --timeout-s "$TIMEOUT_S" | grep '^{' | tee "$OUT/$step.jsonl"
    ;;
  alternate)
    # JOBS pairs of jobs measuring until decided, alternated so that drift over the session falls
    # on both: the A/B of the two refs, then the first ref against itself, pair i with seed i-1
    # (each pair its own prompts). Each job's line, with
    # its pair and kind, goes to alternate.jsonl as it ends (a machine taken back keeps what
    # ended), and its bundle and summaries to $OUT/alternate-evidence/<kind>-<pair>; every bundle
    # stays under $WORK/alternate-out (the summaries step collects them).
    # Across device calls: FIRST_JOB (1, the first A/B) numbers on from an earlier call's last job,
    # and CALL_S (0: no limit) starts a job only while the call's elapsed time and that kind's
    # expected wall (EXPECT_AB_S, EXPECT_AA_S) fit in it; a call's first job always starts. The
    # defaults are the longest walls measured: a job that spends its budget of 40 rounds took
    # 483 s (A/B) and 449 s (A/A) on an 80 GB H100 (2026-12-08), so a 600 s call holds one.
    first=${FIRST_JOB:-1} call_s=${CALL_S:-0} started=$(date +%s)
    [ "$first" -gt 1 ] || rm -rf "$WORK/alternate-out" "$WORK/alternate"
    rm -rf "$OUT/alternate.jsonl" "$OUT/alternate-evidence"
    set -- $REFS
    for job in $(seq "$first" $(( 2 * ${JOBS:-10} ))); do
      i=$(( (job + 1) / 2 ))
      if [ $(( job % 2 )) = 1 ]; then kind=ab expect=${EXPECT_AB_S:-500}; else kind=aa expect=${EXPECT_AA_S:-460}; fi
      elapsed=$(( $(date +%s) - started ))
      if [ "$call_s" -gt 0 ] && [ "$job" -gt "$first" ] && [ $(( elapsed + expect )) -gt "$call_s" ]; then
        echo "[$(clock)] stopping before job $job ($kind-$i): ${elapsed} s spent, about $expect s more would pass CALL_S=$call_s"
        break
      fi
      if [ "$kind" = ab ]; then variants="--ref $1 --ref $2"; else variants="--variant a:ref=$1 --variant b:ref=$1"; fi
      line=$($PY benchmarks/host_e2e.py --repo "$BUNDLE" $variants --model "$model" \
        --contexts "$CTX" --until decided --rounds "${BUDGET:-40}" --jobs 1 --first-seed $(( i - 1 )) \
        --out "$WORK/alternate-out/$kind-$i" --workdir "$WORK/alternate/$kind-$i" \
        --timeout-s "$TIMEOUT_S" | grep '^{' | tail -1) || line='{"ok": false}'
      echo "{\"pair\": $i, \"kind\": \"$kind\", ${line#\{}" | tee -a "$OUT/alternate.jsonl"
      # the job's evidence into $OUT at once: a machine taken back before `summaries` keeps it
      # (the summaries beside the zip still come back where a device's limits hold a zip back)
      for zip in "$WORK/alternate-out/$kind-$i"/*.zip; do
        [ -f "$zip" ] || continue
        evidence_files "$zip" "$OUT/alternate-evidence/$kind-$i"
        cp "$zip" "$OUT/alternate-evidence/$kind-$i/"
      done
    done
    ;;
  duty|duty-kernels)
    # duty-kernels: side by side, an empty MLX kernel cache beside the host's (a machine's first
    # run compiles every kernel its warm-ups need; the runs after it read them from the cache)
    compare=residency residency=()
    [ "$step" = duty ] || compare=kernel-cache residency=(--residency side-by-side)
    rm -f "$OUT/$step.jsonl"
    $PY benchmarks/time_to_evidence.py --model "$model" --contexts "$CTX" --rounds "$DUTY_ROUNDS" \
      --rounds-per-process "$DUTY_RPP" --variant a --variant "b:prefill_step_size=$PLANTED_STEP" \
      --decode-tokens 2 --compare "$compare" "${residency[@]}" --repeat "${DUTY_REPEAT:-2}" \
      --workdir "$WORK/$step" --out "$OUT/$step.jsonl"
    ;;
  moe-model)
    start=$(date +%s)
    # MOE_LAYOUT=mlx writes the experts stacked, as mlx_lm.convert saves them (engine/checkpoints.py)
    [ -f "$moe/config.json" ] || $PY -m coldbench model create --preset "$MOE_PRESET" --dtype "$MOE_DTYPE" \
      --layout "${MOE_LAYOUT:-hf}" --out "$moe"
    echo "moe model written in $(( $(date +%s) - start )) s"
    $PY benchmarks/load_gate_probe.py --model "$moe" | tee "$OUT/moe-gate.json"
    cp "$OUT/moe-gate.json" "$WORK/moe-gate.json"
    ;;
  moe)
    rm -rf "$WORK/moe-out" "$WORK/state-moe"
    # MOE_TIMEOUT_S (0: none) stops the run with SIGTERM, and the bundle keeps what was measured
    timeout -s TERM "${MOE_TIMEOUT_S:-0}" $PY -m coldbench run --model "$moe" --contexts "$MOE_CTX" --until decided \
      --rounds "$MOE_ROUNDS" --rounds-per-process "$MOE_RPP" --decode-tokens 2 --seed 7 \
      --variant "base:prefill_step_size=$BASE_STEP" --variant "planted:prefill_step_size=$PLANTED_STEP" \
      --out "$WORK/moe-out" --state-dir "$WORK/state-moe" || true  # the bundle says why
    for f in summary.md summary.json timeline.json records.jsonl; do
      [ -f "$WORK/moe-out/$f" ] && cp "$WORK/moe-out/$f" "$OUT/moe-$f"
    done
    # a turn start's stop, imports and load, beside the page cache's read of the weights
    $PY -c 'import json, sys
run = json.load(open(sys.argv[1]))["timeline"]["runs"][0]
cost, turns = run.get("turn_starts") or {}, run.get("turns_within_blocks") or 0
added = sum(cost.get(k, 0) for k in ("stop_s", "imports_s", "load_s"))
floor = json.load(open(sys.argv[2]))["page_cache_read_s"]
per_turn = round(added / turns, 2) if turns else None
print(json.dumps({"residency": run.get("residency"), "duty_cycle": run.get("duty_cycle"),
  "turns_within_blocks": turns, "per_turn_start_s": per_turn, "page_cache_read_s": floor,
  "beyond_page_cache_s": None if per_turn is None else round(per_turn - floor, 2)}))' \
      "$WORK/moe-out/summary.json" "$WORK/moe-gate.json" | tee "$OUT/moe-turns.json"
    ;;
  two-first)
    rm -rf "$WORK/two" "$OUT/state.tgz"
    $PY -m benchmarks.two_hosts first --workdir "$WORK/two" --out "$OUT" ${TWO_ARGS:-}
    ;;
  planted-repo)
    # <work>/two/repo alone (main and planted-2pct, a wait of 2% of each prefill): BUNDLE and REFS
    # for decided and alternate, without two-first's job
    $PY -m benchmarks.two_hosts repo --workdir "$WORK/two" --out "$OUT"
    ;;
  two-second)
    rm -rf "$WORK/two"
    $PY -m benchmarks.two_hosts second --state "${STATE:?set STATE to the state.tgz of two-first}" \
      --workdir "$WORK/two" --out "$OUT" ${TWO_ARGS:-}
    ;;
  load)
    target=${LOAD_MODEL:-$model}
    $PY benchmarks/load_floor.py --model "$target" --repeats "${LOAD_REPEATS:-2}" \
      --methods "${LOAD_METHODS:-read_chunks,mlx_lm_load,engine_load_4,engine_load_8,engine_load_16,runner_load}" \
      | tee "$OUT/load-$(basename "$target").json"
    ;;
  summaries)
    for zip in "$WORK"/e2e-out/*.zip "$WORK"/decided*-out/*.zip "$WORK"/alternate-out/*/*.zip; do  # the service's evidence
      [ -f "$zip" ] && evidence_files "$zip" "$WORK/e2e-evidence/$(basename "$zip" .zip)" records.jsonl
    done
    (cd "$WORK" && find . -name summary.md -o -name summary.json -o -name timeline.json -o -name records.jsonl \
      -o -name provenance.json | grep -v '/state' | tar -czf "$OUT/summaries.tgz" -T -)
    ls -l "$OUT"
    ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
echo "[$(clock)] step $step done"
