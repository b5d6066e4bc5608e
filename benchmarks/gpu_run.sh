#!/usr/bin/env bash
# One visit to a GPU machine, in one call: build the CUDA kernels, run the whole test suite on the GPU, run
# the compute-sanitizer subset, run the benchmarks. Full logs go to $OUT (default ./gpu-out); a short table
# is printed last.
#
#   bash benchmarks/gpu_run.sh                 # everything but ab
#   bash benchmarks/gpu_run.sh tests sanitize  # a subset of: build tests sanitize bench baseline ab models
#
# ab: an A/B of this tree against the source tree in ab/old (another commit, e.g. `git archive REV | tar -x -C
# ab/old`), both built here (the old one beside this one's build step), this tree's benchmark package used for
# both; AB_PAIRS pairs of passes over the suite (default 2; old first in odd pairs, new first in even ones;
# AB_FROM: the first pair's number, default 1, so that pairs run in later calls continue the alternation;
# AB_ARGS: extra ab_suite.py run arguments), then benchmarks/ab_suite.py compare prints the slowest measurements.
# AB_BUILD=1 builds ab/old in the build step even when ab is not among the steps (for a later call on the same
# machine).
#
# models: whole-model training steps, jaxconv against lax (benchmarks/train_step.py, each model at its own batch
# and input size): MODELS (default resnet18,resnet50,mobilenetv2,convnext_t,unet3d) in MODELS_DTYPE (default
# bfloat16), and MSD in float32 when MSD=1 (the default); MODELS_ARGS: extra train_step.py arguments.
#
# Wheels in .whl/ (carried: the nvidia-cutlass headers) are installed first.
# Environment: JAXCONV_CUDA_ARCHS (default 90a), JAXCONV_FUZZ_CASES (default 300 per dtype),
# BENCH_ARGS (extra arguments for python -m jaxconv.bench), PYTEST_FILES (default tests), PYTEST_WORKERS
# (default 8), PYTEST_ARGS (extra pytest arguments), TESTS_TIMEOUT (seconds), SANITIZE_CASES (a regular expression on sanitizer_cases.py's
# case names), PACK (default 1: everything under $OUT packed into run.tgz at the end).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
steps=${*:-build tests sanitize bench}
declare -a rows
stamp() { date -u +%H:%M:%S; }
row() { rows+=("$(printf '%-10s %-8s %s' "$1" "$2" "$3")"); echo "[$(stamp)] $1: $2 $3"; }

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  # The device copy of the tree has no .git: the caller passes JAXCONV_COMMIT.
  echo "commit: ${JAXCONV_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
  $PY -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__)"
  nvcc --version | tail -1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if [[ " $steps " == *" build "* ]]; then
  t0=$(date +%s)
  # Build requirements the GPU machine's python may lack (it has no package index): wheels carried in .whl/.
  for whl in .whl/*.whl; do
    [ -e "$whl" ] && $PY -m pip install -q --no-deps --no-index "$whl" >> "$OUT/build.log" 2>&1
  done
  if [ -d ab/old ] && { [[ " $steps " == *" ab "* ]] || [ "${AB_BUILD:-0}" = 1 ]; }; then
    # The A/B's old tree builds in place beside this one (half the cores each), its .so next to its package.
    ( cd ab/old && cmake -S . -B build-ab -G Ninja -DJAXCONV_CUDA=ON -DJAXCONV_CUDA_ARCHS="${JAXCONV_CUDA_ARCHS:-90a}" \
        -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$(command -v $PY)" \
        -Dpybind11_DIR="$($PY -m pybind11 --cmakedir)" > "$OUT/build_old.log" 2>&1 \
      && cmake --build build-ab -j $(( $(nproc) / 2 )) >> "$OUT/build_old.log" 2>&1 \
      && cp build-ab/_jaxconv_native*.so jaxconv/ ) &
    old_build=$!
  fi
  # Line tables on: compute-sanitizer's reports then name source lines.
  if JAXCONV_CUDA=ON JAXCONV_CUDA_ARCHS=${JAXCONV_CUDA_ARCHS:-90a} CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
      $PY -m pip install --no-build-isolation --no-deps -v -e . -C build-dir=build/gpu \
      -C cmake.define.JAXCONV_LINEINFO=ON >> "$OUT/build.log" 2>&1; then
    row build ok "$(( $(date +%s) - t0 )) s; $($PY -c 'import jaxconv; print(jaxconv.build_info())')"
  else
    row build FAILED "see build.log"; tail -40 "$OUT/build.log"; steps=""
  fi
  if [ -n "${old_build:-}" ]; then
    if wait "$old_build"; then row build_old ok "($(( $(date +%s) - t0 )) s)"
    else row build_old FAILED "see build_old.log"; tail -20 "$OUT/build_old.log"; fi
  fi
fi

if [[ " $steps " == *" tests "* ]]; then
  t0=$(date +%s)
  # The suite is bound by XLA compile time on the host: pytest-xdist workers (when installed) share the GPU,
  # each allocating on demand.
  workers=()
  $PY -c "import xdist" 2>/dev/null && workers=(-n "${PYTEST_WORKERS:-8}")
  # TESTS_TIMEOUT (seconds, default none): stop the suite in time for the steps after it.
  XLA_PYTHON_CLIENT_PREALLOCATE=false JAXCONV_FUZZ_CASES=${JAXCONV_FUZZ_CASES:-300} \
    timeout "${TESTS_TIMEOUT:-0}" $PY -m pytest -q -rfEs -p no:cacheprovider "${workers[@]}" ${PYTEST_FILES:-tests} \
      --junitxml="$OUT/junit.xml" ${PYTEST_ARGS:-} > "$OUT/tests.log" 2>&1
  rc=$?
  row tests "$([ $rc = 0 ] && echo ok || echo FAILED)" "$(tail -1 "$OUT/tests.log") ($(( $(date +%s) - t0 )) s)"
  [ $rc = 0 ] || grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -30
fi

if [[ " $steps " == *" sanitize "* ]]; then
  # The three tools are independent processes, each instrumenting its own copy of the runs: they run side by
  # side (the GPU has room for all three), and their rows come in the tools' order.
  sanitize_one() {
    local tool=$1 t0 rc summary dev host cases
    t0=$(date +%s)
    # memcheck and racecheck instrument only jaxconv's kernels (kns: kernel-name substring). initcheck must
    # instrument every kernel: with the filter, buffers that XLA's own kernels write look uninitialised to it
    # (false reports in kernels that read XLA-written buffers, which vanish unfiltered). Its host-API reports
    # (XLA's partly uninitialised host staging buffers; jaxconv copies nothing) are counted, not failed on.
    filter=(--kernel-name kns=jaxconv --error-exitcode 86)
    [ "$tool" = initcheck ] && filter=(--print-limit 100000)
    # Command buffers off so every launch is a plain one the tool can follow. XLA's autotuning off: the tools check
    # jaxconv's kernels, and profiling dozens of cuDNN candidates under memcheck and racecheck faulted inside the
    # tool (a 3-D float32 filter gradient's candidates); cuDNN's heuristic choice still runs.
    local attempt crashed=""
    for attempt in 1 2; do
      XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_FLAGS="--xla_gpu_enable_command_buffer= --xla_gpu_autotune_level=0" \
        timeout "${SANITIZER_TIMEOUT:-300}" compute-sanitizer --tool "$tool" "${filter[@]}" \
        $PY benchmarks/sanitizer_cases.py "${SANITIZE_CASES:-}" > "$OUT/sanitize_$tool.log" 2>&1
      rc=$?
      summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize_$tool.log" | tail -1)
      # Killed by a signal before the tool's summary (rc 128+, not the timeout's 124): the tool or the process
      # crashed, which is not a finding. Run it once more and say so in the row; a second crash fails.
      [ $rc -gt 128 ] && [ -z "$summary" ] && [ $attempt = 1 ] || break
      cp "$OUT/sanitize_$tool.log" "$OUT/sanitize_$tool.crash.log"
      crashed="crashed once (rc=$rc after $(( $(date +%s) - t0 )) s, sanitize_$tool.crash.log), then: "
    done
    if [ "$tool" = initcheck ]; then
      dev=$(grep -c "Uninitialized __global__" "$OUT/sanitize_$tool.log")
      host=$(grep -c "Host API memory access error" "$OUT/sanitize_$tool.log")
      summary="$dev uninitialised device reads, $host host-API reports"
      [ "$dev" = 0 ] && [ $rc = 0 ] || rc=86
      [ $rc = 0 ] || [ "$dev" = 0 ] || grep -A1 "Uninitialized __global__" "$OUT/sanitize_$tool.log" | grep " at " | sort | uniq -c | head
    fi
    cases=$(grep -o "sanitizer cases: [0-9]* runs" "$OUT/sanitize_$tool.log" | tail -1)
    printf '%s\t%s\n' "$([ $rc = 0 ] && echo ok || echo FAILED)" \
      "$crashed${summary:-no summary}; ${cases:-no cases ran} rc=$rc ($(( $(date +%s) - t0 )) s)" > "$OUT/sanitize_$tool.row"
    [ $rc = 0 ] || tail -25 "$OUT/sanitize_$tool.log"
  }
  for tool in memcheck racecheck initcheck; do sanitize_one "$tool" & done
  wait
  for tool in memcheck racecheck initcheck; do
    status=FAILED detail="no result"
    [ -f "$OUT/sanitize_$tool.row" ] && IFS=$'\t' read -r status detail < "$OUT/sanitize_$tool.row"
    row "$tool" "$status" "$detail"
  done
fi

if [[ " $steps " == *" bench "* ]]; then
  t0=$(date +%s)
  # BENCH_TIMEOUT (seconds): stop the benchmarks in time for the packing below; results.json holds every
  # measurement finished by then (python -m jaxconv.bench.merge rebuilds the report from it).
  timeout "${BENCH_TIMEOUT:-0}" $PY -m jaxconv.bench --out "$OUT/bench" ${BENCH_ARGS:---suite benchmarks/suite.json} \
    > "$OUT/bench.log" 2>&1
  rc=$?
  row bench "$([ $rc = 0 ] && echo ok || echo FAILED)" "($(( $(date +%s) - t0 )) s) see bench/"
  [ $rc = 0 ] || tail -20 "$OUT/bench.log"
  ls "$OUT/bench"/*.md >/dev/null 2>&1 && cat "$OUT"/bench/*.md | head -80
fi

if [[ " $steps " == *" baseline "* ]]; then
  # The curated baseline of this GPU (jaxconv.bench.baseline): the suite with lax, and a random sweep.
  t0=$(date +%s)
  $PY benchmarks/ab_suite.py run --lax --label baseline --out "$OUT/suite_pass.json" --suite benchmarks/suite.json \
    > "$OUT/baseline.log" 2>&1
  $PY -m jaxconv.bench --sweep "${BASELINE_SWEEP:-150}" --seed "${BASELINE_SEED:-0}" --out "$OUT/sweep" \
    >> "$OUT/baseline.log" 2>&1
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($NF)}')
  $PY -m jaxconv.bench.baseline make --suite-pass "$OUT/suite_pass.json" --sweep "$OUT/sweep/results.json" \
    --commit "${JAXCONV_COMMIT:-unknown}" --out "$OUT/$gpu.json" >> "$OUT/baseline.log" 2>&1
  rc=$?
  row baseline "$([ $rc = 0 ] && echo ok || echo FAILED)" "($(( $(date +%s) - t0 )) s) $OUT/$gpu.json"
fi

if [[ " $steps " == *" ab "* ]] && [ -d ab/old ]; then
  t0=$(date +%s)
  rm -rf ab/old/jaxconv/bench && cp -r jaxconv/bench ab/old/jaxconv/bench  # one timing method for both builds
  passes=()
  for i in $(seq "${AB_FROM:-1}" $(( ${AB_FROM:-1} + ${AB_PAIRS:-2} - 1 ))); do
    # Odd pairs run old first, even pairs new first: a drift over the visit (clocks, temperature) cancels.
    order="old new"; [ $(( i % 2 )) = 0 ] && order="new old"
    for side in $order; do
      src=$([ $side = old ] && echo "$PWD/ab/old" || echo "$PWD")
      PYTHONPATH="$src" $PY benchmarks/ab_suite.py run --label "$side$i" --out "$OUT/ab_$side$i.json" \
        --suite benchmarks/suite.json ${AB_ARGS:-} >> "$OUT/ab.log" 2>&1 || echo "pass $side$i failed" >> "$OUT/ab.log"
    done
    passes+=("$OUT/ab_old$i.json" "$OUT/ab_new$i.json")  # compare pairs them by position: A B A B ...
  done
  $PY benchmarks/ab_suite.py compare "${passes[@]}" > "$OUT/ab_compare.txt" 2>&1
  rc=$?
  row ab "$([ $rc = 0 ] && echo ok || echo SLOWER)" "($(( $(date +%s) - t0 )) s) $(sed -n 3p "$OUT/ab_compare.txt")"
  head -30 "$OUT/ab_compare.txt"
fi

if [[ " $steps " == *" models "* ]]; then
  t0=$(date +%s)
  rc=0
  $PY benchmarks/train_step.py --models "${MODELS:-resnet18,resnet50,mobilenetv2,convnext_t,unet3d}" \
    --dtype "${MODELS_DTYPE:-bfloat16}" --out "$OUT/models" --commit "${JAXCONV_COMMIT:-unknown}" ${MODELS_ARGS:-} \
    > "$OUT/models.log" 2>&1 || rc=1
  if [ "${MSD:-1}" = 1 ]; then
    $PY benchmarks/train_step.py --models msd --dtype float32 --out "$OUT/models_msd" \
      --commit "${JAXCONV_COMMIT:-unknown}" ${MODELS_ARGS:-} >> "$OUT/models.log" 2>&1 || rc=1
  fi
  row models "$([ $rc = 0 ] && echo ok || echo FAILED)" "($(( $(date +%s) - t0 )) s) see models/, models_msd/"
  grep -E "^\| |lax/jaxconv .* target" "$OUT/models.log" | head -40
fi

echo
echo "==================== summary ===================="
cat "$OUT/env.txt"
printf '%s\n' "${rows[@]}"
printf '%s\n' "${rows[@]}" >> "$OUT/env.txt"
# PACK=1 (default) packs every log and report under $OUT into one archive, $OUT/run.tgz, for callers that
# copy back only a few files; PACK=0 leaves them as they are.
if [ "${PACK:-1}" = 1 ]; then
  (cd "$OUT" && find . -mindepth 1 -maxdepth 1 ! -name run.tgz -printf '%P\n' | tar czf run.tgz -T - \
    && find . -mindepth 1 -maxdepth 1 ! -name run.tgz -exec rm -rf {} +)
fi
