"""Shared helpers for the jaxconv test suite: references, tolerances, random configurations.

References are computed with lax.conv_general_dilated in float64 on the CPU backend, from the *same* (already
rounded) inputs upcast to float64, so a test measures only the error of the code under test.
"""

from __future__ import annotations

import fcntl
import inspect
import os
import subprocess
import sys
import zlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

FUZZ_CASES = int(os.environ.get("JAXCONV_FUZZ_CASES", "60"))

DTYPES = ("float32", "float64", "bfloat16", "float16")

# Relative L2 error bounds vs the float64 reference, by (input dtype, result dtype).
_TOL = {"float64": 1e-12, "float32": 1e-5, "bfloat16": 1e-2, "float16": 1e-2}
# Half-precision inputs with an f32 result: products are exact in f32, only accumulation rounds.
_TOL_HALF_TO_F32 = 5e-5


def np_dtype(name):
  return {"float32": np.float32, "float64": np.float64, "bfloat16": ml_dtypes.bfloat16,
          "float16": np.float16}[str(np.dtype(name)) if not isinstance(name, str) else name]


def tolerance(in_dtype, out_dtype=None) -> float:
  in_name = str(np.dtype(in_dtype))
  out_name = in_name if out_dtype is None else str(np.dtype(out_dtype))
  if in_name in ("bfloat16", "float16") and out_name == "float32":
    return _TOL_HALF_TO_F32
  return _TOL[in_name]


def enable_x64():
  """A context enabling 64-bit types (jax.enable_x64 in new jax, jax.experimental.enable_x64 in old)."""
  if hasattr(jax, "enable_x64"):
    return jax.enable_x64(True)
  from jax.experimental import enable_x64 as _e  # pragma: no cover
  return _e()


def seed_of(*parts) -> int:
  return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def randn(rng, shape, dtype) -> np.ndarray:
  """Standard normal values rounded to `dtype` (a numpy array of that dtype)."""
  return rng.standard_normal(size=shape).astype(np.float64).astype(np_dtype(str(np.dtype(dtype))))


def cpu_device():
  return jax.devices("cpu")[0]


def on_cpu(fn):
  """fn run by XLA:CPU on CPU copies of its arguments: the reference semantics for lax comparisons on a GPU machine
  too, where lax (cuDNN) refuses integer, complex and 8-bit convolutions or saturates integer results."""
  def run(*args):
    with jax.default_device(cpu_device()):
      return fn(*(jax.device_put(a, cpu_device()) for a in args))
  return run


def to_gpu(a):
  """`a` on the first GPU (GPU-only tests)."""
  return jax.device_put(a, jax.devices("gpu")[0])


def gpu_context(dtype):
  """The context a GPU test computes `dtype` in: 64-bit types on for float64, else the GPU as default device."""
  return enable_x64() if str(dtype) == "float64" else jax.default_device(jax.devices("gpu")[0])


def channels_last_dn(nspatial):
  """lax dimension numbers of jaxconv's channels-last layout: (N, *spatial, C), (*window, I, O), (N, *spatial, K)."""
  sp = "DHW"[3 - nspatial:]
  return ("N" + sp + "C", sp + "IO", "N" + sp + "C")


def channels_last_lax_kw(nspatial, stride, padding, dilation) -> dict:
  """lax.conv_general_dilated keywords of a channels-last problem (the GPU tests' reference calls)."""
  return dict(window_strides=stride, padding=padding, rhs_dilation=dilation,
              dimension_numbers=channels_last_dn(nspatial))


def f64(a) -> np.ndarray:
  return np.asarray(a).astype(np.float64)


def activation_ref(y, act) -> np.ndarray:
  """The fused epilogue's activation in float64: None, relu, gelu (tanh form, jax.nn.gelu's default) or silu."""
  y = f64(y)
  if act is None:
    return y
  if act == "relu":
    return np.maximum(y, 0)
  if act == "gelu":
    return 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))
  if act == "silu":
    return y / (1 + np.exp(-y))
  raise ValueError(f"unknown activation {act!r}")


def rel_l2(got, ref) -> float:
  """||got - ref|| / ||ref|| in float64 (absolute error when ref is all zeros); NaN/inf propagate."""
  got = f64(got)
  ref = f64(ref)
  assert got.shape == ref.shape, (got.shape, ref.shape)
  if ref.size == 0:
    return 0.0
  num = float(np.linalg.norm((got - ref).ravel()))
  den = float(np.linalg.norm(ref.ravel()))
  if not np.all(np.isfinite(got)):
    return float("nan")
  return num / den if den > 0 else num


def assert_close(got, ref, tol, what=""):
  err = rel_l2(got, ref)
  n_bad = int(np.sum(~np.isfinite(f64(got)))) if np.size(got) else 0
  assert err <= tol, f"rel_l2={err:.3g} > tol={tol:g} (non-finite outputs: {n_bad}) {what}"


def lax_ref_conv(lhs, rhs, **kw) -> np.ndarray:
  """lax.conv_general_dilated in float64 on CPU (slow to compile: ~2 s per configuration)."""
  kw = dict(kw)
  kw.pop("precision", None)
  kw.pop("preferred_element_type", None)
  with enable_x64(), jax.default_device(cpu_device()):
    f = jax.jit(lambda a, b: lax.conv_general_dilated(a, b, precision=lax.Precision.HIGHEST, **kw))
    return np.asarray(f(jnp.asarray(f64(lhs)), jnp.asarray(f64(rhs))))


def lax_ref_conv_vjp(lhs, rhs, ct, **kw):
  """(d lhs, d rhs) of lax.conv_general_dilated in float64 on CPU for cotangent `ct`."""
  kw = dict(kw)
  kw.pop("precision", None)
  kw.pop("preferred_element_type", None)
  with enable_x64(), jax.default_device(cpu_device()):
    f = lambda a, b: lax.conv_general_dilated(a, b, precision=lax.Precision.HIGHEST, **kw)
    g = jax.jit(lambda a, b, ct: jax.vjp(f, a, b)[1](ct))
    da, db = g(jnp.asarray(f64(lhs)), jnp.asarray(f64(rhs)), jnp.asarray(f64(ct)))
    return np.asarray(da), np.asarray(db)


class _NumpyConv:
  """float64 numpy convolution with lax.conv_general_dilated's semantics, written from the index relation
  of csrc/conv_params.h (p = o*stride - pad_lo + f*rhs_dil; valid iff p >= 0, p % lhs_dil == 0,
  p / lhs_dil < in). Used as the reference because XLA:CPU takes seconds to compile a float64 convolution;
  test_reference.py checks it against lax."""

  def __init__(self, lhs_shape, rhs_shape, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
               dimension_numbers=None, feature_group_count=1, batch_group_count=1):
    dn = lax.conv_dimension_numbers(tuple(lhs_shape), tuple(rhs_shape), dimension_numbers)
    self.lhs_spec, self.rhs_spec, self.out_spec = (tuple(int(a) for a in s) for s in dn)
    ns = len(lhs_shape) - 2
    self.ns = ns
    self.G, self.B = int(feature_group_count), int(batch_group_count)
    self.in_ = [int(lhs_shape[a]) for a in self.lhs_spec[2:]]
    self.win = [int(rhs_shape[a]) for a in self.rhs_spec[2:]]
    self.n, self.c = int(lhs_shape[self.lhs_spec[0]]), int(lhs_shape[self.lhs_spec[1]])
    self.k = int(rhs_shape[self.rhs_spec[0]])
    self.stride = [int(v) for v in window_strides]
    ld = [1] * ns if lhs_dilation is None else [int(v) for v in lhs_dilation]
    rd = [1] * ns if rhs_dilation is None else [int(v) for v in rhs_dilation]
    if isinstance(padding, str):
      eff = [_dil(w, d) for w, d in zip(self.win, rd)]
      padding = lax.padtype_to_pads(self.in_, eff, self.stride, padding)
    pads = [(int(lo), int(hi)) for lo, hi in padding]
    self.out = []
    self.idx, self.mask = [], []
    for d in range(ns):
      span = _dil(self.in_[d], ld[d]) + pads[d][0] + pads[d][1] - _dil(self.win[d], rd[d])
      od = max(0, span // self.stride[d] + 1)
      self.out.append(od)
      o = np.arange(od)[:, None]
      f = np.arange(self.win[d])[None, :]
      p = o * self.stride[d] - pads[d][0] + f * rd[d]
      valid = (p >= 0) & (p % ld[d] == 0) & (p // ld[d] < self.in_[d])
      shape = [1] * (2 * ns)
      shape[2 * d], shape[2 * d + 1] = od, self.win[d]
      self.idx.append(np.where(valid, p // ld[d], 0).reshape(shape))
      self.mask.append(valid.reshape(shape))
    self.P, self.Q = int(np.prod(self.out)), int(np.prod(self.win))
    self.empty_in = any(s == 0 for s in self.in_)

  # patches: (N, C, O1, F1, O2, F2, ...) <-> (N, C, P, Q)
  def _to_pq(self, a):
    ns = self.ns
    perm = [0, 1] + [2 + 2 * d for d in range(ns)] + [3 + 2 * d for d in range(ns)]
    return a.transpose(perm).reshape(a.shape[0], a.shape[1], self.P, self.Q)

  def _from_pq(self, a):
    ns = self.ns
    a = a.reshape(a.shape[0], a.shape[1], *self.out, *self.win)
    perm = [0, 1]
    for d in range(ns):
      perm += [2 + d, 2 + ns + d]
    return a.transpose(perm)

  def _mask(self):
    m = np.ones([1] * (2 * self.ns), bool)
    for v in self.mask:
      m = m & v
    return m

  def patches(self, x):  # x logical (N, C, S...)
    N, C = x.shape[:2]
    if self.empty_in:
      return np.zeros((N, C, self.P, self.Q), x.dtype)
    g = x[(slice(None), slice(None), *self.idx)] * self._mask()
    return self._to_pq(g)

  def patches_t(self, dp, x_shape):  # adjoint of patches
    dx = np.zeros(x_shape)
    if self.empty_in or dp.size == 0:
      return dx
    vals = self._from_pq(dp) * self._mask()
    np.add.at(dx, (slice(None), slice(None), *self.idx), vals)
    return dx

  def _w(self, rhs, cast=f64):  # logical (K, Cg, Q)
    w = np.transpose(cast(rhs), self.rhs_spec)
    return w.reshape(self.k, w.shape[1], self.Q)

  def fwd(self, lhs, rhs, cast=f64):
    """The forward in the arithmetic of cast(operands) (float64 by default)."""
    G, B = self.G, self.B
    x = np.transpose(cast(lhs), self.lhs_spec)
    X = self.patches(x)  # (N, C, P, Q)
    W = self._w(rhs, cast)
    N, C = X.shape[:2]
    if B > 1:
      y = np.einsum("bncpq,bkcq->nbkp", X.reshape(B, N // B, C, self.P, self.Q),
                    W.reshape(B, self.k // B, C, self.Q)).reshape(N // B, self.k, self.P)
    else:
      y = np.einsum("ngcpq,gkcq->ngkp", X.reshape(N, G, C // G, self.P, self.Q),
                    W.reshape(G, self.k // G, C // G, self.Q)).reshape(N, self.k, self.P)
    y = y.reshape(y.shape[0], self.k, *self.out)
    return np.transpose(y, np.argsort(self.out_spec))

  def vjp(self, lhs, rhs, ct):
    G, B = self.G, self.B
    x = np.transpose(f64(lhs), self.lhs_spec)
    X = self.patches(x)
    W = self._w(rhs)
    N, C = X.shape[:2]
    dy = np.transpose(f64(ct), self.out_spec).reshape(N // B, self.k, self.P)
    if B > 1:
      Xb = X.reshape(B, N // B, C, self.P, self.Q)
      dyb = dy.reshape(N // B, B, self.k // B, self.P)
      dW = np.einsum("bncpq,nbkp->bkcq", Xb, dyb).reshape(self.k, C, self.Q)
      dX = np.einsum("nbkp,bkcq->bncpq", dyb, W.reshape(B, self.k // B, C, self.Q)).reshape(N, C, self.P, self.Q)
    else:
      Xg = X.reshape(N, G, C // G, self.P, self.Q)
      dyg = dy.reshape(N, G, self.k // G, self.P)
      dW = np.einsum("ngcpq,ngkp->gkcq", Xg, dyg).reshape(self.k, C // G, self.Q)
      dX = np.einsum("ngkp,gkcq->ngcpq", dyg, W.reshape(G, self.k // G, C // G, self.Q)).reshape(N, C, self.P, self.Q)
    dx = self.patches_t(dX, x.shape)
    dw = dW.reshape(self.k, dW.shape[1], *self.win)
    return np.transpose(dx, np.argsort(self.lhs_spec)), np.transpose(dw, np.argsort(self.rhs_spec))


def _np_conv(lhs, rhs, kw):
  kw = dict(kw)
  kw.pop("precision", None)
  kw.pop("preferred_element_type", None)
  return _NumpyConv(np.shape(lhs), np.shape(rhs), **kw)


def ref_conv(lhs, rhs, **kw) -> np.ndarray:
  """float64 reference of lax.conv_general_dilated(lhs, rhs, **kw) from lhs, rhs upcast to float64."""
  return _np_conv(lhs, rhs, kw).fwd(lhs, rhs)


def _wrapping_u64(a) -> np.ndarray:
  """Integers or bools as uint64 (sign-extended: two's complement), whose products and sums wrap modulo 2^64."""
  a = np.asarray(a)
  return a.astype(np.uint64) if a.dtype.kind in "ub" else a.astype(np.int64).astype(np.uint64)


def ref_conv_int(lhs, rhs, out_dtype, **kw) -> np.ndarray:
  """Exact reference of an integer or bool convolution: operands widened (sign- or zero-extended), products and sums
  modulo 2^64, truncated to out_dtype (two's complement), or for a bool result whether the count is nonzero."""
  y = _np_conv(lhs, rhs, kw).fwd(lhs, rhs, cast=_wrapping_u64)
  out_dtype = np.dtype(out_dtype)
  return y != 0 if out_dtype == np.dtype(bool) else y.astype(out_dtype)


def ref_conv_vjp(lhs, rhs, ct, **kw):
  """float64 (d lhs, d rhs) of lax.conv_general_dilated for cotangent ct."""
  return _np_conv(lhs, rhs, kw).vjp(lhs, rhs, ct)


# ---------------------------------------------------------------------------------------------------------
# Random configurations over the full lax parameter space.
# A config is a plain dict (printable as a one-line repro); `materialize(cfg)` builds the call from it.

_SP = "DHW"


def _native_dn(ns, channels_last):
  sp = _SP[3 - ns:]
  if channels_last:
    return ("N" + sp + "C", sp + "IO", "N" + sp + "C")
  return ("NC" + sp, "OI" + sp, "NC" + sp)


def dn_from_cfg(cfg):
  """The dimension_numbers argument described by cfg['dn'] (None, a string triple or a ConvDimensionNumbers)."""
  kind, specs = cfg["dn"]
  if kind == "none":
    return None
  if kind == "str":
    return tuple(specs)
  return lax.ConvDimensionNumbers(*[tuple(s) for s in specs])


def dn_specs(cfg):
  """(lhs_spec, rhs_spec, out_spec) as index tuples: (batch/out-feature, feature/in-feature, spatial...)."""
  kind, specs = cfg["dn"]
  ns = cfg["ns"]
  if kind == "none":
    ident = tuple(range(ns + 2))
    return ident, ident, ident
  if kind == "cdn":
    return tuple(tuple(s) for s in specs)
  lhs_s, rhs_s, out_s = specs
  sp = [ch for ch in rhs_s if ch not in "OI"]  # lax orders spatial dims as the rhs spec lists them
  return ((lhs_s.index("N"), lhs_s.index("C"), *[lhs_s.index(ch) for ch in sp]),
          (rhs_s.index("O"), rhs_s.index("I"), *[rhs_s.index(ch) for ch in sp]),
          (out_s.index("N"), out_s.index("C"), *[out_s.index(ch) for ch in sp]))


def shapes_from_cfg(cfg):
  lhs_spec, rhs_spec, _ = dn_specs(cfg)
  ns = cfg["ns"]
  lhs_shape = [0] * (ns + 2)
  rhs_shape = [0] * (ns + 2)
  lhs_shape[lhs_spec[0]] = cfg["n"]
  lhs_shape[lhs_spec[1]] = cfg["c"]
  rhs_shape[rhs_spec[0]] = cfg["k"]
  rhs_shape[rhs_spec[1]] = cfg["c"] // cfg["groups"]
  for j in range(ns):
    lhs_shape[lhs_spec[2 + j]] = cfg["in"][j]
    rhs_shape[rhs_spec[2 + j]] = cfg["win"][j]
  return tuple(lhs_shape), tuple(rhs_shape)


def _precision(name):
  return None if name is None else getattr(lax.Precision, name)


def materialize(cfg):
  """(lhs, rhs, kwargs) for a config; inputs are numpy arrays of the config's dtype, seeded by cfg['seed']."""
  rng = np.random.default_rng(cfg["seed"])
  lhs_shape, rhs_shape = shapes_from_cfg(cfg)
  lhs = randn(rng, lhs_shape, cfg["dtype"])
  rhs = randn(rng, rhs_shape, cfg["dtype"])
  kw = materialize_kwargs(cfg)
  kw["precision"] = _precision(cfg["precision"])
  kw["preferred_element_type"] = None if cfg["pref"] is None else np_dtype(cfg["pref"])
  return lhs, rhs, kw


def make_cfg(ns, n, c, k, in_, win, *, dtype="float32", strides=None, padding="VALID", lhs_dil=None,
             rhs_dil=None, dn=("none", None), groups=1, batch_groups=1, precision="HIGHEST", pref=None,
             seed=0):
  return dict(ns=ns, n=n, c=c, k=k, **{"in": list(in_)}, win=list(win),
              strides=list(strides or [1] * ns), padding=padding,
              lhs_dil=None if lhs_dil is None else list(lhs_dil),
              rhs_dil=None if rhs_dil is None else list(rhs_dil), dn=dn, groups=groups,
              batch_groups=batch_groups, dtype=dtype, precision=precision, pref=pref, seed=seed)


def _rand_dn(rng, ns):
  r = rng.random()
  if r < 0.15:
    return ("none", None)
  if r < 0.40:
    return ("str", _native_dn(ns, True))
  if r < 0.55:
    return ("str", _native_dn(ns, False))
  if r < 0.78:  # odd string permutations, e.g. ('HWNC', 'OHWI', 'CWNH'); rhs spatial letters kept in order
    sp = list(_SP[3 - ns:])
    lhs = list("NC") + sp
    rng.shuffle(lhs)
    out = list("NC") + sp
    rng.shuffle(out)
    rhs_pos = sorted(rng.choice(ns + 2, size=2, replace=False).tolist())
    if rng.random() < 0.5:
      rhs_pos = rhs_pos[::-1]
    rhs = [None] * (ns + 2)
    rhs[rhs_pos[0]], rhs[rhs_pos[1]] = "O", "I"
    it = iter(sp)
    rhs = [ch if ch is not None else next(it) for ch in rhs]
    return ("str", ("".join(lhs), "".join(rhs), "".join(out)))
  # ConvDimensionNumbers with arbitrary permutations (spatial order free as well).
  return ("cdn", tuple(tuple(int(v) for v in rng.permutation(ns + 2)) for _ in range(3)))


def _lax_accepts(cfg) -> bool:
  lhs_shape, rhs_shape = shapes_from_cfg(cfg)
  kw = materialize_kwargs(cfg)
  try:
    jax.eval_shape(lambda a, b: lax.conv_general_dilated(a, b, **kw),
                   jax.ShapeDtypeStruct(lhs_shape, np.float32), jax.ShapeDtypeStruct(rhs_shape, np.float32))
    return True
  except Exception:  # noqa: BLE001 - any rejection by lax means the config is out of the domain
    return False


def materialize_kwargs(cfg):
  pad = cfg["padding"]
  return dict(
      window_strides=tuple(cfg["strides"]),
      padding=pad if isinstance(pad, str) else [tuple(p) for p in pad],
      lhs_dilation=None if cfg["lhs_dil"] is None else tuple(cfg["lhs_dil"]),
      rhs_dilation=None if cfg["rhs_dil"] is None else tuple(cfg["rhs_dil"]),
      dimension_numbers=dn_from_cfg(cfg),
      feature_group_count=cfg["groups"],
      batch_group_count=cfg["batch_groups"],
  )


def _dil(size, d):
  return 0 if size == 0 else (size - 1) * d + 1


def out_spatial(cfg):
  """Output spatial sizes (explicit padding only), as lax computes them."""
  res = []
  for j in range(cfg["ns"]):
    ld = 1 if cfg["lhs_dil"] is None else cfg["lhs_dil"][j]
    rd = 1 if cfg["rhs_dil"] is None else cfg["rhs_dil"][j]
    lo, hi = cfg["padding"][j]
    span = _dil(cfg["in"][j], ld) + lo + hi - _dil(cfg["win"][j], rd)
    res.append(max(0, span // cfg["strides"][j] + 1))
  return res


def macs(cfg) -> int:
  lhs_shape, rhs_shape = shapes_from_cfg(cfg)
  kw = materialize_kwargs(cfg)
  out = jax.eval_shape(lambda a, b: lax.conv_general_dilated(a, b, **kw),
                       jax.ShapeDtypeStruct(lhs_shape, np.float32),
                       jax.ShapeDtypeStruct(rhs_shape, np.float32)).shape
  return int(np.prod(out)) * int(np.prod(rhs_shape)) // max(cfg["k"], 1)


def random_cfg(rng, dtype, max_macs=150_000):
  """A random valid config over the lax parameter space (rejection-sampled against lax's shape rule)."""
  while True:
    ns = int(rng.choice([1, 2, 3], p=[0.35, 0.4, 0.25]))
    groups = batch_groups = 1
    r = rng.random()
    if r < 0.15:
      groups = int(rng.choice([2, 3, 4]))
    elif r < 0.25:  # depthwise, channel multiplier 1 or 2
      groups = int(rng.choice([3, 5, 8, 16]))
    elif r < 0.37:
      batch_groups = int(rng.choice([2, 3]))
    n = int(rng.choice([1, 1, 2, 3, 5]))
    if rng.random() < 0.02:
      n = 0
    n *= batch_groups
    if 0.15 <= r < 0.25:
      cg = 1
      kg = int(rng.choice([1, 1, 2]))
    else:
      cg = int(rng.choice([1, 2, 3, 4, 5, 8, 13]))
      kg = int(rng.choice([1, 2, 3, 4, 7, 8, 16]))
    if rng.random() < 0.02:
      cg = 0
    if rng.random() < 0.02:
      kg = 0
    c = cg * groups
    k = kg * max(groups, 1)
    if batch_groups > 1:
      k = int(rng.choice([1, 2, 3])) * batch_groups
    max_in, max_win = {1: (29, 9), 2: (13, 5), 3: (7, 3)}[ns]
    in_ = [int(rng.integers(1, max_in + 1)) for _ in range(ns)]
    win = [int(rng.integers(1, max_win + 1)) for _ in range(ns)]
    strides = [int(rng.choice([1, 1, 1, 2, 3])) for _ in range(ns)]
    rhs_dil = [int(rng.choice([1, 1, 1, 2, 3])) for _ in range(ns)] if rng.random() < 0.5 else None
    if rng.random() < 0.85:  # mostly inputs at least as large as the dilated window
      for j in range(ns):
        in_[j] = max(in_[j], _dil(win[j], 1 if rhs_dil is None else rhs_dil[j]))
    if rng.random() < 0.03:
      in_[int(rng.integers(ns))] = 0
    lhs_dil = [int(rng.choice([1, 1, 2, 3])) for _ in range(ns)] if rng.random() < 0.25 else None
    if lhs_dil is not None and all(d == 1 for d in lhs_dil) and rng.random() < 0.5:
      lhs_dil = None
    if lhs_dil is None and rng.random() < 0.45:
      padding = str(rng.choice(["SAME", "SAME_LOWER", "VALID"]))
    else:
      padding = []
      for j in range(ns):
        ewin = _dil(win[j], 1 if rhs_dil is None else rhs_dil[j])
        lo = int(rng.integers(-2, ewin + 3))
        hi = int(rng.integers(-2, ewin + 3))
        padding.append([lo, hi])
    dt = dtype
    pref = None
    if dt in ("bfloat16", "float16") and rng.random() < 0.3:
      pref = "float32"
    elif dt == "float32" and rng.random() < 0.1:
      pref = "float32"
    precision = "HIGHEST"
    if dt in ("bfloat16", "float16") and rng.random() < 0.3:
      precision = None
    cfg = make_cfg(ns, n, c, k, in_, win, dtype=dt, strides=strides, padding=padding, lhs_dil=lhs_dil,
                   rhs_dil=rhs_dil, dn=_rand_dn(rng, ns), groups=groups, batch_groups=batch_groups,
                   precision=precision, pref=pref, seed=int(rng.integers(0, 2**31 - 1)))
    if not _lax_accepts(cfg):
      continue
    if macs(cfg) > max_macs:
      continue
    return cfg


def fuzz_cfgs(dtype, count, salt="fwd"):
  rng = np.random.default_rng(seed_of("fuzz", salt, dtype))
  return [random_cfg(rng, dtype) for _ in range(count)]


# ---------------------------------------------------------------------------------------------------------
# Jaxpr inspection.

def _sub_jaxprs(value):
  if hasattr(value, "jaxpr") and hasattr(value, "consts"):  # ClosedJaxpr
    yield value.jaxpr
  elif hasattr(value, "eqns") and hasattr(value, "invars"):  # Jaxpr
    yield value
  elif isinstance(value, (tuple, list)):
    for v in value:
      yield from _sub_jaxprs(v)
  elif isinstance(value, dict):
    for v in value.values():
      yield from _sub_jaxprs(v)


def all_eqns(jaxpr):
  """Every equation of a (Closed)Jaxpr, recursing into every sub-jaxpr."""
  if hasattr(jaxpr, "consts") and hasattr(jaxpr, "jaxpr"):
    jaxpr = jaxpr.jaxpr
  for eqn in jaxpr.eqns:
    yield eqn
    for v in eqn.params.values():
      for sub in _sub_jaxprs(v):
        yield from all_eqns(sub)


def primitive_names(jaxpr):
  """Multiset (list) of primitive names in a (Closed)Jaxpr, recursing into every sub-jaxpr."""
  return [eqn.primitive.name for eqn in all_eqns(jaxpr)]


JAXCONV_PRIMS = ("jaxconv_fwd", "jaxconv_dgrad", "jaxconv_wgrad")


def conv_like(names):
  return [n for n in names if "conv" in n.lower().replace("convert", "")]


def session_shared_dir(tmp_path_factory):
  """A directory that every process of this pytest session sees: its base temporary directory, or under
  pytest-xdist that directory's parent (each worker's base is a subdirectory of it)."""
  base = tmp_path_factory.getbasetemp()
  return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def run_gpu_memory_test(tmp_path_factory, fn, *args, timeout=900):
  """Runs fn(*args) (a module-level function of a test file) for a test whose tensors take a tenth of a GPU's memory
  or more. Under pytest-xdist it runs in a fresh Python process, one at a time across the session's test processes
  (a lock in their shared temporary directory), and fails with the child's output if the child fails: a process's
  XLA allocator keeps what it once held, and with several such tests in flight on workers sharing one H200, tests of
  every kind failed with RESOURCE_EXHAUSTED. The child frees everything when it exits. Without
  xdist (one process, nothing else in flight) it runs in this process."""
  if not os.environ.get("PYTEST_XDIST_WORKER"):
    fn(*args)
    return
  folder, module = os.path.dirname(os.path.abspath(inspect.getfile(fn))), fn.__module__
  code = (f"import sys; sys.path.insert(0, {folder!r}); import jaxconv; jaxconv.set_debug_poison(True); "
          f"import {module}; {module}.{fn.__name__}(*{args!r})")
  with open(session_shared_dir(tmp_path_factory) / "gpu_memory_tests.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, (f"{module}.{fn.__name__}{args} failed in its own process (rc {proc.returncode}):\n"
                                f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
