#!/usr/bin/env bash
# CPU smoke run of the benchmark harness (tiny cases; < 2 minutes on a 2-core CPU).
set -euo pipefail
exec python -m jaxconv.bench --quick --out "${1:-bench_results/quick}" "${@:2}"
