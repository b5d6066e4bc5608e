"""Merge results.json files of one device (runs split over several calls) into one report: results.json,
results.md and the plots, as one `python -m jaxconv.bench` run would have written them.

python -m jaxconv.bench.merge OUT_DIR A/results.json B/results.json [...]
"""
from __future__ import annotations

import argparse
import json
import os

from . import cases as _cases
from . import device
from . import report


def merge(paths, out_dir, plots=True, commit=None):
    metas, entries, errors = [], [], []
    for path in paths:
        with open(path) as f:
            r = json.load(f)
        metas.append(r["meta"])
        errors.extend(r.get("errors", []))
        for e in r["results"]:
            e = dict(e)
            e["case_obj"] = _cases.case_from_dict(e.pop("case"))
            e.pop("case_spec", None)
            entries.append(e)
    kinds = {m.get("device_kind") for m in metas}
    if len(kinds) != 1:
        raise ValueError(f"results from different devices cannot be merged: {sorted(map(str, kinds))}")
    meta = dict(metas[0])
    meta["argv"] = [m.get("argv") for m in metas]
    meta["merged_from"] = [device.display_path(p) for p in paths]
    meta["elapsed_s"] = sum(m.get("elapsed_s") or 0 for m in metas)
    if commit:  # the commit the caller ran, where the device's metadata could not know it
        meta["git_commit"], meta["git_dirty"] = commit, None
    peaks, impls = meta["peaks"], meta.get("impls") or ["jaxconv", "lax"]
    os.makedirs(out_dir, exist_ok=True)
    report.write_json(os.path.join(out_dir, "results.json"), meta, entries, errors)
    report.write_markdown(os.path.join(out_dir, "results.md"), meta, peaks, entries, errors, impls)
    if plots:
        report.write_plots(out_dir, meta, peaks, entries, bool(meta.get("jaxconv_tensor_cores")))
    return meta, entries


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m jaxconv.bench.merge", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("results", nargs="+")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--commit", help="the commit that produced the results (overrides their metadata)")
    args = p.parse_args(argv)
    _, entries = merge(args.results, args.out_dir, plots=not args.no_plots, commit=args.commit)
    print(f"{len(entries)} measurements -> {args.out_dir}")


if __name__ == "__main__":
    main()
