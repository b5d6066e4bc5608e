#!/usr/bin/env bash
# Compare two benchmark runs: benchmarks/compare.sh A/results.json B/results.json [--impl lax]
set -euo pipefail
exec python -m jaxconv.bench.compare "$@"
