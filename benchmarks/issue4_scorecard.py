"""Issue 4's targets (item 5) from `python -m jaxconv.bench` results.json files, row by row.

Usage: python benchmarks/issue4_scorecard.py RESULTS_JSON [RESULTS_JSON ...] > scorecard.md

- Forward, every case that does not have 16 or more input AND output channels (the dense cases belong to the
  tensor-core issue): at least 1.5x faster than lax or within 1.25x of the floor of the path used, and never slower
  than lax; the geometric mean of the speedups at least 3x.
- Forward+backward of the long 1-D filters and of the msd cases with one output channel or at most 4 channels
  (groups 1, one output channel or at most 4 in and out): at least 10x faster than lax or within 1.5x of the floor.
- conv1d 1M x 2047 float32 HIGHEST forward: at most 122 µs (2x its FP32-FMA floor).
- Every row: within 2x of its floor, or RESULTS.md explains what stops it (the last column says which rows need
  that).
- A row whose lax was compiled with XLA options of its own (--lax-autotune-level) names them beside lax's time.
Prints one table row per measurement and a summary line per target. A row (case, op, dtype) found in several files is
taken from the last of them (issue4_run.sh's focus list re-measures rows near their thresholds with more samples).
"""

import json
import statistics
import sys

DTYPE_LABEL = {"bfloat16": "bf16", "float32-highest": "f32 HIGHEST"}
CONV1D_CASE, CONV1D_LIMIT_US = "seed_conv1d_1M_k2047", 122.0
FWDBWD = "fwd+bwd"  # the op name results.json records (jaxconv.bench.cases.OPS)


def is_dense(case):
  """True for a case the forward target leaves to the tensor-core issue."""
  return case.get("groups", 1) == 1 and case["in_channels"] >= 16 and case["out_channels"] >= 16


def is_fwdbwd_target(case):
  """The fwd+bwd target's cases: one output channel (the msd c -> 1 layers, the long 1-D filters) or <= 4 channels."""
  cin, cout = case["in_channels"], case["out_channels"]
  return case.get("groups", 1) == 1 and (cout == 1 or (cin <= 4 and cout <= 4))


def verdict(ratio, x_floor):
  """The forward target: 1.5x lax or 1.25x the floor, and never slower than lax."""
  return (ratio >= 1.5 or x_floor <= 1.25) and ratio >= 1.0


def fwdbwd_verdict(ratio, x_floor):
  """The forward+backward target: 10x lax or 1.5x the floor."""
  return ratio >= 10.0 or x_floor <= 1.5


def geomean(values):
  return statistics.geometric_mean(values) if values else float("nan")


def scorecard(results):
  """Markdown lines for a results.json dict (its "results" list)."""
  lines = ["| case | op | dtype | jaxconv µs | lax µs | lax/jaxconv | x floor | source | target met | within 2x floor |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  ratios = {}
  fwd = [0, 0]
  fb = [0, 0]
  conv1d = None
  slower = 0
  for r in results["results"]:
    case, op, jc, lx = r["case"], r.get("op", "fwd"), r["impls"]["jaxconv"], r["impls"]["lax"]
    t, t_lax = jc["time_s"] * 1e6, lx["time_s"] * 1e6
    ratio, x_floor = t_lax / t, 100.0 / jc["pct_floor_jaxconv_path"]
    if op == "fwd" and not is_dense(case):
      ok = verdict(ratio, x_floor)
      if case["name"] == CONV1D_CASE and r["dtype"] == "float32-highest":
        conv1d = t
        ok = ok and t <= CONV1D_LIMIT_US
      text = "yes" if ok else "**no**"
      fwd[0] += ok
      fwd[1] += 1
      slower += ratio < 1.0
      ratios.setdefault(r["dtype"], []).append(ratio)
    elif op == "fwd":
      text = "dense: not a target"
    elif op == FWDBWD and is_fwdbwd_target(case):
      ok = fwdbwd_verdict(ratio, x_floor)
      text = "yes" if ok else "**no**"
      fb[0] += ok
      fb[1] += 1
    else:
      text = "not a target"
    # lax compiled with other XLA options (issue4_run.sh's fb_conv1d_f32 list: no autotuning) says so in its cell.
    opts = lx.get("compiler_options")
    lax_cell = f"{t_lax:.3g}" + (f" ({', '.join(f'{k}={v}' for k, v in sorted(opts.items()))})" if opts else "")
    lines.append(f"| {case['name']} | {op} | {DTYPE_LABEL.get(r['dtype'], r['dtype'])} | {t:.3g} | {lax_cell} | "
                 f"{ratio:.2f} | {x_floor:.2f} | {jc['time_source']} | {text} | "
                 f"{'yes' if x_floor <= 2.0 else '**no**: RESULTS.md'} |")
  every = [x for v in ratios.values() for x in v]
  lines.append("")
  lines.append(f"met {fwd[0]} of {fwd[1]}; geomean {geomean(every):.2f}; bf16 {geomean(ratios.get('bfloat16', [])):.2f}; "
               f"f32 HIGHEST {geomean(ratios.get('float32-highest', [])):.2f}")
  if fb[1] or conv1d is not None:
    lines.append(f"forward: {slower} slower than lax; fwd+bwd: met {fb[0]} of {fb[1]}; conv1d 1M x 2047 float32 "
                 f"HIGHEST forward: " + ("not measured" if conv1d is None else
                                         f"{conv1d:.1f} µs (limit {CONV1D_LIMIT_US:.0f})"))
  return lines


def main(argv):
  if len(argv) < 2:
    sys.exit(__doc__)
  rows = {}
  for path in argv[1:]:
    with open(path) as f:
      for r in json.load(f)["results"]:
        key = (r["case"]["name"], r.get("op", "fwd"), r["dtype"])
        rows.pop(key, None)  # a later file's row goes where that file puts it
        rows[key] = r
  print("\n".join(scorecard({"results": list(rows.values())})))


if __name__ == "__main__":
  main(sys.argv)
