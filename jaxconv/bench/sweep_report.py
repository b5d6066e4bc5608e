"""The sweep's outputs: results.json, results.md (summary statistics, worst cases with replay commands, failures,
the distribution statement) and sweep.png (the distribution of lax/jaxconv)."""
from __future__ import annotations

import json
import math
import os
import shlex

from . import sweep as _sweep
from .report import _clean, commit_label
from .stats import percentile, ratio_summary
from .sweep_timing import failure_of

WORST = 10
METHOD = ("Per case, dtype and op: lax.conv_general_dilated and jaxconv.conv_general_dilated (same process, same "
          "inputs: random normal data, never zeros; same precision: DEFAULT, i.e. TF32 for float32 on the GPU as "
          "XLA runs it) each compiled once as one jitted function applying the op to 1-4 distinct input sets "
          "between two in-stream marks (CUDA events on XLA's stream; a host clock on the CPU); after one warm-up "
          "call each, rounds alternate the two (lax first in even rounds); time per op = median over rounds of the "
          "marked span / sets. fwd+bwd = the forward and both gradients through jax.vjp of each implementation. "
          "ratio = lax time / jaxconv time (> 1: jaxconv faster); its range = min..max of the per-round ratios. "
          "Statistics: p10 and median by linear interpolation between order statistics; geomean = exp(mean log).")


def op_cli(op: str) -> str:
    return "fwdbwd" if op == "fwd+bwd" else op


def replay_command(seed, index, scale, dtype, op) -> str:
    """The command that measures one case of a seed again, alone, with the sweep's method."""
    return (f"python -m jaxconv.bench --sweep-case {index} --seed {seed} --sweep-scale {scale} "
            f"--dtypes {dtype} --ops {op_cli(op)}")


def slope_command(case, dtype, op) -> str:
    """The same convolution through the harness's T-slope method (longer, with a confidence interval)."""
    return f"python -m jaxconv.bench --case {shlex.quote(case.short())} --dtypes {dtype} --ops {op_cli(op)}"


def config_json(case) -> dict:
    """Everything needed to rebuild the call but the dtype and precision (each measurement's): the case's fields
    and lax's own arguments."""
    from .harness import conv_kwargs
    kw = conv_kwargs(case, "float32")
    x, w, y = case.shapes()
    fields = {k: v for k, v in case.to_json().items() if k not in ("dtypes", "ops")}  # the run's, per measurement
    return dict(fields, kind=_sweep.case_kind(case), padding_mode=_sweep.case_padding_mode(case),
                spec=case.short(), x_shape=list(x), w_shape=list(w), y_shape=list(y),
                lax_args=dict(window_strides=list(kw["window_strides"]), padding=[list(p) for p in kw["padding"]],
                              lhs_dilation=list(kw["lhs_dilation"]), rhs_dilation=list(kw["rhs_dilation"]),
                              dimension_numbers=list(kw["dimension_numbers"]),
                              feature_group_count=kw["feature_group_count"],
                              batch_group_count=kw["batch_group_count"]),
                fwd_flops=case.flops("fwd"), fwdbwd_f32_bytes=_sweep.fwdbwd_bytes(case))


def measurements(records):
    """(record, measurement) pairs over every measured case."""
    return [(r, m) for r in records for m in r.get("measurements", [])]


def summarize(records, dtypes, ops) -> dict:
    """{"dtype op" | "dtype" (all its ops, when there are several) | "all": ratio_summary + failed + mismatched}."""
    groups = {f"{d} {o}": (lambda m, d=d, o=o: m["dtype"] == d and m["op"] == o) for d in dtypes for o in ops}
    if len(ops) > 1:
        groups.update({d: (lambda m, d=d: m["dtype"] == d) for d in dtypes})
    groups["all"] = lambda m: True
    out = {}
    for key, member in groups.items():
        ms = [m for _, m in measurements(records) if member(m)]
        ratios = [m["ratio"] for m in ms if m.get("ratio") is not None]
        out[key] = dict(ratio_summary(ratios), failed=sum(1 for m in ms if failure_of(m)),
                        mismatched=sum(1 for m in ms if m.get("mismatch")))
    return out


def spread_summary(records) -> dict:
    """How noisy the ratios are: per measurement, half the per-round range relative to the ratio."""
    rel = [0.5 * (m["ratio_range"][1] - m["ratio_range"][0]) / m["ratio"] for _, m in measurements(records)
           if m.get("ratio") and m.get("ratio_range")]
    if not rel:
        return dict(n=0)
    return dict(n=len(rel), median=percentile(rel, 50), p90=percentile(rel, 90), max=max(rel))


def worst(records, k=WORST):
    ok = [(r, m) for r, m in measurements(records) if m.get("ratio") is not None]
    return sorted(ok, key=lambda rm: rm[1]["ratio"])[:k]


def write_json(path, meta, records, summary, recheck):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_clean(dict(meta=meta, summary=summary, spread=spread_summary(records), recheck=recheck,
                              cases=[{k: v for k, v in r.items() if k != "case_obj"} for r in records])),
                  f, indent=1, allow_nan=False)
    os.replace(tmp, path)


def n_cases_label(meta):
    n = meta["n_cases"]
    if n == 1:
        return f"case {meta['indices'][0]}"
    return f"{n} cases"


def _f(v, fmt=".3g"):
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


def _us(s):
    return "-" if s is None else f"{s * 1e6:.4g}"


def summary_table(summary) -> list:
    L = ["| dtype op | n | min | p10 | median | geomean | max | < 0.7 | < 0.9 | >= 1 | failed | outputs differ |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, s in summary.items():
        L.append(f"| {key} | {s.get('n', 0)} | {_f(s.get('min'))} | {_f(s.get('p10'))} | {_f(s.get('median'))} | "
                 f"{_f(s.get('geomean'))} | {_f(s.get('max'))} | {s.get('below_0_7', 0)} | {s.get('below_0_9', 0)} | "
                 f"{s.get('at_least_1', 0)} | {s['failed']} | {s['mismatched']} |")
    return L


def variants_cell(variants) -> str:
    """The variants a measurement's ops ran, for a table cell: "fwd implicit_gemm.sm90, dgrad xla.conv"; "-" when not
    recorded (off the GPU)."""
    if not variants:
        return "-"
    return ", ".join(f"{op} {name}" for op, name in variants.items())


def write_markdown(path, meta, records, summary, recheck):
    seed, scale = meta["seed"], meta["scale"]
    L = [f"# jaxconv random sweep: seed {seed}, {n_cases_label(meta)}, {meta.get('device_kind')} "
         f"({meta.get('platform')})", ""]
    L.append(f"- date {meta.get('date')}, jax {meta.get('jax')}, jaxlib {meta.get('jaxlib')}, git "
             f"{commit_label(meta)}{' (dirty)' if meta.get('git_dirty') else ''}; scale '{scale}'"
             + (" (the CPU's small sizes: the distribution's structure, not its sizes)" if scale == "tiny" else "")
             + f"; dtypes {', '.join(meta['dtypes'])}; ops {', '.join(meta['ops'])}.")
    L.append(f"- elapsed {meta.get('elapsed_s', 0):.0f} s: drawing {meta.get('draw_s', 0):.1f} s, compiling "
             f"{meta.get('compile_s', 0):.0f} s (inputs drawn meanwhile), inputs on the device "
             f"{meta.get('inputs_s', 0):.0f} s, timing {meta.get('timing_s', 0):.0f} s; budget "
             f"{meta.get('budget_s')} s.")
    skipped = meta.get("skipped_indices") or []
    if skipped:
        L.append(f"- **{len(skipped)} of {meta['n_cases']} cases not measured: the budget ran out** "
                 f"(indices {', '.join(map(str, skipped))}); the statistics cover the rest.")
    L += ["", "## lax time / jaxconv time (> 1: jaxconv faster)", ""] + summary_table(summary)
    sp = spread_summary(records)
    L.append("")
    if sp.get("n"):
        L.append(f"Noise: half the range of the per-round ratios, relative to the ratio: median "
                 f"{100 * sp['median']:.1f}%, 90th percentile {100 * sp['p90']:.1f}%, max {100 * sp['max']:.1f}% "
                 f"over {sp['n']} measurements.")
    if recheck:
        L += ["", "Timed twice (the lowest ratios, compiled and timed again after the sweep):", "",
              "| case | dtype op | ratio | again | again / first |", "|---|---|---|---|---|"]
        for c in recheck:
            L.append(f"| {c['name']} | {c['dtype']} {c['op']} | {_f(c['ratio'])} | {_f(c.get('ratio_again'))} | "
                     f"{_f(c.get('again_over_first'))} |")
    L += ["", f"## The {WORST} lowest ratios", "",
          "| # | lax/jc [range] | dtype op | lax µs | jaxconv µs | case | kind | layout | config | auto runs |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    worst_list = worst(records)
    for n, (r, m) in enumerate(worst_list, 1):
        rr = m.get("ratio_range")
        rng = f" [{_f(rr[0])}, {_f(rr[1])}]" if rr else ""
        notes = (["outputs differ"] if m.get("mismatch") else []) + m["impls"]["jaxconv"].get("flags", [])
        flag = f" ({'; '.join(notes)})" if notes else ""
        L.append(f"| {n} | {_f(m['ratio'])}{rng}{flag} | {m['dtype']} {m['op']} | "
                 f"{_us(m['impls']['lax'].get('time_s'))} | {_us(m['impls']['jaxconv'].get('time_s'))} | "
                 f"{r['name']} | {r['config']['kind']} | "
                 f"{'NC..' if r['config']['layout'] == 'channels_first' else 'N..C'} | `{r['config']['spec']}` "
                 f"(padding {r['config']['padding_mode']}) | {variants_cell(m.get('variants'))} |")
    if worst_list:
        L += ["", "Replay one alone (the sweep's method; add `--out DIR`), or through the T-slope harness:", "", "```"]
        for n, (r, m) in enumerate(worst_list, 1):
            L.append(f"{replay_command(seed, r['index'], scale, m['dtype'], m['op'])}   # {n}")
        for n, (r, m) in enumerate(worst_list, 1):
            L.append(f"{slope_command(r['case_obj'], m['dtype'], m['op'])}   # {n}")
        L.append("```")
    fails = [(r, m) for r, m in measurements(records) if failure_of(m)]
    L += ["", f"## Failures ({len(fails)})", ""]
    L += [f"- {r['name']} `{r['config']['spec']}` {m['dtype']} {m['op']}: {failure_of(m)[:300]}" for r, m in fails]
    if not fails:
        L.append("none")
    L += ["", "## Method", "", METHOD, "", f"## Distribution (seed {seed})", "", _sweep.distribution_markdown(), ""]
    with open(path, "w") as f:
        f.write("\n".join(L))


def write_plot(path, meta, records, dtypes, ops):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import numpy as np

    fig, (ax, hx) = plt.subplots(1, 2, figsize=(12, 4.8))
    series = {}
    for _, m in measurements(records):
        if m.get("ratio") is not None:
            series.setdefault(f"{m['dtype']} {m['op']}", []).append(m["ratio"])
    all_r = [v for s in series.values() for v in s]
    for key, v in series.items():
        v = np.sort(np.asarray(v))
        q = (np.arange(len(v)) + 0.5) / len(v)
        s = ratio_summary(v.tolist())
        ax.plot(q, v, marker=".", ms=3, lw=1, label=f"{key}: median {s['median']:.3g}, geomean {s['geomean']:.3g}")
    if all_r:
        lo, hi = min(all_r + [0.5]), max(all_r + [2.0])
        bins = np.logspace(math.log10(lo) - 0.05, math.log10(hi) + 0.05, 40)
        for key, v in series.items():
            hx.hist(v, bins=bins, label=key, histtype="step", lw=1.5)
        hx.set_xscale("log")
    for a in (ax, hx):
        line = a.axhline if a is ax else a.axvline
        line(1.0, color="k", lw=1)
        for mark in (0.7, 0.9):
            line(mark, color="r", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xlabel("fraction of cases (sorted by ratio)")
    ax.set_ylabel("lax time / jaxconv time (> 1: jaxconv faster)")
    ax.text(0.01, 0.7, " 0.7", color="r", fontsize=7, va="bottom", transform=ax.get_yaxis_transform())
    ax.text(0.01, 0.9, " 0.9", color="r", fontsize=7, va="bottom", transform=ax.get_yaxis_transform())
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_xlim(0.0, 1.0)
    hx.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    hx.set_xlabel("lax time / jaxconv time")
    hx.set_ylabel("measurements")
    hx.legend(fontsize=7)
    nfail = sum(1 for _, m in measurements(records) if failure_of(m))
    fig.suptitle(f"jaxconv random sweep: seed {meta['seed']}, {n_cases_label(meta)} (scale {meta['scale']}), "
                 f"{meta.get('device_kind')}, jax {meta.get('jax')}, git {commit_label(meta)}; "
                 f"{nfail} failed (not plotted); lines at 1.0, 0.9, 0.7", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def console_lines(meta, records, summary) -> list:
    """What the run prints last: the summary per dtype and op, the worst case's replay command."""
    L = [f"sweep seed {meta['seed']}: {n_cases_label(meta)} (scale {meta['scale']}) on {meta.get('device_kind')}; "
         f"lax time / jaxconv time (> 1: jaxconv faster)",
         f"{'dtype op':24s} {'n':>4s} {'min':>7s} {'p10':>7s} {'median':>7s} {'geomean':>7s} {'<0.7':>5s} "
         f"{'failed':>6s}"]
    for key, s in summary.items():
        L.append(f"{key:24s} {s.get('n', 0):4d} {_f(s.get('min')):>7s} {_f(s.get('p10')):>7s} "
                 f"{_f(s.get('median')):>7s} {_f(s.get('geomean')):>7s} {s.get('below_0_7', 0):5d} {s['failed']:6d}")
    sp = spread_summary(records)
    if sp.get("n"):
        L.append(f"noise: per-round ratio half-range median {100 * sp['median']:.1f}%, p90 {100 * sp['p90']:.1f}%")
    w = worst(records, 1)
    if w:
        r, m = w[0]
        L.append(f"worst: {_f(m['ratio'])} {r['name']} {m['dtype']} {m['op']}: "
                 f"{replay_command(meta['seed'], r['index'], meta['scale'], m['dtype'], m['op'])}")
    if meta.get("skipped_indices"):
        L.append(f"NOT MEASURED (budget): {len(meta['skipped_indices'])} cases")
    return L
