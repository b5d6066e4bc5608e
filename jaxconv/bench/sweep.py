"""The random sweep's distribution: realistic convolutions drawn from a stated distribution by (seed, index).

Case `index` of seed `seed` is drawn from its own random stream (numpy's SeedSequence of the seed and the index),
so a sweep of N cases is the first N of any longer sweep of that seed, and one case replays alone
(`--sweep-case INDEX --seed SEED`). The constants below are the distribution; `distribution_markdown()` states
them in words (docs/sweep.md holds its output, and a test checks the two agree).

Draw order: the dimensionality, the layout and the kind are drawn once; everything else (channels, groups,
filter, stride, dilation, padding, batch, sizes) is drawn again, as a whole, until the case fits the scale's
bounds and lax accepts it. The nd, layout and kind fractions are therefore exact; the others are conditional on
the case fitting.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from . import cases as _cases

DISTRIBUTION_VERSION = 1

ND_WEIGHTS = {1: 0.25, 2: 0.60, 3: 0.15}
CHANNELS_FIRST_FRACTION = 0.25
# dense: groups 1, 5+ input channels; grouped: 1 < groups < input channels; depthwise: groups == input channels;
# first_layer: dense with 1-4 input channels.
KIND_WEIGHTS = {"dense": 0.55, "grouped": 0.10, "depthwise": 0.20, "first_layer": 0.15}

ROUND_CHANNELS = (8, 16, 32, 64, 128, 256, 512)
ROUND_CHANNEL_FRACTION = 0.7          # else an arbitrary count, uniform in ARBITRARY_CHANNELS
ARBITRARY_CHANNELS = (5, 200)
SAME_CHANNELS_FRACTION = 0.4          # dense and grouped layers: out = in, else out drawn like in
FIRST_LAYER_IN_CHANNELS = {1: 0.30, 2: 0.10, 3: 0.45, 4: 0.15}
FIRST_LAYER_MAX_OUT = 128             # first layers' output count: the channel draw, redrawn while above this
GROUP_COUNT_MAX = 64                  # grouped: groups uniform over the common divisors g of in and out, 2 <= g <= in/2
DEPTHWISE_MULTIPLIER = {1: 0.85, 2: 0.15}   # depthwise: out = multiplier * in

# Filters: per case, one size for every spatial dim (square) or, for 2-D and 3-D, each dim drawn alone.
FILTER_SIZES = {1: 0.20, 2: 0.05, 3: 0.45, 4: 0.05, 5: 0.10, 7: 0.15}
LONG_1D_FILTER_FRACTION = 0.3         # 1-D only: a long window, log-uniform integer in LONG_1D_FILTER
LONG_1D_FILTER = (8, 64)
PER_DIM_FILTER_FRACTION = 0.15        # 2-D/3-D: each dim drawn from FILTER_SIZES alone (1x7, 3x1x1, ...)
# Depthwise layers and first layers redraw an all-ones filter (a 1x1 depthwise layer is a scale, not a conv).

STRIDE2_FRACTION = 0.25               # stride 2 in every dim (first layers: FIRST_LAYER_STRIDE2_FRACTION)
FIRST_LAYER_STRIDE2_FRACTION = 0.5
STRIDE2_3D_TEMPORAL_1_FRACTION = 0.5  # strided 3-D: the first (temporal) dim keeps stride 1
DILATIONS = {1: 0.85, 2: 0.07, 3: 0.04, 4: 0.04}   # stride-1 cases only; one value on every dim whose filter > 1

PADDING_MODES = {"SAME": 0.5, "VALID": 0.2, "symmetric": 0.18, "causal/asymmetric": 0.12}
# symmetric: (k-1)*d//2 on both sides of every dim (PyTorch's 'same' for odd k); causal/asymmetric: 1-D pads
# (k-1)*d before and 0 after; 2-D/3-D draw lo and hi per dim uniform in 0..(k-1)*d.

BATCHES = {1: 0.15, 2: 0.10, 4: 0.10, 8: 0.20, 16: 0.20, 32: 0.15, "any": 0.10}   # any: uniform 1..32

# Spatial sizes fit the channels: wide layers on small images, few channels on large ones. With m = the larger of
# the input and output channel counts, every side is log-uniform on [lo/m, hi/m] clipped to [min, max]; 2-D images
# are square but for ASPECT_FRACTION (width = height * r, r log-uniform in 1/2..2); 3-D volumes have depth = height
# or, for VIDEO_FRACTION, a depth log-uniform in VIDEO_DEPTH. ROUND_SIZE_FRACTION of the sides snap to the nearest
# of ROUND_SIZES inside the range.
SIZE_RULES = {1: dict(lo=2**14, hi=2**20, min=16, max=2**17),
              2: dict(lo=1024, hi=16384, min=4, max=512),
              3: dict(lo=256, hi=4096, min=4, max=128)}
ASPECT_FRACTION = 0.25
VIDEO_FRACTION = 0.5
VIDEO_DEPTH = (4, 32)
ROUND_SIZE_FRACTION = 0.6
ROUND_SIZES = (4, 7, 8, 12, 14, 16, 24, 28, 32, 48, 56, 64, 96, 112, 128, 192, 224, 256, 384, 512, 1024, 2048,
               4096, 8192, 16384, 32768, 65536, 131072)


@dataclasses.dataclass(frozen=True)
class Scale:
    """Bounds on one case: forward FLOPs (2 * MACs), and the bytes of x, w, y and their three gradients in float32.
    size_divisor shrinks the size rules' ranges (the tiny scale, for CPU runs)."""
    name: str
    min_flops: float
    max_flops: float
    max_bytes: int
    size_divisor: int = 1
    max_batch: int = 32


SCALES = {
    "full": Scale("full", 1e7, 5e10, 256 << 20),
    # CPU runs: the same draw with sizes divided by 8 and small bounds, so a case times in milliseconds there.
    "tiny": Scale("tiny", 1e5, 4e6, 4 << 20, size_divisor=8, max_batch=2),
}
MAX_ATTEMPTS = 10000


def scale_for_backend(backend: str) -> str:
    """The scale a run takes when none is named: full on accelerators, tiny on the CPU."""
    return "tiny" if backend == "cpu" else "full"


def _rng(seed: int, index: int) -> np.random.Generator:
    """Case `index`'s own stream; any integer seed (negative ones too) names a distinct stream."""
    return np.random.default_rng([int(seed < 0), abs(int(seed)), int(index), DISTRIBUTION_VERSION])


def _pick(rng, weights: dict):
    keys = list(weights)
    p = np.array([weights[k] for k in keys], dtype=float)
    return keys[int(rng.choice(len(keys), p=p / p.sum()))]


def _log_uniform_int(rng, lo, hi):
    lo, hi = max(1, int(lo)), max(1, int(hi))
    if hi <= lo:
        return lo
    return int(min(hi, max(lo, round(math.exp(rng.uniform(math.log(lo), math.log(hi + 0.5)))))))


def _channels(rng):
    if rng.random() < ROUND_CHANNEL_FRACTION:
        return int(rng.choice(ROUND_CHANNELS))
    return int(rng.integers(ARBITRARY_CHANNELS[0], ARBITRARY_CHANNELS[1] + 1))


def _draw_channels(rng, kind):
    """(in, out, groups)."""
    if kind == "first_layer":
        cin = _pick(rng, FIRST_LAYER_IN_CHANNELS)
        cout = _channels(rng)
        while cout > FIRST_LAYER_MAX_OUT:
            cout = _channels(rng)
        return cin, cout, 1
    if kind == "depthwise":
        c = _channels(rng)
        return c, c * _pick(rng, DEPTHWISE_MULTIPLIER), c
    cin = _channels(rng)
    cout = cin if rng.random() < SAME_CHANNELS_FRACTION else _channels(rng)
    if kind == "dense":
        return cin, cout, 1
    g = math.gcd(cin, cout)
    options = [d for d in range(2, min(GROUP_COUNT_MAX, cin // 2) + 1) if g % d == 0]
    if not options:
        return None  # e.g. a prime channel count: no grouping; the case is drawn again
    return cin, cout, int(rng.choice(options))


def _draw_filter(rng, nd, kind):
    while True:
        if nd == 1 and rng.random() < LONG_1D_FILTER_FRACTION:
            f = (_log_uniform_int(rng, *LONG_1D_FILTER),)
        elif nd > 1 and rng.random() < PER_DIM_FILTER_FRACTION:
            f = tuple(_pick(rng, FILTER_SIZES) for _ in range(nd))
        else:
            f = (_pick(rng, FILTER_SIZES),) * nd
        if kind in ("dense", "grouped") or any(k > 1 for k in f):
            return f


def _size(rng, m, rule, divisor):
    lo = max(rule["min"], rule["lo"] / m / divisor)
    hi = max(lo, min(rule["max"], rule["hi"] / m) / divisor)
    s = _log_uniform_int(rng, lo, hi)
    if rng.random() < ROUND_SIZE_FRACTION:
        inside = [r for r in ROUND_SIZES if lo <= r <= hi]
        if inside:
            s = min(inside, key=lambda r: abs(math.log(r / s)))
    return s


def _draw_spatial(rng, nd, m, scale):
    rule = SIZE_RULES[nd]
    h = _size(rng, m, rule, scale.size_divisor)
    if nd == 1:
        return (h,)
    if nd == 2:
        w = h
        if rng.random() < ASPECT_FRACTION:
            w = max(rule["min"], int(round(h * math.exp(rng.uniform(math.log(0.5), math.log(2.0))))))
        return (h, w)
    d = h
    if rng.random() < VIDEO_FRACTION:
        d = _log_uniform_int(rng, *VIDEO_DEPTH)
    return (d, h, h)


def _draw_padding(rng, filt, dil):
    mode = _pick(rng, PADDING_MODES)
    span = [(k - 1) * d for k, d in zip(filt, dil)]
    if mode in ("SAME", "VALID"):
        return mode, mode
    if mode == "symmetric":
        return mode, [[s // 2, s // 2] for s in span]
    if len(filt) == 1:
        return "causal", [[span[0], 0]]
    return "asymmetric", [[int(rng.integers(0, s + 1)), int(rng.integers(0, s + 1))] for s in span]


def _batch(rng, scale):
    b = _pick(rng, BATCHES)
    if b == "any":
        b = int(rng.integers(1, 33))
    return min(b, scale.max_batch)


def fwdbwd_bytes(case) -> int:
    """Bytes of x, w, y and their gradients in float32: the largest set of one fwd+bwd in the measured dtypes."""
    return 2 * 4 * sum(math.prod(s) for s in case.shapes())


@functools.lru_cache(maxsize=None)
def _lax_out_shape(x, w, kw_items):
    import jax
    from jax import lax
    kw = dict(kw_items)
    out = jax.eval_shape(lambda a, b: lax.conv_general_dilated(a, b, **kw),
                         jax.ShapeDtypeStruct(x, np.float32), jax.ShapeDtypeStruct(w, np.float32))
    return tuple(out.shape)


def lax_accepts(case) -> bool:
    """Whether lax.conv_general_dilated traces this configuration, with the output shape the case computes."""
    from .harness import conv_kwargs
    kw = conv_kwargs(case, "float32")
    x, w, y = case.shapes()
    try:
        return _lax_out_shape(tuple(x), tuple(w), tuple(sorted(kw.items()))) == tuple(y)
    except Exception:  # a configuration lax rejects (TypeError / ValueError): drawn again
        return False


def _draw_once(rng, seed, index, nd, layout, kind, scale):
    ch = _draw_channels(rng, kind)
    if ch is None:
        return None
    cin, cout, groups = ch
    filt = _draw_filter(rng, nd, kind)
    s2 = rng.random() < (FIRST_LAYER_STRIDE2_FRACTION if kind == "first_layer" else STRIDE2_FRACTION)
    stride = [2] * nd if s2 else [1] * nd
    if s2 and nd == 3 and rng.random() < STRIDE2_3D_TEMPORAL_1_FRACTION:
        stride[0] = 1
    d = 1 if s2 else _pick(rng, DILATIONS)
    dil = [d if k > 1 else 1 for k in filt]
    pad_mode, padding = _draw_padding(rng, filt, dil)
    batch = _batch(rng, scale)
    spatial = _draw_spatial(rng, nd, max(cin, cout), scale)
    name = f"s{seed}_{index:03d}_{kind}_{nd}d"
    source = (f"sweep v{DISTRIBUTION_VERSION} seed={seed} index={index} scale={scale.name}: kind={kind}, "
              f"padding={pad_mode}")
    try:
        case = _cases.case_from_dict(dict(
            name=name, source=source, batch=batch, spatial=list(spatial), in_channels=cin, out_channels=cout,
            filter=list(filt), stride=stride, padding=padding, dilation=dil, groups=groups, layout=layout,
            dtypes=["bfloat16", "float32"], ops=["fwd+bwd"]))
    except ValueError:  # an empty output (a window larger than the padded input): drawn again
        return None
    if not scale.min_flops <= case.flops("fwd") <= scale.max_flops or fwdbwd_bytes(case) > scale.max_bytes:
        return None
    return case


def draw_case(seed: int, index: int, scale="full") -> _cases.Case:
    """Case `index` of the sweep of `seed` at a scale (a Scale or its name)."""
    scale = SCALES[scale] if isinstance(scale, str) else scale
    rng = _rng(seed, index)
    nd = _pick(rng, ND_WEIGHTS)
    layout = "channels_first" if rng.random() < CHANNELS_FIRST_FRACTION else "channels_last"
    kind = _pick(rng, KIND_WEIGHTS)
    for _ in range(MAX_ATTEMPTS):
        case = _draw_once(rng, seed, index, nd, layout, kind, scale)
        if case is not None and lax_accepts(case):
            return case
    raise RuntimeError(f"sweep seed {seed} index {index}: no {kind} {nd}-D case within the {scale.name} scale's "
                       f"bounds after {MAX_ATTEMPTS} draws")


def draw_cases(n: int, seed: int, scale="full") -> list:
    return [draw_case(seed, i, scale) for i in range(n)]


def case_kind(case) -> str:
    """The kind recorded in a drawn case's source (dense, grouped, depthwise, first_layer)."""
    for part in case.source.replace(",", " ").split():
        if part.startswith("kind="):
            return part[len("kind="):]
    return "?"


def case_padding_mode(case) -> str:
    for part in case.source.replace(",", " ").split():
        if part.startswith("padding="):
            return part[len("padding="):]
    return "?"


def _pct(w):
    return f"{100 * w:g}%"


def _weights(d, fmt=str):
    total = sum(d.values())
    return ", ".join(f"{fmt(k)} {_pct(v / total)}" for k, v in d.items())


def _range(nd):
    r = SIZE_RULES[nd]
    return f"{r['lo']}/m, {r['hi']}/m] within {r['min']}..{r['max']}"


def distribution_markdown() -> str:
    """The distribution in words, from the constants above (docs/sweep.md and every results.md carry it)."""
    full, tiny = SCALES["full"], SCALES["tiny"]
    L = [
        f"Distribution version {DISTRIBUTION_VERSION}. Case i of seed S is drawn from its own stream "
        f"(numpy SeedSequence of S and i), so the first N cases of a seed are the same in every run.",
        "",
        f"- Dimensionality: {_weights(ND_WEIGHTS, lambda k: f'{k}-D')}.",
        f"- Layout: channels-first (NCW / NCHW / NCDHW with OIW / OIHW / OIDHW filters) "
        f"{_pct(CHANNELS_FIRST_FRACTION)}, channels-last (NWC / NHWC / NDHWC with WIO / HWIO / DHWIO) otherwise.",
        f"- Kind: {_weights(KIND_WEIGHTS)}. dense: groups 1; grouped: groups uniform over the common divisors g of "
        f"the input and output channel counts with 2 <= g <= min({GROUP_COUNT_MAX}, in/2) (none: drawn again); "
        f"depthwise: groups = input channels, output = input x multiplier "
        f"({_weights(DEPTHWISE_MULTIPLIER, lambda k: f'x{k}')}); "
        f"first_layer: groups 1, input channels {_weights(FIRST_LAYER_IN_CHANNELS)}, output channels the channel "
        f"draw redrawn while above {FIRST_LAYER_MAX_OUT}.",
        f"- Channel draw: round ({', '.join(map(str, ROUND_CHANNELS))}, uniform) {_pct(ROUND_CHANNEL_FRACTION)}, "
        f"arbitrary (uniform integer {ARBITRARY_CHANNELS[0]}-{ARBITRARY_CHANNELS[1]}) "
        f"{_pct(1 - ROUND_CHANNEL_FRACTION)}. Dense and grouped layers: output = input "
        f"{_pct(SAME_CHANNELS_FRACTION)}, else a second channel draw.",
        f"- Filter: per dim size {_weights(FILTER_SIZES)}; one size for every dim, except 2-D/3-D cases drawing each "
        f"dim alone {_pct(PER_DIM_FILTER_FRACTION)}; 1-D: a long window (log-uniform integer "
        f"{LONG_1D_FILTER[0]}-{LONG_1D_FILTER[1]}) {_pct(LONG_1D_FILTER_FRACTION)}. Depthwise and first layers redraw "
        f"an all-ones filter.",
        f"- Stride: 2 in every dim {_pct(STRIDE2_FRACTION)} (first layers {_pct(FIRST_LAYER_STRIDE2_FRACTION)}; "
        f"strided 3-D keeps stride 1 in the first dim {_pct(STRIDE2_3D_TEMPORAL_1_FRACTION)}), else 1.",
        f"- Dilation (stride-1 cases; one value on every dim whose filter is > 1): {_weights(DILATIONS)}.",
        f"- Padding: {_weights(PADDING_MODES)}. symmetric: (k-1)*d//2 on both sides; causal/asymmetric: 1-D pads "
        f"(k-1)*d before and 0 after, 2-D/3-D draw lo and hi per dim uniform in 0..(k-1)*d.",
        f"- Batch: {_weights(BATCHES)} (any: uniform 1-32).",
        f"- Spatial sizes fit the channels. With m = max(input, output channels), each side is a log-uniform integer "
        f"on [lo/m, hi/m] clipped to [min, max]: 1-D length on [{_range(1)}; 2-D side on [{_range(2)}, width = "
        f"height x r for {_pct(ASPECT_FRACTION)} (r log-uniform in 1/2..2); 3-D side on [{_range(3)}, depth = side or, "
        f"for {_pct(VIDEO_FRACTION)} (video), log-uniform {VIDEO_DEPTH[0]}-{VIDEO_DEPTH[1]}. "
        f"{_pct(ROUND_SIZE_FRACTION)} of sides snap to the nearest round size inside the range "
        f"({', '.join(map(str, ROUND_SIZES[:20]))}, ...).",
        f"- Bounds (scale 'full', the default on a GPU): {full.min_flops:.0e} to {full.max_flops:.0e} forward FLOPs "
        f"(2 x MACs), and at most {full.max_bytes >> 20} MiB for x, w, y and their three gradients in float32. "
        f"Scale 'tiny' (the default on the CPU): sizes divided by {tiny.size_divisor}, batch at most {tiny.max_batch}, "
        f"{tiny.min_flops:.0e} to {tiny.max_flops:.0e} FLOPs, {tiny.max_bytes >> 20} MiB.",
        f"- Draw order: dimensionality, layout and kind first, kept; the rest is drawn again, as a whole, until the "
        f"case fits the bounds, has a non-empty output and jax.eval_shape of lax.conv_general_dilated accepts it "
        f"(at most {MAX_ATTEMPTS} draws). The dimensionality, layout and kind fractions are exact; the others are "
        f"conditional on fitting.",
    ]
    return "\n".join(L)


if __name__ == "__main__":
    print(distribution_markdown())
