#!/usr/bin/env bash
# Issue 4's measurement lists on a GPU, on a tree that `gpu_run.sh build` has built: each list is one
# `python -m jaxconv.bench` run, then `issue4_scorecard.py` over every list that finished.
#
#   bash benchmarks/issue4_run.sh [fwd] [fb_fast] [fb_slow] [fb_conv1d_f32] [focus]   # default: the first three
#
# fwd:     the forward of every case of issue 4's item 4 (dense ones are measured but not scored), bf16 and
#          float32 HIGHEST (161 s on an H100, 2026-11-28, before ResNet-50's batch-128 stem joined the list: a first
#          layer with 3 input channels, like the batch-32 one);
# fb_fast: forward+backward of the undilated msd cases with <= 4 channels or one output channel (163 s);
# fb_slow: forward+backward of the dilated 1 -> 1 msd cases (lax's gradients take 40-200 ms) in both dtypes and
#          of the long 1-D filters in bf16 (about 90 s on an H100);
# fb_conv1d_f32: forward+backward of the long 1-D filters in float32 HIGHEST, in a call of its own. lax's
#          compilation of these gradients, cuDNN's autotuning, had not finished after 150 s (1M) and 235 s (1.5M) on
#          an H100 at XLA's default level 4, nor after 520 s (1M) on an H200 at level 2 (2026-11-28). So this list
#          compiles lax with --lax-autotune-level 0, cuDNN's heuristic choice without autotuning (an H200 compiled
#          each in 0.2 s); the scorecard names that level beside lax's times.
# focus:   the rows that sat near their thresholds on the H100 (msd 4->4; msd 1->1 256², whose float32 forward was
#          1.05x lax; MobileNetV2's 3x3 layers), fwd and fwd+bwd, with six times the timing budget, T up to 16 and 10
#          repeats (about 4 min); the scorecard takes these rows in place of the same rows of the other lists.
# Environment: OUT (default ./gpu-out), DEADLINE (a `date +%s` time by which every list must have stopped: each
# list's time guard is what is left of it; results.json keeps every measurement finished by then), JAXCONV_COMMIT
# (the device copy of the tree has no .git), BENCH_EXTRA (more flags for every list).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
lists=${*:-fwd fb_fast fb_slow}
common=(--budget 1 --ts 1,2,4,8 --repeats 4 --profile always)
both=bfloat16,float32-highest

run_list() {  # name ops filter dtypes [more flags]
  local t0=$(date +%s) guard=0
  if [ -n "${DEADLINE:-}" ]; then
    guard=$(( DEADLINE - t0 ))
    [ $guard -gt 20 ] || { echo "[issue4_run] $1: skipped, past the deadline"; return; }
  fi
  timeout "$guard" $PY -m jaxconv.bench --out "$OUT/$1" --ops "$2" --filter "$3" --dtypes "$4" "${common[@]}" \
    "${@:5}" ${BENCH_EXTRA:-} > "$OUT/$1.log" 2>&1
  echo "[issue4_run] $1: rc=$? in $(( $(date +%s) - t0 )) s"
}

for l in $lists; do
  case $l in
    fwd) run_list fwd fwd \
      '^(seed_msd_|seed_conv1d_1|mobilenetv2_dw|convnext_dw|replknet_dw|mamba_|seed_casestudy_|seed_tutorial_|resnet50_conv1_b)' \
      $both ;;
    fb_fast) run_list fb_fast fwdbwd '^(seed_msd_1to1_3x3_(256|1024|4096)$|seed_msd_4to|seed_msd_16to1_|seed_msd_64to1_)' $both ;;
    fb_slow)
      run_list fb_slow fwdbwd '^seed_msd_1to1_3x3_dil' $both
      run_list fb_conv1d fwdbwd '^seed_conv1d_1' bfloat16 ;;
    fb_conv1d_f32) run_list fb_conv1d_f32 fwdbwd '^seed_conv1d_1' float32-highest --lax-autotune-level 0 ;;
    focus) run_list focus fwd,fwdbwd '^(seed_msd_4to4_3x3_512$|seed_msd_1to1_3x3_256$|mobilenetv2_dw3x3_)' $both \
      --budget 6 --ts 1,2,4,8,16 --repeats 10 ;;
    *) echo "unknown list $l"; exit 2 ;;
  esac
done

jsons=()
# A later list's rows replace an earlier's (issue4_scorecard.py).
for l in fwd fb_fast fb_slow fb_conv1d fb_conv1d_f32 focus; do
  [ -f "$OUT/$l/results.json" ] && jsons+=("$OUT/$l/results.json")
done
if [ ${#jsons[@]} -eq 0 ]; then
  echo "[issue4_run] no list wrote a results.json"
  exit 1
fi
$PY benchmarks/issue4_scorecard.py "${jsons[@]}" | tee "$OUT/scorecard.md"
