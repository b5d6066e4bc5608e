"""Issue 4's forward scorecard from a `python -m jaxconv.bench` results.json.

Usage: python benchmarks/issue4_scorecard.py RESULTS_JSON > scorecard.md

The forward target (issue 4, item 5) covers every case that does not have 16 or more input AND output channels
(the dense cases belong to the tensor-core issue): at least 1.5x faster than lax or within 1.25x of the floor of
the path used, and never slower than lax; the geometric mean of the speedups at least 3x. Prints one row per
measurement and a last line with the count met and the geometric means (all, bf16, float32 HIGHEST).
"""

import json
import statistics
import sys

DTYPE_LABEL = {"bfloat16": "bf16", "float32-highest": "f32 HIGHEST"}


def is_dense(case):
  """True for a case the forward target leaves to the tensor-core issue."""
  return case.get("groups", 1) == 1 and case["in_channels"] >= 16 and case["out_channels"] >= 16


def verdict(ratio, x_floor):
  """The forward target: 1.5x lax or 1.25x the floor, and never slower than lax."""
  return (ratio >= 1.5 or x_floor <= 1.25) and ratio >= 1.0


def geomean(values):
  return statistics.geometric_mean(values) if values else float("nan")


def scorecard(results):
  """Markdown lines for a results.json dict (its "results" list)."""
  lines = ["| case | dtype | jaxconv µs | lax µs | lax/jaxconv | x floor | source | target met |",
           "|---|---|---|---|---|---|---|---|"]
  ratios = {}
  met = total = 0
  for r in results["results"]:
    case, jc, lx = r["case"], r["impls"]["jaxconv"], r["impls"]["lax"]
    t, t_lax = jc["time_s"] * 1e6, lx["time_s"] * 1e6
    ratio, x_floor = t_lax / t, 100.0 / jc["pct_floor_jaxconv_path"]
    if is_dense(case):
      text = "dense: not a target"
    else:
      ok = verdict(ratio, x_floor)
      text = "yes" if ok else "**no**"
      total += 1
      met += ok
      ratios.setdefault(r["dtype"], []).append(ratio)
    lines.append(f"| {case['name']} | {DTYPE_LABEL.get(r['dtype'], r['dtype'])} | {t:.3g} | {t_lax:.3g} | "
                 f"{ratio:.2f} | {x_floor:.2f} | {jc['time_source']} | {text} |")
  every = [x for v in ratios.values() for x in v]
  lines.append("")
  lines.append(f"met {met} of {total}; geomean {geomean(every):.2f}; bf16 {geomean(ratios.get('bfloat16', [])):.2f}; "
               f"f32 HIGHEST {geomean(ratios.get('float32-highest', [])):.2f}")
  return lines


def main(argv):
  if len(argv) != 2:
    sys.exit(__doc__)
  with open(argv[1]) as f:
    print("\n".join(scorecard(json.load(f))))


if __name__ == "__main__":
  main(sys.argv)
