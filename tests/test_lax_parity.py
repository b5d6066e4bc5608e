"""jaxconv.conv_general_dilated against lax.conv_general_dilated itself over lax's whole parameter space.

Random draws (seeded; JAXCONV_PARITY_CASES of them, default 48) over 0-3 spatial dims, every kind of dimension_numbers
(None, the native strings, shuffled strings, arbitrary ConvDimensionNumbers permutations), strides, lhs and rhs
dilation, padding (the strings, explicit pairs, negative pairs), feature and batch groups, every precision form, and
the dtypes and preferred_element_types lax takes (floats, bfloat16, float16, 8-bit floats, complex, integers, bool,
int4). Integer and bool results must equal lax's exactly; floating results agree within the result type's rounding;
gradients (floating and complex operands: lax has none for integers) likewise, for a random cotangent.

The CPU run compares both on the CPU; the `gpu` run takes the same draws with jaxconv on the GPU and lax on the CPU.
"""

from __future__ import annotations

import os
import zlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import conv_utils as cu
import jaxconv

CASES = int(os.environ.get("JAXCONV_PARITY_CASES", "48"))
_SPATIAL = "DHW"

# (operand dtype, weight in the draw, preferred_element_types drawn with it). Pairs XLA:CPU cannot compile (4-bit
# types with a preferred type) are left out: lax fails on them too.
DTYPES = [
    ("float32", 10, [None, "float32"]),
    ("bfloat16", 3, [None, "float32", "float16"]),
    ("float16", 2, [None, "float32", "bfloat16"]),
    ("complex64", 2, [None]),
    ("float8_e4m3fn", 1, [None, "float32", "bfloat16"]),
    ("float8_e5m2", 1, [None, "float16"]),
    ("int8", 3, [None, "int32", "int16", "float32", "bfloat16"]),
    ("uint8", 2, [None, "int8", "uint16", "int32", "float32"]),
    ("int16", 1, [None, "int32"]),
    ("int32", 1, [None, "float32"]),
    ("uint32", 1, [None, "int32"]),
    ("bool", 2, [None, "bool", "int32", "float32"]),
    ("int4", 1, [None]),
]
PRECISIONS = [None, "highest", "default", lax.Precision.HIGH, ("bfloat16", "highest"), lax.Precision.HIGHEST]
# Relative L2 error of a floating result (or gradient) against lax's, by result dtype: a few roundings of the type
# (the two sum in different orders; the 8-bit types round once more than float16 at worst).
_TOL = {"float32": 2e-5, "complex64": 2e-5, "bfloat16": 2e-2, "float16": 4e-3, "float8_e4m3fn": 0.15,
        "float8_e5m2": 0.3}


def _dtype(name):
  return np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) and not hasattr(np, name) else np.dtype(name)


def _dims(rng, ns):
  """Dimension numbers of one of lax's forms, and (lhs, rhs, out) as index permutations for building shapes."""
  sp = _SPATIAL[3 - ns:]
  r = rng.random()
  if r < 0.15:
    dn = None
  elif r < 0.35:
    dn = ("N" + sp + "C", sp + "IO", "N" + sp + "C")
  elif r < 0.5:
    dn = ("NC" + sp, "OI" + sp, "NC" + sp)
  elif r < 0.8:  # shuffled letters; the rhs spatial letters keep their order (lax's spatial order is the rhs's)
    lhs, out = list("NC" + sp), list("NC" + sp)
    rng.shuffle(lhs)
    rng.shuffle(out)
    pos = sorted(rng.choice(ns + 2, 2, replace=False).tolist())
    if rng.random() < 0.5:
      pos = pos[::-1]
    rhs, it = [None] * (ns + 2), iter(sp)
    rhs[pos[0]], rhs[pos[1]] = "O", "I"
    dn = ("".join(lhs), "".join(c if c is not None else next(it) for c in rhs), "".join(out))
  else:
    dn = lax.ConvDimensionNumbers(*(tuple(int(v) for v in rng.permutation(ns + 2)) for _ in range(3)))
  return dn, lax.conv_dimension_numbers((1,) * (ns + 2), (1,) * (ns + 2), dn)


def draw(rng):
  """One random valid convolution: (lhs shape, rhs shape, dtype, kwargs)."""
  names, weights = [d[0] for d in DTYPES], np.array([d[1] for d in DTYPES], float)
  while True:
    ns = int(rng.choice([0, 1, 2, 3], p=[0.12, 0.33, 0.35, 0.2]))
    dname = str(rng.choice(names, p=weights / weights.sum()))
    pref = next(d[2] for d in DTYPES if d[0] == dname)
    pref = pref[int(rng.integers(len(pref)))]
    g = b = 1
    r = rng.random()
    if r < 0.2:
      g = int(rng.choice([2, 3]))
    elif r < 0.3:
      b = int(rng.choice([2, 3]))
    n = int(rng.choice([1, 2, 3])) * b
    c = int(rng.choice([1, 2, 3, 5])) * g
    k = int(rng.choice([1, 2, 4, 7])) * g * b
    in_ = [int(rng.integers(1, {1: 17, 2: 9, 3: 6}[ns] + 1)) for _ in range(ns)]
    win = [int(rng.integers(1, 4 + 1)) for _ in range(ns)]
    strides = [int(rng.choice([1, 1, 2, 3])) for _ in range(ns)]
    rhs_dil = [int(rng.choice([1, 1, 2])) for _ in range(ns)] if rng.random() < 0.4 else None
    lhs_dil = [int(rng.choice([1, 2, 3])) for _ in range(ns)] if rng.random() < 0.25 else None
    if lhs_dil is None and rng.random() < 0.5:
      padding = str(rng.choice(["SAME", "SAME_LOWER", "VALID"]))
    else:
      padding = [(int(rng.integers(-2, 4)), int(rng.integers(-2, 4))) for _ in range(ns)]
    dn, (lhs_spec, rhs_spec, _) = _dims(rng, ns)
    lhs_shape, rhs_shape = [0] * (ns + 2), [0] * (ns + 2)
    lhs_shape[lhs_spec[0]], lhs_shape[lhs_spec[1]] = n, c
    rhs_shape[rhs_spec[0]], rhs_shape[rhs_spec[1]] = k, c // g
    for j in range(ns):
      lhs_shape[lhs_spec[2 + j]], rhs_shape[rhs_spec[2 + j]] = in_[j], win[j]
    kw = dict(window_strides=tuple(strides), padding=padding, lhs_dilation=lhs_dil, rhs_dilation=rhs_dil,
              dimension_numbers=dn, feature_group_count=g, batch_group_count=b,
              precision=PRECISIONS[int(rng.integers(len(PRECISIONS)))], preferred_element_type=pref)
    dt = _dtype(dname)
    try:
      out = jax.eval_shape(lambda a, w: lax.conv_general_dilated(a, w, **kw), jax.ShapeDtypeStruct(lhs_shape, dt),
                           jax.ShapeDtypeStruct(rhs_shape, dt))
    except Exception:  # noqa: BLE001 - lax refuses it: outside the space
      continue
    if 0 < out.size * int(np.prod(win)) * c <= 60_000 and np.prod(lhs_shape) > 0:
      return tuple(lhs_shape), tuple(rhs_shape), dt, kw


def operand(rng, shape, dt):
  """Fresh random values of a dtype: full-range integers (sums wrap), normal floats, complex normals."""
  if dt == np.dtype(bool):
    return rng.integers(0, 2, shape).astype(bool)
  if dt.kind in "iu" and dt.itemsize >= 1 and dt.name not in ("int4", "uint4"):
    info = np.iinfo(dt)
    return rng.integers(int(info.min), int(info.max), shape, endpoint=True,
                        dtype=np.int64 if info.min < 0 else np.uint64).astype(dt)
  if dt.name in ("int4", "uint4"):
    lo, hi = (-8, 7) if dt.name == "int4" else (0, 15)
    return rng.integers(lo, hi, shape, endpoint=True).astype(np.int8).astype(dt)
  if dt.kind == "c":
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
  return np.asarray(rng.standard_normal(shape), np.float32).astype(dt)


def _close(got, want, what):
  assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
  got, want = np.asarray(got), np.asarray(want)
  if want.dtype.kind in "iub" or want.dtype.name in ("int4", "uint4"):
    np.testing.assert_array_equal(got.astype(np.int64) if want.dtype.name in ("int4", "uint4") else got,
                                  want.astype(np.int64) if want.dtype.name in ("int4", "uint4") else want, what)
    return
  if want.dtype.kind == "c":
    parts = [(got.real, want.real), (got.imag, want.imag)]
  else:
    parts = [(got.astype(np.float64), want.astype(np.float64))]
  tol = _TOL[want.dtype.name]
  for g, w in parts:
    assert np.array_equal(np.isnan(g), np.isnan(w)), what
    ok = ~np.isnan(w)
    err = cu.rel_l2(g[ok], w[ok])
    assert err < tol, f"{what}: relative L2 error {err:.3g} >= {tol}"


def _run(seed, device):
  rng = np.random.default_rng(seed)
  lhs_shape, rhs_shape, dt, kw = draw(rng)
  x, w = operand(rng, lhs_shape, dt), operand(rng, rhs_shape, dt)
  what = f"seed {seed}: lhs {lhs_shape} rhs {rhs_shape} {dt} {kw}"
  differentiable = dt.kind in "fc" or dt.name.startswith("float") or dt.name.startswith("bfloat")

  def both(conv):
    f = lambda a, b: conv(a, b, **kw)
    if not differentiable:
      return jax.jit(f)(x, w), None
    y, vjp = jax.vjp(f, x, w)
    ct = jnp.asarray(operand(np.random.default_rng(seed + 1), y.shape, np.dtype(y.dtype)))
    return y, vjp(ct)

  with jax.default_device(jax.devices("cpu")[0]):
    want, want_grads = both(lax.conv_general_dilated)
  with jax.default_device(jax.devices(device)[0]):
    got, got_grads = both(jaxconv.conv_general_dilated)
  _close(got, want, what)
  if want_grads is not None:
    for name, g, h in zip(("d lhs", "d rhs"), got_grads, want_grads):
      _close(g, h, f"{what} {name}")


SEEDS = [zlib.crc32(f"parity {i}".encode()) for i in range(CASES)]


@pytest.mark.parametrize("seed", SEEDS)
def test_matches_lax_on_the_cpu(seed):
  _run(seed, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("seed", SEEDS)
def test_matches_lax_on_the_gpu(seed):
  _run(seed, "gpu")


def test_the_draws_cover_the_space():
  """The draws reach every rank, dimension-number form, padding form, group kind and dtype family (a test of the
  generator: a narrower one would leave parts of lax's space untested)."""
  seen = set()
  for seed in range(400):
    lhs_shape, _, dt, kw = draw(np.random.default_rng(seed))
    dn = kw["dimension_numbers"]
    seen.add(("rank", len(lhs_shape) - 2))
    seen.add(("dn", "none" if dn is None else "cdn" if isinstance(dn, lax.ConvDimensionNumbers) else "str"))
    pad = kw["padding"]
    seen.add(("pad", pad if isinstance(pad, str) else "negative" if any(min(p) < 0 for p in pad) else "pairs"))
    seen.add(("groups", "feature" if kw["feature_group_count"] > 1 else "batch" if kw["batch_group_count"] > 1
              else "none"))
    seen.add(("lhs_dilation", kw["lhs_dilation"] is not None))
    seen.add(("kind", dt.kind if dt.name not in ("int4",) else "i4"))
    seen.add(("pref", kw["preferred_element_type"] is not None))
  want = ({("rank", r) for r in range(4)} | {("dn", d) for d in ("none", "cdn", "str")}
          | {("pad", p) for p in ("SAME", "SAME_LOWER", "VALID", "negative", "pairs")}
          | {("groups", g) for g in ("feature", "batch", "none")} | {("lhs_dilation", True)}
          | {("kind", k) for k in "fcuib"} | {("kind", "i4"), ("pref", True)})
  assert want <= seen, sorted(want - seen)
