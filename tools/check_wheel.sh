#!/usr/bin/env bash
# The wheel check: builds the CPU-only wheel (tools/build_wheel.sh --cpu), installs it into a fresh virtual
# environment taking binary packages only with the compilers hidden (so nothing can be compiled at install), and runs
# tools/wheel_smoke.py from outside the source tree (import from site-packages, a convolution and its gradients
# against lax).
#
#   tools/check_wheel.sh                      # build the CPU wheel for python3, then check it
#   tools/check_wheel.sh --python PY          # the same for another interpreter
#   tools/check_wheel.sh --wheel FILE [--expect-cuda]   # check a wheel built before (--expect-cuda: on a GPU
#                                                       # machine, fail unless its CUDA kernels run)
#   tools/check_wheel.sh --no-index --python PY --wheel FILE   # offline: the wheel alone, into a directory on
#                                             # PYTHONPATH; PY's environment must already hold jax and numpy
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

py=python3 wheel="" smoke_args=() offline=0
while [ $# -gt 0 ]; do
  case "$1" in
    --python) py="$2"; shift ;;
    --wheel) wheel="$2"; shift ;;
    --expect-cuda) smoke_args+=(--expect-cuda) ;;
    --no-index) offline=1 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "check_wheel.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -z "$wheel" ]; then
  tools/build_wheel.sh --cpu --python "$py" --out "$work/dist" | tee "$work/build.log"
  wheel=$(tail -1 "$work/build.log")
fi
wheel=$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")
case "$(basename "$wheel")" in
  *manylinux*) ;;
  *) echo "check_wheel.sh: $wheel is not a manylinux wheel" >&2; exit 1 ;;
esac

# No compiler at install: every compiler on the PATH is shadowed by one that fails, and pip takes wheels only.
mkdir -p "$work/nocc"
for cc in cc c++ gcc g++ clang clang++ nvcc ld; do
  printf '#!/bin/sh\necho "%s: no compiler during the wheel check" >&2\nexit 1\n' "$cc" > "$work/nocc/$cc"
  chmod +x "$work/nocc/$cc"
done
pip_args=(--only-binary=:all:)
if [ "$offline" = 1 ]; then
  # The interpreter's own environment provides jax; the wheel alone goes into a directory of its own.
  run=("$py")
  PATH="$work/nocc:$PATH" CC=false CXX=false CUDACXX=false \
    "$py" -m pip install -q "${pip_args[@]}" --no-index --no-deps --target "$work/site" "$wheel"
  export PYTHONPATH="$work/site"
else
  "$py" -m venv "$work/venv"
  run=("$work/venv/bin/python")
  PATH="$work/nocc:$PATH" CC=false CXX=false CUDACXX=false \
    "$work/venv/bin/python" -m pip install -q "${pip_args[@]}" "$wheel"
fi
echo "check_wheel.sh: installed $(basename "$wheel") without a compiler"

# From a scratch directory, so that `import jaxconv` cannot find the source tree.
cd "$work"
"${run[@]}" "$repo/tools/wheel_smoke.py" --source-tree "$repo" "${smoke_args[@]}"
