"""Compare two results.json files (e.g. the same version timed twice, or before/after a kernel change).

python -m jaxconv.bench.compare A/results.json B/results.json [--impl jaxconv] [--threshold 0.05]

For each (case, dtype, op) in both: time A, time B, B/A, and whether the two 90% intervals overlap
("noise") or not ("faster"/"slower"). Run the same version twice first: differences under that spread are noise.
"""
from __future__ import annotations

import argparse
import json
import math
import sys


def _key(e):
    return (e["case"]["name"], e["dtype"], e["op"])


def compare(a, b, impl="jaxconv", threshold=0.05):
    ea = {_key(e): e for e in a["results"]}
    rows = []
    for e in b["results"]:
        k = _key(e)
        if k not in ea:
            continue
        ra, rb = ea[k]["impls"].get(impl, {}), e["impls"].get(impl, {})
        ta, tb = ra.get("time_s"), rb.get("time_s")
        if not (ta and tb and math.isfinite(ta) and math.isfinite(tb)):
            continue
        ca, cb = ra.get("ci90_s") or [None, None], rb.get("ci90_s") or [None, None]
        if None not in ca and None not in cb:
            overlap = not (cb[1] < ca[0] or ca[1] < cb[0])
        else:
            overlap = abs(tb / ta - 1) < threshold
        verdict = "noise" if overlap or abs(tb / ta - 1) < threshold else ("faster" if tb < ta else "slower")
        rows.append(dict(case=k[0], dtype=k[1], op=k[2], a_us=ta * 1e6, b_us=tb * 1e6, b_over_a=tb / ta,
                         verdict=verdict))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m jaxconv.bench.compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--impl", default="jaxconv")
    p.add_argument("--threshold", type=float, default=0.05, help="relative change always counted as noise")
    args = p.parse_args(argv)
    with open(args.a) as f:
        a = json.load(f)
    with open(args.b) as f:
        b = json.load(f)
    rows = compare(a, b, args.impl, args.threshold)
    print("| case | dtype | op | A µs | B µs | B/A | verdict |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['dtype']} | {r['op']} | {r['a_us']:.4g} | {r['b_us']:.4g} | {r['b_over_a']:.3f} | "
              f"{r['verdict']} |")
    if rows:
        g = math.exp(sum(math.log(r["b_over_a"]) for r in rows) / len(rows))
        print(f"\n{len(rows)} common entries; geometric mean B/A = {g:.3f}; "
              f"{sum(r['verdict'] == 'noise' for r in rows)} within noise")
    return 0


if __name__ == "__main__":
    sys.exit(main())
