#!/usr/bin/env bash
# The GUIDE.md section 4 anchor cases (lax's device time per op is known for these), on the default GPU.
# Sized to fit one 10-minute device call; results.json is rewritten after each measurement.
#   benchmarks/run_gpu_anchors.sh OUT [extra flags, e.g. --profile always]
set -euo pipefail
out="${1:-bench_results/anchors}"
shift || true
python -m jaxconv.bench --out "$out/fwd" --budget 8 \
  --filter '^(resnet50_res4_3x3_b32|resnet50_conv1_b32)$' --dtypes bfloat16,float32-highest --ops fwd "$@"
python -m jaxconv.bench --out "$out/msd" --budget 10 \
  --filter '^(seed_msd_1to1_3x3_dil[248]_1024|seed_msd_1to1_3x3_4096)$' --dtypes bfloat16,float32 \
  --ops fwd,fwdbwd "$@"
python -m jaxconv.bench --out "$out/conv1d" --budget 10 \
  --filter '^seed_conv1d_1M_k2047$' --dtypes bfloat16,float32-highest --ops fwd,fwdbwd "$@"
