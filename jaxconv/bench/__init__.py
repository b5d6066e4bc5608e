"""jaxconv.bench: device-time benchmarks of jaxconv vs lax.conv_general_dilated (python -m jaxconv.bench --help).

Public entry points: run(argv) (the CLI), run_quick_selftest(out_dir=None) (CI smoke test, --quick),
and the building blocks in cases (suite format, --case parser, FLOP/byte model), harness (T-slope timing),
stats (fit and t-interval), trace (jax.profiler cross-check), report (JSON, markdown, PNGs); the random sweep
(--sweep N --seed S) in sweep (its distribution), sweep_timing (its timing method), sweep_report and sweep_run.
"""
from .cli import run, run_quick_selftest  # noqa: F401
from .cases import Case, load_suite, parse_case_spec  # noqa: F401
