"""Least-squares slope fit time = a + b*T with a t-interval on b (no SciPy needed)."""
from __future__ import annotations

import math
from typing import Sequence


def _betacf(a, b, x):
    # Continued fraction for the incomplete beta function (modified Lentz).
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        de = d * c
        h *= de
        if abs(de - 1.0) < eps:
            break
    return h


def _betainc(a, b, x):
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """Inverse CDF of Student's t (bisection; exact to ~1e-10)."""
    if df <= 0:
        return float("nan")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
        if hi > 1e12:
            return float("inf")
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def linfit(xs: Sequence[float], ys: Sequence[float], conf: float = 0.90) -> dict:
    """OLS y = a + b*x. Returns a, b, se_b, ci (two-sided `conf` t-interval on b), r2, n, df."""
    n = len(xs)
    if n < 3 or len(set(xs)) < 2:
        return dict(a=float("nan"), b=float("nan"), se_b=float("nan"), ci=[float("nan")] * 2, r2=float("nan"),
                    n=n, df=n - 2)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    syy = sum((y - my) ** 2 for y in ys)
    b = sxy / sxx
    a = my - b * mx
    sse = max(sum((y - a - b * x) ** 2 for x, y in zip(xs, ys)), 0.0)
    df = n - 2
    se_b = math.sqrt(sse / df / sxx) if df > 0 else float("nan")
    tq = t_quantile(0.5 + conf / 2.0, df)
    r2 = 1.0 - sse / syy if syy > 0 else (1.0 if sse == 0 else 0.0)
    return dict(a=a, b=b, se_b=se_b, ci=[b - tq * se_b, b + tq * se_b], r2=r2, n=n, df=df, t=tq)


def _median(v):
    s = sorted(v)
    m = len(s) // 2
    return s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])


def trim_outliers(samples: dict, k: float = 5.0):
    """samples: {T: [time, ...]}. Drops samples above median + k * 1.4826 * MAD of their T (one-sided: jitter only
    ever adds time). Returns (kept {T: [...]}, number dropped)."""
    kept, dropped = {}, 0
    for t, v in samples.items():
        med = _median(v)
        mad = _median([abs(x - med) for x in v]) * 1.4826
        lim = med + k * mad if mad > 0 else float("inf")
        kv = [x for x in v if x <= lim]
        dropped += len(v) - len(kv)
        kept[t] = kv
    return kept, dropped


def fit_samples(samples: dict, conf: float = 0.90, min_r2: float = 0.9, max_rel_ci: float = 0.5) -> dict:
    """Fit time = a + b*T over all (trimmed) samples, plus a cross-check fit over the per-T minima.
    Adds `flags` (reasons to distrust b) and `ok`."""
    kept, dropped = trim_outliers(samples)
    xs = [float(t) for t, v in kept.items() for _ in v]
    ys = [y for t, v in kept.items() for y in v]
    fit = linfit(xs, ys, conf)
    ts = sorted(kept)
    mins = linfit([float(t) for t in ts], [min(kept[t]) for t in ts], conf) if len(ts) >= 3 else None
    flags = []
    b = fit["b"]
    if not math.isfinite(b):
        flags.append("no_fit")
    else:
        if b <= 0:
            flags.append("negative_slope")
        if fit["r2"] < min_r2:
            flags.append(f"r2<{min_r2}")
        half = 0.5 * (fit["ci"][1] - fit["ci"][0])
        if b > 0 and half > max_rel_ci * b:
            flags.append(f"ci>{int(max_rel_ci * 100)}%")
        if mins is not None and math.isfinite(mins["b"]) and b > 0 and not (0.5 * b <= mins["b"] <= 2.0 * b):
            flags.append("min_fit_disagrees")
    fit.update(dropped=dropped, flags=flags, ok=not flags, min_fit=mins,
               per_t_median={str(t): _median(kept[t]) for t in ts}, per_t_min={str(t): min(kept[t]) for t in ts})
    return fit


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics (rank q/100 * (n-1))."""
    s = sorted(values)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def ratio_summary(ratios: Sequence[float]) -> dict:
    """Summary of positive ratios (lax time / jaxconv time): n, min, p10, median, geomean, max and the counts under
    0.7, under 0.9 and at least 1."""
    v = [float(r) for r in ratios]
    if any(not (r > 0 and math.isfinite(r)) for r in v):
        raise ValueError("ratio_summary: ratios must be positive and finite")
    if not v:
        return dict(n=0)
    return dict(n=len(v), min=min(v), p10=percentile(v, 10), median=percentile(v, 50),
                geomean=math.exp(sum(math.log(r) for r in v) / len(v)), max=max(v),
                below_0_7=sum(r < 0.7 for r in v), below_0_9=sum(r < 0.9 for r in v), at_least_1=sum(r >= 1 for r in v))
