"""Derived metrics (TFLOP/s, roofline floors, ratios) and the outputs: JSON, markdown, PNGs."""
from __future__ import annotations

import json
import math
import os
import re

from . import cases as _cases
from .device import best_path_peak, jaxconv_path_peak

METHOD = ("Device time per op = slope b of a least-squares fit time = a + b*T, T = number of distinct input sets "
          "one jitted function processes (all outputs returned; jaxconv custom-call count checked in the HLO); "
          "time = the device time between two in-stream marks placed before and after the T ops (CUDA events on "
          "XLA's stream; a host clock on the CPU), so the host's dispatch work per input set, which the wall time "
          "of call + block_until_ready includes, stays out of b; after warm-up, T values and implementations "
          "interleaved, one-sided outlier trim (median + 5 MAD); 90% t-interval on b. Poor fits (b <= 0, R^2 < 0.9, "
          "CI half-width > 50%, or per-T-minimum fit off by > 2x) are flagged; then every implementation of that measurement is timed "
          "by the jax.profiler busy time per op (time_source = profiler; one source per ratio), and where the "
          "profiler has no time, a poor fit alone falls back to the fit over per-T minima (min-fit). "
          "FLOPs = 2*MACs of the dense conv (taps over padding included; groups, strides, dilations counted); "
          "fwd+bwd = 3x. Floor = max(FLOPs/peak, compulsory bytes/copy bandwidth) + launch term * kernels "
          "(1 per op, 3 for fwd+bwd). 'best' floor: the best path for the dtype (bf16/fp16 tensor core, "
          "float32 = TF32 tensor core as lax DEFAULT, float32-highest = FP32 FMA); 'jaxconv path' floor: the peak "
          "jaxconv's kernels can reach (FP32 FMA unless --jaxconv-tensor-cores). %floor = floor/time.")


def _fin(v):
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def commit_label(meta: dict) -> str:
    """The run's commit for titles: full hashes cut to 10 digits, other text (a merge's "abc (bf16), def
    (float32)") kept whole."""
    return re.sub(r"\b([0-9a-f]{10})[0-9a-f]+\b", r"\1", meta.get("git_commit") or "?")


def derive(entry: dict, peaks: dict, jaxconv_tc: bool) -> dict:
    case, dtype, op = entry["case_obj"], entry["dtype"], entry["op"]
    _, _, itemsize = _cases.dtype_info(dtype)
    flops = case.flops(op)
    nbytes = case.min_bytes(op, itemsize)
    bw = peaks["copy_bw"]
    launch = peaks.get("launch_us", 0.0) * 1e-6 * _cases.KERNELS_PER_OP[op]
    floors = {}
    for key, (pk, label) in (("best", best_path_peak(dtype, peaks)),
                             ("jaxconv_path", jaxconv_path_peak(dtype, peaks, jaxconv_tc))):
        t_c, t_m = flops / peaks[pk], nbytes / bw
        floors[key] = dict(peak=pk, peak_flops=peaks[pk], path=label, compute_s=t_c, memory_s=t_m,
                           launch_s=launch, floor_s=max(t_c, t_m) + launch,
                           bound="compute" if t_c >= t_m else "memory")
    entry.update(flops=flops, min_bytes=nbytes, intensity=flops / nbytes if nbytes else None, floors=floors)
    for impl, r in entry.get("impls", {}).items():
        t = r.get("time_s")
        if _fin(t) and t > 0:
            r["tflops"] = flops / t / 1e12
            r["pct_floor_best"] = 100.0 * floors["best"]["floor_s"] / t
            if impl == "jaxconv":
                r["pct_floor_jaxconv_path"] = 100.0 * floors["jaxconv_path"]["floor_s"] / t
    jc, lx = entry.get("impls", {}).get("jaxconv", {}), entry.get("impls", {}).get("lax", {})
    tj, tl = jc.get("time_s"), lx.get("time_s")
    if _fin(tj) and _fin(tl) and tj > 0 and tl > 0:
        entry["ratio_lax_over_jaxconv"] = tl / tj
        cj, cl = jc.get("ci90_s") or [None, None], lx.get("ci90_s") or [None, None]
        if all(_fin(v) and v > 0 for v in (*cj, *cl)):
            entry["ratio_range"] = [cl[0] / cj[1], cl[1] / cj[0]]
    return entry


def entry_json(entry: dict, keep_samples: bool = True) -> dict:
    e = {k: v for k, v in entry.items() if k != "case_obj"}
    e["case"] = entry["case_obj"].to_json()
    e["case_spec"] = entry["case_obj"].short()
    if not keep_samples:
        for r in e.get("impls", {}).values():
            r.pop("samples", None)
    return e


def _clean(o):
    """Strict JSON: NaN/inf -> null, tuples -> lists, unknown objects -> str."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if o is None or isinstance(o, (str, int, bool)):
        return o
    try:
        return _clean(float(o))
    except Exception:
        return str(o)


def write_json(path, meta, entries, errors):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_clean(dict(meta=meta, results=[entry_json(e) for e in entries], errors=errors)), f, indent=1,
                  allow_nan=False)
    os.replace(tmp, path)


def summary_lines(entries):
    """Geometric-mean lax/jaxconv ratio per (dtype, op) and overall."""
    groups = {}
    for e in entries:
        v = e.get("ratio_lax_over_jaxconv")
        if _fin(v) and v > 0:
            groups.setdefault((e["dtype"], e["op"]), []).append(v)
            groups.setdefault(("all", "all"), []).append(v)
    out = []
    for (d, o), v in sorted(groups.items(), key=lambda kv: (kv[0] == ("all", "all"), kv[0])):
        g = math.exp(sum(math.log(x) for x in v) / len(v))
        out.append(f"| {d} | {o} | {len(v)} | {g:.3g} | {min(v):.3g} | {max(v):.3g} |")
    if not out:
        return []
    return ["| dtype | op | n | geomean lax/jc | min | max |", "|---|---|---|---|---|---|"] + out


def _us(s):
    if not _fin(s):
        return "-"
    us = s * 1e6
    return f"{us:.3g}" if us < 1000 else f"{us:,.0f}"


def _cell(r):
    if not r:
        return "-"
    if "error" in r:
        return "error"
    t = r.get("time_s")
    ci = r.get("ci90_s") or [None, None]
    s = _us(t)
    if _fin(t) and _fin(ci[0]) and _fin(ci[1]) and t > 0:
        s += f" ±{100 * (ci[1] - ci[0]) / 2 / t:.0f}%"
    if r.get("time_source", "fit") != "fit":
        s += f" ({r['time_source'].split('(')[0]})"
    return s


def write_markdown(path, meta, peaks, entries, errors, impls):
    L = []
    L.append(f"# jaxconv benchmark: {meta.get('device_kind')} ({meta.get('platform')})\n")
    L.append(f"- date {meta.get('date')}, jax {meta.get('jax')}, jaxlib {meta.get('jaxlib')}, git "
             f"{commit_label(meta)}{' (dirty)' if meta.get('git_dirty') else ''}, host "
             f"{meta.get('host')}")
    L.append(f"- peaks: {peaks.get('notes')}")
    L.append(f"- floor 'best' = best path for the dtype; 'jc path' = jaxconv's own path "
             f"({'tensor cores' if meta.get('jaxconv_tensor_cores') else 'FP32 FMA, no tensor cores'}).")
    L.append(f"- method: {METHOD}")
    for impl, opts in sorted((meta.get("compiler_options") or {}).items()):
        L.append(f"- {impl} compiled with XLA options {opts}.")
    L.append("- times are device µs per op, ± = half-width of the 90% CI relative to the time; "
             "(profiler)/(min-fit)/(upper-bound) = fallback source after a poor fit.\n")
    has_torch = "torch" in impls
    summ = summary_lines(entries)
    if summ:
        L.append("## Summary (lax time / jaxconv time; > 1: jaxconv faster)\n")
        L += summ
        L.append("\n## Per measurement\n")
    hdr = ["case", "dtype", "op", "jaxconv µs", "lax µs"] + (["torch µs"] if has_torch else []) + [
        "lax/jc", "jc TFLOP/s", "lax TFLOP/s", "floor µs best (jc path)", "jc %floor best (jc path)",
        "lax %floor", "R² jc/lax", "rel err", "flags"]
    L.append("| " + " | ".join(hdr) + " |")
    L.append("|" + "---|" * len(hdr))
    for e in entries:
        im = e.get("impls", {})
        jc, lx, tc = im.get("jaxconv", {}), im.get("lax", {}), im.get("torch", {})
        fl = e.get("floors", {})
        ratio = e.get("ratio_lax_over_jaxconv")
        rr = e.get("ratio_range")
        rs = f"{ratio:.2f}" if _fin(ratio) else "-"
        if rr:
            rs += f" [{rr[0]:.2f}, {rr[1]:.2f}]"
        def pct(r, k):
            return f"{r[k]:.1f}" if _fin(r.get(k)) else "-"
        r2 = "/".join(f"{x['fit']['r2']:.3f}" if x.get("fit") and _fin(x["fit"].get("r2")) else "-" for x in (jc, lx))
        flags = []
        for nm, r in im.items():
            if r.get("error"):
                flags.append(f"{nm}: {r['error'][:80]}")
            elif r.get("flags"):
                flags.append(f"{nm}: {', '.join(str(f) for f in r['flags'])}")
        flags += e.get("notes", [])
        row = [e["case_obj"].name, e["dtype"], e["op"], _cell(jc), _cell(lx)] + ([_cell(tc)] if has_torch else []) + [
            rs, f"{jc['tflops']:.3g}" if _fin(jc.get("tflops")) else "-",
            f"{lx['tflops']:.3g}" if _fin(lx.get("tflops")) else "-",
            f"{_us(fl.get('best', {}).get('floor_s'))} ({_us(fl.get('jaxconv_path', {}).get('floor_s'))})",
            f"{pct(jc, 'pct_floor_best')} ({pct(jc, 'pct_floor_jaxconv_path')})", pct(lx, "pct_floor_best"), r2,
            f"{e['rel_err']:.1e}" if _fin(e.get("rel_err")) else "-", "; ".join(flags).replace("|", "/")]
        L.append("| " + " | ".join(row) + " |")
    if errors:
        L.append("\n## Errors\n")
        for er in errors:
            L.append(f"- {er}")
    L.append("")
    with open(path, "w") as f:
        f.write("\n".join(L))


def write_plots(out_dir, meta, peaks, entries, jaxconv_tc):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import LogNorm

    files = []
    # 1. speedup heat map: rows = cases, columns = (dtype, op); value = lax time / jaxconv time (>1: jaxconv faster)
    rows = list(dict.fromkeys(e["case_obj"].name for e in entries))
    cols = list(dict.fromkeys((e["dtype"], e["op"]) for e in entries))
    M = np.full((len(rows), len(cols)), np.nan)
    for e in entries:
        v = e.get("ratio_lax_over_jaxconv")
        if _fin(v):
            M[rows.index(e["case_obj"].name), cols.index((e["dtype"], e["op"]))] = v
    if rows and cols:
        fig, ax = plt.subplots(figsize=(4.5 + 0.9 * len(cols), 2.0 + 0.32 * len(rows)))
        finite = M[np.isfinite(M)]
        lim = max(2.0, float(np.max(np.maximum(finite, 1 / finite)))) if finite.size else 2.0
        im = ax.imshow(np.ma.masked_invalid(M), cmap="RdYlGn", norm=LogNorm(1 / lim, lim), aspect="auto")
        for i in range(len(rows)):
            for j in range(len(cols)):
                if np.isfinite(M[i, j]):
                    ax.text(j, i, f"{M[i, j]:.2g}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(cols)), [f"{d}\n{o}" for d, o in cols], fontsize=7, rotation=45, ha="right")
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
        fig.colorbar(im, ax=ax, label="lax / jaxconv time\n(>1: jaxconv faster)", fraction=0.05, pad=0.02)
        ax.set_title(f"jaxconv speedup over lax.conv_general_dilated\n{meta.get('device_kind')}, jax {meta.get('jax')}, "
                     f"git {commit_label(meta)}", fontsize=9)
        fig.tight_layout()
        p = os.path.join(out_dir, "speedup.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        files.append(p)

    # 2. roofline: achieved FLOP/s vs arithmetic intensity (FLOPs / compulsory bytes)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    markers = {"jaxconv": "o", "lax": "s", "torch": "^"}
    colors = {"fwd": "C0", "dgrad": "C1", "wgrad": "C2", "fwd+bwd": "C3"}
    xs_all = []
    for e in entries:
        ai = e.get("intensity")
        if not _fin(ai):
            continue
        for impl, r in e.get("impls", {}).items():
            t = r.get("tflops")
            if _fin(t) and t > 0:
                ax.scatter(ai, t * 1e12, marker=markers.get(impl, "x"), color=colors.get(e["op"], "k"),
                           facecolors="none" if impl == "lax" else None, s=28, alpha=0.8)
                xs_all.append(ai)
    if xs_all:
        x = np.logspace(np.log10(min(xs_all) / 2), np.log10(max(xs_all) * 2), 200)
        bw = peaks["copy_bw"]
        seen = set()
        for pk, style in (("bf16_tc", "-"), ("tf32_tc", "--"), ("fp32_fma", ":")):
            if peaks[pk] in seen:
                continue
            seen.add(peaks[pk])
            what = ("CPU GEMM (measured)" if meta.get("platform") == "cpu" else
                    {"bf16_tc": "bf16 tensor core", "tf32_tc": "TF32 tensor core", "fp32_fma": "FP32 FMA"}[pk])
            ax.plot(x, np.minimum(peaks[pk], bw * x), "k" + style, lw=1,
                    label=f"roof: {what} {peaks[pk] / 1e12:.3g} TFLOP/s, copy {bw / 1e12:.3g} TB/s")
        ax.set_xscale("log")
        ax.set_yscale("log")
    for impl, m in markers.items():
        ax.scatter([], [], marker=m, color="gray", facecolors="none" if impl == "lax" else None, label=impl)
    for op, c in colors.items():
        ax.scatter([], [], marker="o", color=c, label=op)
    ax.set_xlabel("arithmetic intensity (FLOP / compulsory byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(f"Achieved vs roofline ({meta.get('device_kind')}); filled = jaxconv, open squares = lax", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    p = os.path.join(out_dir, "roofline.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    files.append(p)
    return files
