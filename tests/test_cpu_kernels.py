"""The CPU kernels' GEMM paths (csrc/cpu/conv_igemm.cc, conv_wgrad_gemm.cc) against a float64 reference.

Every case here is not depthwise, so fwd, dgrad and wgrad all take the GEMM paths; sizes are odd or prime
(ragged micro-kernel tiles and panels), over both layouts, groups (down to one channel in or out per group),
batch groups, strides, both dilations and negative padding. Inputs are fresh random normal values each session
(JAXCONV_TEST_SEED reproduces a run; the seed is in every failure message). The reference is the float64
numpy convolution of conv_utils (checked against lax in test_reference.py), from the same rounded inputs.

The last test runs the same problems in subprocesses with JAXCONV_CPU_THREADS = 1, 2 and 3 and requires
bitwise equal results.
"""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import conv_utils as cu
import jaxconv


@pytest.fixture(autouse=True)
def _cpu_device():
  """Every test here runs on the CPU device, where the CPU kernels run, on a GPU machine too."""
  with jax.default_device(cu.cpu_device()):
    yield


SESSION_SEED = int(os.environ.get("JAXCONV_TEST_SEED", np.random.SeedSequence().entropy % (1 << 31)))

# (name, nspatial, layout, n, c, k, in, win, kwargs for conv_general_dilated)
CASES = [
    ("3x3_same_odd", 2, "NHWC", 2, 13, 19, (11, 7), (3, 3), dict(window_strides=(1, 1), padding="SAME")),
    ("3x3_same_nchw", 2, "NCHW", 3, 17, 23, (9, 13), (3, 3), dict(window_strides=(1, 1), padding="SAME")),
    ("3x3_stride2", 2, "NHWC", 2, 11, 29, (13, 12), (3, 3), dict(window_strides=(2, 2), padding=((1, 1), (1, 0)))),
    ("3x3_stride2_nchw", 2, "NCHW", 1, 16, 16, (15, 11), (3, 3), dict(window_strides=(2, 2), padding="SAME")),
    ("1x1_stride2", 2, "NHWC", 3, 37, 41, (9, 10), (1, 1), dict(window_strides=(2, 2), padding="VALID")),
    ("1x1_wide", 2, "NCHW", 1, 67, 131, (7, 5), (1, 1), dict(window_strides=(1, 1), padding="VALID")),
    ("5x3_stride3_rhsdil", 2, "NHWC", 2, 9, 17, (19, 17), (5, 3),
     dict(window_strides=(3, 2), padding=((2, 3), (1, 1)), rhs_dilation=(2, 3))),
    ("lhs_dilation", 2, "NHWC", 2, 10, 11, (7, 6), (3, 2),
     dict(window_strides=(1, 2), padding=((2, 1), (0, 1)), lhs_dilation=(2, 3))),
    ("lhs_rhs_dilation_nchw", 2, "NCHW", 1, 12, 9, (5, 8), (3, 3),
     dict(window_strides=(2, 1), padding=((1, 2), (2, 2)), lhs_dilation=(3, 2), rhs_dilation=(2, 1))),
    ("negative_padding", 2, "NHWC", 2, 14, 18, (13, 11), (3, 3),
     dict(window_strides=(1, 2), padding=((-2, 1), (2, -3)))),
    ("negative_padding_nchw", 2, "NCHW", 2, 8, 24, (10, 9), (2, 3),
     dict(window_strides=(2, 1), padding=((-1, -1), (-2, 3)), rhs_dilation=(1, 2))),
    ("groups3", 2, "NHWC", 2, 27, 33, (8, 7), (3, 3),
     dict(window_strides=(1, 1), padding="SAME", feature_group_count=3)),
    ("groups2_nchw_stride2", 2, "NCHW", 3, 22, 26, (11, 9), (3, 3),
     dict(window_strides=(2, 2), padding=((1, 1), (1, 1)), feature_group_count=2)),
    ("batch_groups2", 2, "NHWC", 4, 9, 22, (7, 9), (3, 3),
     dict(window_strides=(1, 1), padding="SAME", batch_group_count=2)),
    ("batch_groups3_nchw", 2, "NCHW", 3, 10, 27, (6, 5), (2, 2),
     dict(window_strides=(2, 1), padding=((0, 1), (1, 0)), batch_group_count=3)),
    ("conv1d_long", 1, "NHWC", 2, 19, 23, (101,), (7,), dict(window_strides=(3,), padding=((4, -2),))),
    ("conv1d_nchw_dilated", 1, "NCHW", 1, 8, 16, (53,), (5,), dict(window_strides=(1,), padding="SAME",
                                                                 rhs_dilation=(3,))),
    ("conv3d", 3, "NHWC", 1, 11, 13, (5, 6, 7), (3, 2, 3),
     dict(window_strides=(1, 2, 1), padding=((1, 1), (0, 1), (1, 1)))),
    ("conv3d_nchw", 3, "NCHW", 2, 9, 10, (4, 5, 3), (2, 3, 3),
     dict(window_strides=(2, 1, 1), padding="SAME", rhs_dilation=(1, 1, 2))),
    ("window_larger_than_input", 2, "NHWC", 1, 8, 8, (3, 4), (5, 5), dict(window_strides=(1, 1), padding="SAME")),
    ("one_channel", 2, "NCHW", 2, 1, 1, (9, 7), (3, 3), dict(window_strides=(1, 1), padding="SAME")),
    ("rgb_stem", 2, "NHWC", 2, 3, 7, (17, 15), (7, 7), dict(window_strides=(2, 2), padding=((3, 3), (3, 3)))),
    ("to_one_channel", 2, "NHWC", 3, 29, 1, (6, 5), (3, 3), dict(window_strides=(1, 1), padding="SAME")),
    ("channel_multiplier", 2, "NHWC", 2, 5, 15, (7, 8), (3, 3),
     dict(window_strides=(1, 1), padding="SAME", feature_group_count=5)),
    ("channel_reducer_nchw", 2, "NCHW", 2, 12, 4, (7, 6), (3, 3),
     dict(window_strides=(2, 1), padding="SAME", feature_group_count=4)),
    ("small_groups", 2, "NHWC", 1, 6, 9, (5, 7), (2, 3),
     dict(window_strides=(1, 2), padding=((1, 0), (2, 1)), feature_group_count=3, rhs_dilation=(2, 1))),
    ("batch_groups_one_channel", 2, "NCHW", 4, 1, 2, (6, 7), (3, 3),
     dict(window_strides=(1, 1), padding="SAME", batch_group_count=2)),
    ("long_window_1d", 1, "NCHW", 1, 2, 3, (300,), (63,), dict(window_strides=(1,), padding="SAME")),
]

DTYPES = ["float32", "float64", "bfloat16", "float16"]


def _dn(nspatial, layout):
  sp = "DHW"[3 - nspatial:]
  if layout == "NHWC":
    return ("N" + sp + "C", sp + "IO", "N" + sp + "C")
  return ("NC" + sp, "OI" + sp, "NC" + sp)


def _shapes(nspatial, layout, n, c, k, in_, win, groups):
  if layout == "NHWC":
    return (n, *in_, c), (*win, c // groups, k)
  return (n, c, *in_), (k, c // groups, *win)


def _problem(case, dtype, seed):
  name, ns, layout, n, c, k, in_, win, kw = case
  kw = dict(kw, dimension_numbers=_dn(ns, layout))
  x_shape, w_shape = _shapes(ns, layout, n, c, k, in_, win, kw.get("feature_group_count", 1))
  rng = np.random.default_rng(seed)
  x = cu.randn(rng, x_shape, dtype)
  w = cu.randn(rng, w_shape, dtype)
  return x, w, kw


def _context(dtype):
  return cu.enable_x64() if dtype == "float64" else _nullcontext()


class _nullcontext:
  def __enter__(self):
    return None

  def __exit__(self, *a):
    return False


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gemm_paths_vs_float64(case, dtype):
  seed = cu.seed_of(SESSION_SEED, case[0], dtype)
  x, w, kw = _problem(case, dtype, seed)
  what = f"case={case[0]} dtype={dtype} JAXCONV_TEST_SEED={SESSION_SEED}"
  tol = cu.tolerance(dtype)
  with _context(dtype):
    conv = lambda a, b: jaxconv.conv_general_dilated(a, b, **kw)
    y, vjp = jax.vjp(conv, jnp.asarray(x), jnp.asarray(w))
    ct = cu.randn(np.random.default_rng(seed + 1), y.shape, dtype)
    dx, dw = vjp(jnp.asarray(ct))
    y, dx, dw = np.asarray(y), np.asarray(dx), np.asarray(dw)
  ref_y = cu.ref_conv(x, w, **kw)
  ref_dx, ref_dw = cu.ref_conv_vjp(x, w, ct, **kw)
  cu.assert_close(y, ref_y, tol, "fwd " + what)
  cu.assert_close(dx, ref_dx, tol, "dgrad " + what)
  cu.assert_close(dw, ref_dw, tol, "wgrad " + what)


@pytest.mark.parametrize("layout", ["channels_last", "channels_first"])
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_gemm_fwd_fused_bias_activation(layout, activation, dtype):
  seed = cu.seed_of(SESSION_SEED, layout, activation, dtype)
  rng = np.random.default_rng(seed)
  n, c, k, h, wd = 2, 12, 37, 9, 11
  if layout == "channels_last":
    x_shape, w_shape = (n, h, wd, c), (3, 3, c, k)
    dn = ("NHWC", "HWIO", "NHWC")
  else:
    x_shape, w_shape = (n, c, h, wd), (k, c, 3, 3)
    dn = ("NCHW", "OIHW", "NCHW")
  x, w, b = (cu.randn(rng, s, dtype) for s in (x_shape, w_shape, (k,)))
  with _context(dtype):
    y = np.asarray(jaxconv.conv2d(jnp.asarray(x), jnp.asarray(w), jnp.asarray(b), stride=(2, 1), padding="SAME",
                                  activation=activation, data_format=layout))
  pre = cu.ref_conv(x, w, window_strides=(2, 1), padding="SAME", dimension_numbers=dn)
  bias_shape = (1, 1, 1, k) if layout == "channels_last" else (1, k, 1, 1)
  ref = cu.activation_ref(pre + cu.f64(b).reshape(bias_shape), activation)
  cu.assert_close(y, ref, cu.tolerance(dtype), f"act={activation} {layout} {dtype} JAXCONV_TEST_SEED={SESSION_SEED}")


# Problems big enough that the kernels use several threads (and, for the 1x1 wgrad with few output tiles,
# a split reduction; the depthwise one runs the direct kernels), run in subprocesses: the thread count and the
# ISA are fixed per process.
_SUBPROCESS_PROBLEMS = [
    ("nhwc3x3", (2, 23, 19, 24), (3, 3, 24, 40), ("NHWC", "HWIO", "NHWC"), (1, 1), "SAME", 1),
    ("nchw_s2_groups", (3, 32, 17, 21), (48, 16, 3, 3), ("NCHW", "OIHW", "NCHW"), (2, 2), "SAME", 2),
    ("1x1_few_tiles", (4, 61, 59, 8), (1, 1, 8, 16), ("NHWC", "HWIO", "NHWC"), (1, 1), "VALID", 1),
    ("depthwise_direct", (2, 37, 41, 32), (3, 3, 1, 32), ("NHWC", "HWIO", "NHWC"), (1, 1), "SAME", 32),
]

_SCRIPT = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    import jaxconv
    from test_cpu_kernels import _SUBPROCESS_PROBLEMS, _subprocess_inputs
    out, seed = sys.argv[1], int(sys.argv[2])
    results = {}
    for name, xs, ws, dn, st, pad, g in _SUBPROCESS_PROBLEMS:
      x, w, ct = (jnp.asarray(a) for a in _subprocess_inputs(seed, name))
      f = lambda a, b: jaxconv.conv_general_dilated(a, b, st, pad, dimension_numbers=dn, feature_group_count=g)
      y, vjp = jax.vjp(f, x, w)
      dx, dw = vjp(ct)
      results.update({name + "_y": np.asarray(y), name + "_dx": np.asarray(dx), name + "_dw": np.asarray(dw)})
    np.savez(out, **results)
""")


def _subprocess_inputs(seed, name):
  """float32 (x, w, cotangent) of one of _SUBPROCESS_PROBLEMS."""
  _, xs, ws, dn, st, pad, g = next(p for p in _SUBPROCESS_PROBLEMS if p[0] == name)
  rng = np.random.default_rng(cu.seed_of(seed, name))
  x = cu.randn(rng, xs, "float32")
  w = cu.randn(rng, ws, "float32")
  y_shape = jax.eval_shape(lambda a, b: jax.lax.conv_general_dilated(
      a, b, st, pad, dimension_numbers=dn, feature_group_count=g), x, w).shape
  return x, w, cu.randn(rng, y_shape, "float32")


def _run_subprocess(tmp_path, seed, tag, **env_vars):
  tests_dir = os.path.dirname(os.path.abspath(__file__))
  repo = os.path.dirname(tests_dir)
  path_list = [repo, tests_dir] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(path_list), **env_vars)
  path = tmp_path / f"{tag}.npz"
  proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(path), str(seed)], env=env, cwd=repo,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return dict(np.load(path))


def test_results_independent_of_thread_count(tmp_path):
  seed = cu.seed_of(SESSION_SEED, "threads")
  outs = {t: _run_subprocess(tmp_path, seed, f"t{t}", JAXCONV_CPU_THREADS=str(t)) for t in (1, 2, 3)}
  for threads in (2, 3):
    for key, ref in outs[1].items():
      got = outs[threads][key]
      assert got.shape == ref.shape
      assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), (
          f"{key}: {threads} threads differ from 1 thread (JAXCONV_TEST_SEED={SESSION_SEED})")


def test_portable_micro_kernels(tmp_path):
  """JAXCONV_CPU_ISA=baseline: the portable micro-kernels, against the float64 reference."""
  seed = cu.seed_of(SESSION_SEED, "baseline")
  out = _run_subprocess(tmp_path, seed, "baseline", JAXCONV_CPU_ISA="baseline", JAXCONV_CPU_THREADS="2")
  for name, xs, ws, dn, st, pad, g in _SUBPROCESS_PROBLEMS:
    x, w, ct = _subprocess_inputs(seed, name)
    kw = dict(window_strides=st, padding=pad, dimension_numbers=dn, feature_group_count=g)
    ref_dx, ref_dw = cu.ref_conv_vjp(x, w, ct, **kw)
    what = f"{name} JAXCONV_TEST_SEED={SESSION_SEED}"
    cu.assert_close(out[name + "_y"], cu.ref_conv(x, w, **kw), 1e-5, "fwd " + what)
    cu.assert_close(out[name + "_dx"], ref_dx, 1e-5, "dgrad " + what)
    cu.assert_close(out[name + "_dw"], ref_dw, 1e-5, "wgrad " + what)
