"""The kernel variant registry (csrc/dispatch/variants.def, mirrored by jaxconv/registry.py).

On every build: the table's metadata, the names algorithm= takes, the generated documentation table, and the
catalogue of cases covering every variant. On CUDA builds (the `kernels` marker: the predicates run on the host, no
GPU needed): each variant's predicate accepts its catalogue cases, forced requests fail with each variant's reason,
and the variant auto picks for a table of problems, on a Hopper and on an Ampere GPU. On a GPU (`gpu` marker): each
variant forced on each of its cases runs (the compiled program names it) and matches a float64 reference.
"""

from __future__ import annotations

import functools
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import conv_utils as cu
import jaxconv
import variant_cases as vc
from jaxconv import _native, registry
from jaxconv.algorithms import families_markdown, table_markdown

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONV = {1: jaxconv.conv1d, 2: jaxconv.conv2d, 3: jaxconv.conv3d}
HOPPER, AMPERE = registry.default_device(90), registry.default_device(80)


# ---- metadata -----------------------------------------------------------------------------------------------

def test_variant_names_are_unique_and_name_their_family():
  names = registry.variant_names()
  assert len(set(names)) == len(names) and len(names) >= 10
  for v in registry.variants():
    family, _, technique = v.name.partition(".")
    assert family == v.family and re.fullmatch(r"[a-z0-9_]+", technique), v.name
    assert v.family in registry.families() and (v.also == "" or v.also in registry.families()), v
    assert v.ops and set(v.ops) <= set(registry.OPS), v
    assert v.dtypes and v.summary and "\n" not in v.summary, v


def test_every_family_selects_a_variant():
  for family in registry.families():
    assert any(family in v.selectors for v in registry.variants()), family


def test_every_variant_names_an_existing_file():
  for v in registry.variants():
    assert list((ROOT / "csrc").glob(v.file)), (v.name, v.file)


def _fnv1a_20(name):
  h = 2166136261
  for b in name.encode():
    h = ((h ^ b) * 16777619) & 0xFFFFFFFF
  return ((h >> 20) ^ h) & 0xFFFFF


def test_request_codes():
  codes = [registry.request_code(n) for n in ("auto", *registry.families(), *registry.variant_names())]
  assert codes[0] == 0 and len(set(codes)) == len(codes)
  assert codes[1:1 + len(registry.families())] == list(range(1, 1 + len(registry.families())))
  # A variant's code is a function of its name alone (exported programs that force a variant carry it, and the table
  # may be reordered): 2^16 plus the name's 32-bit FNV-1a hash folded to 20 bits.
  for name in registry.variant_names():
    assert registry.request_code(name) == (1 << 16) + _fnv1a_20(name), name
  with pytest.raises(ValueError, match=r"unknown algorithm 'winograd'.*python -m jaxconv.algorithms"):
    registry.request_code("winograd")


def test_unknown_algorithm_is_a_trace_time_error_naming_the_argument():
  x, w = jnp.ones((1, 6, 6, 2)), jnp.ones((3, 3, 2, 4))
  with pytest.raises(ValueError, match=r"conv2d: unknown algorithm 'winograd'"):
    jax.eval_shape(lambda x, w: jaxconv.conv2d(x, w, algorithm="winograd"), x, w)


def test_documentation_table_is_generated_from_the_registry():
  text = (ROOT / "docs" / "algorithms.md").read_text()
  m = re.search(r"<!-- registry-table:begin -->\n(.*?)<!-- registry-table:end -->", text, re.S)
  assert m and m.group(1) == table_markdown(), "regenerate it: python -m jaxconv.algorithms --markdown"


def test_readme_families_table_is_generated_from_the_registry():
  text = (ROOT / "README.md").read_text()
  m = re.search(r"<!-- families:begin -->\n(.*?)<!-- families:end -->", text, re.S)
  assert m and m.group(1) == families_markdown(), "regenerate it: python -m jaxconv.algorithms --families"


def test_a_forced_variant_without_an_ops_kernel_hands_that_op_to_its_family():
  fwd_only = next(v for v in registry.variants() if v.ops == ("fwd",))
  assert registry.op_request("fwd", fwd_only.name) == fwd_only.name
  assert registry.op_request("dgrad", fwd_only.name) == fwd_only.family
  assert registry.op_request("wgrad", "small") == "small" and registry.op_request("dgrad", "auto") == "auto"


def test_the_catalogue_covers_every_variant():
  assert set(vc.CATALOGUE) == set(registry.variant_names())
  for name, cases in vc.CATALOGUE.items():
    v = next(v for v in registry.variants() if v.name == name)
    for case in cases:
      assert set(case.ops) <= set(v.ops) and case.dtype in v.dtypes, (name, case)


def test_builds_without_kernels_say_so():
  if registry.has_kernels():
    pytest.skip("this build has the kernels")
  params = jaxconv.ConvSpec("channels_last", (8,), (3,), (1,), ((1, 1),), (1,), (1,)).ffi_params(1, 1, 1)
  reasons = registry.explain("fwd", params, np.float32)
  assert all(why for _, why, _ in reasons)  # nothing runs
  takers = [name for name, why, _ in reasons if "without CUDA" in why]  # every fwd variant for float32 says why
  assert set(takers) == {v.name for v in registry.variants() if "fwd" in v.ops and "float32" in v.dtypes}


# ---- predicates (CUDA builds, on the host) ----------------------------------------------------------------------

def _problems(case: vc.Case):
  """{op: tuning.tuner.Problem} of a catalogue case, as the lowering sees it."""
  nd = case.nspatial
  x = jax.ShapeDtypeStruct(case.x, case.dtype)
  w = jax.ShapeDtypeStruct(case.w, case.dtype)
  pad = case.padding if isinstance(case.padding, str) else tuple(case.padding)
  tup = lambda v: (v,) * nd if isinstance(v, int) else tuple(v)
  with cu.enable_x64():
    return jaxconv.algorithms.problems(x, w, tup(case.stride), pad, rhs_dilation=tup(case.dilation),
                                       dimension_numbers=cu.channels_last_dn(nd),
                                       feature_group_count=case.groups, precision=case.precision)


CATALOGUE_CASES = [(name, i, case) for name, cases in vc.CATALOGUE.items() for i, case in enumerate(cases)]


@pytest.mark.kernels
@pytest.mark.parametrize("name,i,case", CATALOGUE_CASES, ids=[f"{n}-{i}" for n, i, _ in CATALOGUE_CASES])
def test_each_variant_accepts_its_catalogue_cases(name, i, case):
  probs = _problems(case)
  for op in case.ops:
    p = probs[op]
    forced = registry.resolve(op, p.spec.replace(algorithm=name).ffi_params(*p.nck), p.dtype, p.out_dtype,
                              HOPPER)
    assert forced.ok and forced.name == name, (op, forced.why)


@pytest.mark.kernels
def test_a_forced_family_that_does_not_apply_names_every_variants_reason():
  x, w = jnp.ones((2, 6, 6, 32)), jnp.ones((3, 3, 32, 4))  # 32 input channels: no few-channel variant applies
  with pytest.raises(ValueError, match=r"algorithm='small' cannot run this convolution: no variant of "
                                       r"algorithm=small runs this problem \(small\.plane_stencil: .*; "
                                       r"small\.gather: [^;)]+\)"):
    jax.eval_shape(lambda x, w: jaxconv.conv2d(x, w, algorithm="small"), x, w)


# (description, conv_general_dilated arguments, dtype, {op: variant on Hopper}, {op: variant on Ampere})
NHWC, NWC, NDHWC = cu.channels_last_dn(2), cu.channels_last_dn(1), cu.channels_last_dn(3)
AUTO_TABLE = [
    ("long 1-D filter", ((1, 100000, 1), (2047, 1, 1), (1,), "SAME", dict(dimension_numbers=NWC)), "float32",
     {"fwd": "long1d.tiled", "dgrad": "long1d.tiled", "wgrad": "long1d.tiled"}, None),
    ("short 1-D filter, few channels", ((2, 4096, 2), (9, 2, 2), (1,), "SAME", dict(dimension_numbers=NWC)),
     "float32", {"fwd": "small.gather"}, None),
    ("first layer 3 -> 16", ((4, 64, 64, 3), (3, 3, 3, 16), (1, 1), "SAME", dict(dimension_numbers=NHWC)),
     "float32", {"fwd": "small.rowseg"}, None),
    ("1 -> 1 3x3 stencil", ((1, 512, 512, 1), (3, 3, 1, 1), (1, 1), "SAME", dict(dimension_numbers=NHWC)),
     "bfloat16", {"fwd": "small.plane_stencil", "dgrad": "small.plane_stencil", "wgrad": "small.plane_stencil"},
     None),
    ("64 -> 1 dilated 3x3", ((1, 256, 256, 64), (3, 3, 64, 1), (1, 1), "SAME",
                             dict(rhs_dilation=(2, 2), dimension_numbers=NHWC)), "float32",
     {"fwd": "small.reduce_stencil", "wgrad": "direct.cone_wgrad"}, None),
    ("ResNet 3x3 64 -> 64", ((8, 56, 56, 64), (3, 3, 64, 64), (1, 1), "SAME", dict(dimension_numbers=NHWC)),
     "bfloat16", {"fwd": "implicit_gemm.sm90", "dgrad": "implicit_gemm.sm90", "wgrad": "implicit_gemm.sm90"},
     {"fwd": "implicit_gemm.sm80", "dgrad": "implicit_gemm.sm80", "wgrad": "implicit_gemm.sm80"}),
    ("ResNet 1x1 256 -> 64", ((8, 56, 56, 256), (1, 1, 256, 64), (1, 1), "VALID", dict(dimension_numbers=NHWC)),
     "bfloat16", {"fwd": "implicit_gemm.gemm1x1_sm90"}, {"fwd": "implicit_gemm.sm80"}),
    ("MobileNet depthwise 3x3", ((8, 56, 56, 144), (3, 3, 1, 144), (1, 1), "SAME",
                                 dict(feature_group_count=144, dimension_numbers=NHWC)), "bfloat16",
     {"fwd": "depthwise.tma_sm90", "wgrad": "depthwise.reg"}, {"fwd": "depthwise.reg"}),
    ("ConvNeXt depthwise 7x7", ((4, 28, 28, 96), (7, 7, 1, 96), (1, 1), "SAME",
                                dict(feature_group_count=96, dimension_numbers=NHWC)), "bfloat16",
     {"fwd": "depthwise.mma", "dgrad": "depthwise.mma", "wgrad": "depthwise.mma"}, None),
    # Depthwise channels off the 16-byte vector: the general depthwise kernels' cost rule leaves them to XLA; with
    # aligned channels they keep what the vector kernels do not take (here a dilated window).
    ("depthwise, odd channels", ((8, 56, 56, 89), (3, 3, 1, 89), (1, 1), "SAME",
                                 dict(feature_group_count=89, dimension_numbers=NHWC)), "bfloat16",
     {"fwd": "xla.conv", "dgrad": "xla.conv", "wgrad": "xla.conv"},
     {"fwd": "xla.conv", "dgrad": "xla.conv", "wgrad": "xla.conv"}),
    ("depthwise, odd channels, stride 2", ((4, 64, 47, 45), (3, 3, 1, 45), (2, 2), "VALID",
                                           dict(feature_group_count=45, dimension_numbers=NHWC)), "float32",
     {"fwd": "xla.conv", "dgrad": "xla.conv", "wgrad": "xla.conv"}, None),
    ("depthwise dilated, 512 channels", ((8, 12, 12, 512), (3, 4, 1, 512), (1, 1), ((2, 2), (3, 3)),
                                         dict(rhs_dilation=(2, 2), feature_group_count=512,
                                              dimension_numbers=NHWC)), "bfloat16",
     {"fwd": "depthwise.tiled", "dgrad": "depthwise.tiled", "wgrad": "depthwise.vec"}, None),
    # 3-D float32 (TF32): the forward and the data gradient on the Hopper forward kernels (the data gradient with
    # the flipped filter), the filter gradient left to XLA; the mma.sync kernels take no 3-D problem.
    ("C3D 3x3x3 64 -> 64", ((2, 8, 16, 16, 64), (3, 3, 3, 64, 64), (1, 1, 1), "SAME",
                            dict(dimension_numbers=NDHWC)), "float32",
     {"fwd": "implicit_gemm.sm90", "dgrad": "implicit_gemm.flipped_dgrad_sm90", "wgrad": "xla.conv"},
     {"fwd": "xla.conv", "dgrad": "xla.conv", "wgrad": "xla.conv"}),
    ("3-D stride 2, 256 -> 96", ((2, 8, 16, 16, 256), (3, 3, 3, 256, 96), (2, 2, 2), ((1, 1), (1, 1), (1, 1)),
                                 dict(dimension_numbers=NDHWC)), "bfloat16",
     {"dgrad": "implicit_gemm.phased_dgrad_sm90"}, {"dgrad": "xla.conv"}),
    ("ResNeXt grouped 3x3", ((4, 28, 28, 256), (3, 3, 8, 256), (1, 1), "SAME",
                             dict(feature_group_count=32, dimension_numbers=NHWC)), "bfloat16",
     {"fwd": "xla.conv", "dgrad": "xla.conv", "wgrad": "xla.conv"}, None),
    ("transposed convolution", ((2, 16, 16, 32), (3, 3, 32, 16), (1, 1), ((1, 2), (1, 2)),
                                dict(lhs_dilation=(2, 2), dimension_numbers=NHWC)), "float32",
     {"fwd": "xla.conv"}, None),
    ("float64", ((2, 16, 16, 32), (3, 3, 32, 32), (1, 1), "SAME", dict(dimension_numbers=NHWC)), "float64",
     {"fwd": "xla.conv"}, None),
    # k off the alignment: the padded Hopper kernels where their cost rule takes the problem (a window over 32+ input
    # channels up to 2^31 multiply-adds; 16-bit filter gradients of dilated filters), else XLA's floor, which comes
    # before the padded mma.sync kernels.
    ("odd k 64 -> 131", ((4, 28, 28, 64), (3, 3, 64, 131), (1, 1), "SAME", dict(dimension_numbers=NHWC)), "bfloat16",
     {"fwd": "implicit_gemm.padded_k_sm90", "dgrad": "implicit_gemm.padded_k_sm90",
      "wgrad": "implicit_gemm.padded_k_sm90"},
     {"fwd": "xla.conv", "dgrad": "xla.conv", "wgrad": "xla.conv"}),
    ("odd k TF32 48 -> 45", ((8, 20, 20, 48), (3, 3, 48, 45), (1, 1), "SAME", dict(dimension_numbers=NHWC)), "float32",
     {"fwd": "implicit_gemm.padded_k_sm90", "dgrad": "xla.conv", "wgrad": "xla.conv"}, None),
    ("odd k past 2^31 multiply-adds", ((32, 56, 56, 128), (3, 3, 128, 131), (1, 1), "SAME",
                                       dict(dimension_numbers=NHWC)), "bfloat16",
     {"fwd": "xla.conv", "dgrad": "xla.conv", "wgrad": "xla.conv"}, None),
    ("odd k 1x1", ((8, 28, 28, 64), (1, 1, 64, 131), (1, 1), "VALID", dict(dimension_numbers=NHWC)), "bfloat16",
     {"fwd": "xla.conv", "dgrad": "xla.conv", "wgrad": "xla.conv"}, None),
    ("odd k dilated, 24 channels", ((4, 26, 30, 24), (3, 3, 24, 86), (1, 1), "SAME",
                                    dict(rhs_dilation=(2, 2), dimension_numbers=NHWC)), "bfloat16",
     {"fwd": "xla.conv", "dgrad": "xla.conv", "wgrad": "implicit_gemm.padded_k_sm90"},
     {"wgrad": "xla.conv"}),
    ("odd k dilated TF32", ((4, 26, 30, 24), (3, 3, 24, 86), (1, 1), "SAME",
                            dict(rhs_dilation=(2, 2), dimension_numbers=NHWC)), "float32",
     {"wgrad": "xla.conv"}, None),
]


@pytest.mark.kernels
@pytest.mark.parametrize("dtype,k,kp", [("bfloat16", 131, 136), ("bfloat16", 3, 8), ("float32", 45, 48)])
def test_odd_k_runs_padded_when_the_family_is_forced(dtype, k, kp):
  """algorithm="implicit_gemm" on output channels off the alignment: the padded-k variants (Hopper kernels where they
  take the padded problem, else mma.sync), with a workspace that holds y or dy at the padded k; the unpadded ones say
  why not. An aligned k is not theirs."""
  x, w = jax.ShapeDtypeStruct((2, 14, 15, 64), dtype), jax.ShapeDtypeStruct((3, 3, 64, k), dtype)
  with cu.enable_x64():
    probs = jaxconv.algorithms.problems(x, w, (1, 1), "SAME", dimension_numbers=NHWC)
  hopper = {"fwd": "implicit_gemm.padded_k_sm90", "dgrad": "implicit_gemm.padded_k_sm90",
            "wgrad": "implicit_gemm.padded_k_sm90"}
  if dtype == "float32":  # the Hopper kernels take TF32 forwards only
    hopper.update(dgrad="implicit_gemm.padded_k_sm80", wgrad="implicit_gemm.padded_k_sm80")
  for dev, expect in ((HOPPER, hopper), (AMPERE, dict.fromkeys(hopper, "implicit_gemm.padded_k_sm80"))):
    for op, name in expect.items():
      p = probs[op]
      got = registry.resolve(op, p.spec.replace(algorithm="implicit_gemm").ffi_params(*p.nck), p.dtype,
                             p.out_dtype, dev)
      assert got.name == name, (dev, op, got)
      out_elems = 2 * 14 * 15 * kp  # y (fwd) or dy (dgrad, wgrad) at the padded k
      assert got.workspace_bytes >= out_elems * np.dtype(dtype).itemsize, (op, got)
      why = dict((n, r) for n, r, _ in registry.explain(op, p.params, p.dtype, p.out_dtype, dev))
      assert f"multiple of {16 // np.dtype(dtype).itemsize}" in why["implicit_gemm.sm80"], why
  aligned = jax.ShapeDtypeStruct((3, 3, 64, 136), dtype)
  with cu.enable_x64():
    p = jaxconv.algorithms.problems(x, aligned, (1, 1), "SAME", dimension_numbers=NHWC)["fwd"]
  why = dict((n, r) for n, r, _ in registry.explain("fwd", p.params, p.dtype, p.out_dtype, HOPPER))
  assert "the unpadded variants take the problem" in why["implicit_gemm.padded_k_sm90"], why


@pytest.mark.kernels
@pytest.mark.parametrize("what,args,dtype,hopper,ampere", AUTO_TABLE, ids=[t[0] for t in AUTO_TABLE])
def test_the_variant_auto_picks(what, args, dtype, hopper, ampere):
  x, w, strides, padding, kw = args
  with cu.enable_x64():
    probs = jaxconv.algorithms.problems(jax.ShapeDtypeStruct(x, dtype), jax.ShapeDtypeStruct(w, dtype), strides,
                                        padding, **kw)
  for dev, expect in ((HOPPER, hopper), (AMPERE, ampere)):
    for op, name in (expect or {}).items():
      p = probs[op]
      got = registry.resolve(op, p.params, p.dtype, p.out_dtype, dev)
      assert got.name == name, (what, dev, op, got, [r for r in registry.explain(op, p.params, p.dtype,
                                                                                 p.out_dtype, dev) if not r[1]])


@pytest.mark.kernels
@pytest.mark.parametrize("dtype,c", [("bfloat16", 89), ("float32", 45), ("bfloat16", 96)])
def test_the_depthwise_cost_rule_binds_auto_only(dtype, c):
  """Depthwise channels off the 16-byte vector: auto passes the general depthwise kernels over (their cost rule), while
  algorithm="depthwise" still runs them; with aligned channels the rule takes them (here for a dilated window, which
  the vector kernels' forward does not take)."""
  x, w = jax.ShapeDtypeStruct((4, 20, 23, c), dtype), jax.ShapeDtypeStruct((3, 3, 1, c), dtype)
  with cu.enable_x64():
    probs = jaxconv.algorithms.problems(x, w, (1, 1), "SAME", rhs_dilation=(2, 2), feature_group_count=c,
                                        dimension_numbers=NHWC)
  aligned, general = c * np.dtype(dtype).itemsize % 16 == 0, 0
  for op in ("fwd", "dgrad", "wgrad"):
    p = probs[op]
    forced = registry.resolve(op, p.spec.replace(algorithm="depthwise").ffi_params(*p.nck), p.dtype, p.out_dtype,
                              HOPPER)
    auto = registry.resolve(op, p.params, p.dtype, p.out_dtype, HOPPER)
    why = {n: (r, pref) for n, r, pref in registry.explain(op, p.params, p.dtype, p.out_dtype, HOPPER)}
    if forced.name in ("depthwise.tiled", "depthwise.gather"):
      general += 1
      assert why[forced.name][0] == ""  # it applies: only the rule can pass it over
      assert (auto.name == forced.name) == aligned, (op, forced, auto, why[forced.name])
      assert ("16-byte vector" in why[forced.name][1]) == (not aligned), why[forced.name]
    if not aligned:
      assert auto.name == "xla.conv", (op, auto)
  assert general >= 2  # the dilated window keeps the forward and the data gradient off the vector kernels


# ---- on a GPU: each variant forced on its cases -------------------------------------------------------------------

def _variants_in(text):
  """{op: [variant names]} of the jaxconv custom calls in a lowered module's text."""
  ops = {"jaxconv_fwd": "fwd", "jaxconv_dgrad": "dgrad", "jaxconv_wgrad": "wgrad"}
  off = _native.param_offset("variant")
  found = {}
  for m in re.finditer(r"custom_call @(jaxconv_\w+)\(.*?params = dense<\[([-\d, ]+)\]>", text):
    index = int(m.group(2).split(",")[off])
    found.setdefault(ops[m.group(1)], []).append(registry.variant_names()[index])
  return found


@functools.cache
def _tolerance(dtype, precision, name):
  if dtype == "float32" and precision != "highest":
    return 3e-3  # TF32
  if dtype == "float32" and name.startswith("implicit_gemm"):
    return 3e-5  # 3xTF32
  return cu.tolerance(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("name,i,case", CATALOGUE_CASES, ids=[f"{n}-{i}" for n, i, _ in CATALOGUE_CASES])
def test_each_variant_forced_on_its_cases_matches_the_float64_reference(name, i, case, rng):
  conv = CONV[case.nspatial]
  kw = case.conv_kwargs()
  if np.dtype(case.dtype).kind in "biu":  # (bfloat16 is no np.floating: ask for integer kinds)
    return _check_integer_case(name, case, conv, kw, rng)
  with cu.gpu_context(case.dtype):
    x = cu.to_gpu(cu.randn(rng, case.x, case.dtype))
    w = cu.to_gpu(cu.randn(rng, case.w, case.dtype))
    f = lambda x, w: conv(x, w, algorithm=name, **kw)
    y = jax.eval_shape(f, x, w)
    ct = cu.to_gpu(cu.randn(rng, y.shape, case.dtype))
    g = jax.jit(lambda x, w, ct: (f(x, w), *jax.vjp(f, x, w)[1](ct)))
    lowered = g.lower(x, w, ct)
    found = _variants_in(lowered.as_text())
    for op in case.ops:
      if name == "xla.conv":
        assert op not in found, (op, found)  # XLA's own convolution: no custom call
      else:
        assert name in found.get(op, []), (op, found)
    got = dict(zip(("fwd", "dgrad", "wgrad"), lowered.compile()(x, w, ct)))
  nd = case.nspatial
  tup = lambda v: (v,) * nd if isinstance(v, int) else tuple(v)
  pad = case.padding if isinstance(case.padding, str) else tuple(case.padding)
  ref_kw = dict(window_strides=tup(case.stride), padding=pad, rhs_dilation=tup(case.dilation),
                dimension_numbers=cu.channels_last_dn(nd), feature_group_count=case.groups)
  ref = {"fwd": cu.lax_ref_conv(np.asarray(x), np.asarray(w), **ref_kw)}
  ref["dgrad"], ref["wgrad"] = cu.lax_ref_conv_vjp(np.asarray(x), np.asarray(w), np.asarray(ct), **ref_kw)
  tol = _tolerance(case.dtype, case.precision, name)
  for op in case.ops:
    cu.assert_close(got[op], ref[op], tol, f"{name} {op} {case.label()}")


def _check_integer_case(name, case, conv, kw, rng):
  """An integer or bool case: the forward only (lax has no integer gradients), exact against lax on the CPU."""
  kw = {k: v for k, v in kw.items() if k != "precision"}
  lo, hi = (0, 2) if case.dtype == "bool" else (-8, 8)
  x, w = (rng.integers(lo, hi, size=s).astype(case.dtype) for s in (case.x, case.w))
  f = jax.jit(lambda x, w: conv(x, w, algorithm=name, **kw))
  lowered = f.lower(cu.to_gpu(x), cu.to_gpu(w))
  assert name in _variants_in(lowered.as_text()).get("fwd", []), lowered.as_text()[:2000]
  got = np.asarray(lowered.compile()(cu.to_gpu(x), cu.to_gpu(w)))
  nd = case.nspatial
  tup = lambda v: (v,) * nd if isinstance(v, int) else tuple(v)
  pad = case.padding if isinstance(case.padding, str) else tuple(case.padding)
  want = cu.ref_conv_int(x, w, got.dtype, window_strides=tup(case.stride), padding=pad,
                         rhs_dilation=tup(case.dilation), dimension_numbers=cu.channels_last_dn(nd),
                         feature_group_count=case.groups)
  np.testing.assert_array_equal(got, want)
