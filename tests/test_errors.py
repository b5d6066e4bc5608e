"""One test per user error: the exception type (lax's where lax raises a clear TypeError/ValueError) and a
message naming the offending argument, raised at trace time (eagerly, under jit and under eval_shape)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxconv

NHWC = ("NHWC", "HWIO", "NHWC")


def _x(shape=(2, 6, 6, 4), dtype=jnp.float32):
  return jnp.ones(shape, dtype)


def _raises_everywhere(exc, match, fn, *args):
  """`fn(*args)` raises exc matching `match` eagerly, under jit and under eval_shape (trace time)."""
  with pytest.raises(exc, match=match):
    fn(*args)
  with pytest.raises(exc, match=match):
    jax.jit(fn)(*args)
  with pytest.raises(exc, match=match):
    jax.eval_shape(fn, *args)


def cgd(**kw):
  def f(x, w):
    args = dict(window_strides=(1, 1), padding="VALID", dimension_numbers=NHWC)
    args.update(kw)
    return jaxconv.conv_general_dilated(x, w, **args)
  return f


# ---- conv_general_dilated --------------------------------------------------------------------------------

def _lax_error(fn, *args):
  """The exception lax raises for the same call, to compare types and wording with."""
  try:
    fn(*args)
  except Exception as e:  # noqa: BLE001 - any exception is what is compared
    return e
  raise AssertionError("lax accepted the call")


@pytest.mark.parametrize("dimension_numbers", [None, NHWC, lax.ConvDimensionNumbers((0, 3, 1, 2), (3, 2, 0, 1),
                                                                                    (0, 3, 1, 2))])
def test_rank_mismatch(dimension_numbers):
  # lax: TypeError from conv_dimension_numbers for None and strings, ValueError from its shape rule for a
  # ConvDimensionNumbers object; jaxconv raises the same type with lax's message.
  x, w = _x(), _x((3, 4, 4))
  pads = [(0, 0)] * 2  # explicit: with a string, lax fails on the ConvDimensionNumbers before its shape rule
  want = _lax_error(lambda a, b: lax.conv_general_dilated(a, b, (1, 1), pads, dimension_numbers=dimension_numbers),
                    x, w)
  assert type(want) is (ValueError if isinstance(dimension_numbers, lax.ConvDimensionNumbers)
                        else TypeError)
  _raises_everywhere(type(want), r"(?i)lhs and rhs.*(ndim|number of dimensions)",
                     cgd(dimension_numbers=dimension_numbers, padding=pads), x, w)


def test_rank_unsupported_4_spatial_dims():
  x, w = _x((1, 2, 3, 3, 3, 3)), _x((2, 2, 1, 1, 1, 1))
  with pytest.raises((TypeError, ValueError), match=r"(?i)spatial|rank|lhs"):
    jaxconv.conv_general_dilated(x, w, (1,) * 4, "VALID")


def test_channels_do_not_match():
  _raises_everywhere(ValueError, r"feature", cgd(), _x(), _x((3, 3, 3, 5)))


def test_feature_groups_do_not_divide_lhs_features():
  _raises_everywhere(ValueError, r"feature_group_count", cgd(feature_group_count=3), _x(), _x((3, 3, 1, 6)))


def test_feature_groups_do_not_divide_out_features():
  _raises_everywhere(ValueError, r"feature_group_count", cgd(feature_group_count=2), _x(), _x((3, 3, 2, 5)))


def test_batch_groups_do_not_divide_batch():
  _raises_everywhere(ValueError, r"batch_group_count", cgd(batch_group_count=3), _x((4, 6, 6, 4)),
                     _x((3, 3, 4, 6)))


def test_batch_groups_do_not_divide_out_features():
  _raises_everywhere(ValueError, r"batch_group_count", cgd(batch_group_count=2), _x((4, 6, 6, 4)),
                     _x((3, 3, 4, 5)))


def test_both_group_counts_above_one():
  _raises_everywhere(ValueError, r"batch_group_count.*feature_group_count|feature_group_count.*batch_group_count",
                     cgd(feature_group_count=2, batch_group_count=2), _x((4, 6, 6, 4)), _x((3, 3, 2, 4)))


@pytest.mark.parametrize("bad", [0, -1])
def test_group_count_not_positive(bad):
  _raises_everywhere(ValueError, r"feature_group_count", cgd(feature_group_count=bad), _x(), _x((3, 3, 4, 4)))
  _raises_everywhere(ValueError, r"batch_group_count", cgd(batch_group_count=bad), _x(), _x((3, 3, 4, 4)))


@pytest.mark.parametrize("rhs_dtype", [jnp.bfloat16, jnp.int8])
def test_dtype_mismatch(rhs_dtype):
  want = _lax_error(lambda a, b: lax.conv_general_dilated(a, b, (1, 1), "VALID", dimension_numbers=NHWC),
                    _x(), _x((3, 3, 4, 4), rhs_dtype))
  assert type(want) is TypeError and "same dtypes" in str(want)
  _raises_everywhere(TypeError, r"requires arguments to have the same dtypes, got float32, "
                     f"{jnp.dtype(rhs_dtype).name}", cgd(), _x(), _x((3, 3, 4, 4), rhs_dtype))


@pytest.mark.parametrize("dtype", ["int2", "uint2"])
def test_unsupported_dtype(dtype):
  # lax traces these but XLA cannot compile a convolution of them: jaxconv refuses them when tracing.
  dt = jnp.dtype(dtype)
  _raises_everywhere(TypeError, rf"lhs has dtype {dt.name}", cgd(), _x(dtype=dt), _x((3, 3, 4, 4), dt))


def test_bad_padding_string():
  # lax raises RuntimeError("Unrecognized padding type ..."); jaxconv's error is both that and a ValueError.
  want = _lax_error(lambda a, b: lax.conv_general_dilated(a, b, (1, 1), "FULL", dimension_numbers=NHWC),
                    _x(), _x((3, 3, 4, 4)))
  assert type(want) is RuntimeError
  _raises_everywhere(RuntimeError, r"Unrecognized padding type.*got FULL.*padding", cgd(padding="FULL"), _x(),
                     _x((3, 3, 4, 4)))
  _raises_everywhere(ValueError, r"padding", cgd(padding="FULL"), _x(), _x((3, 3, 4, 4)))


@pytest.mark.parametrize("padding", [[(1, 1)], [(1, 1)] * 3, [(1, 1, 1), (1, 1, 1)], [1, 1], [(1.5, 0), (0, 0)]])
def test_wrong_padding_pairs(padding):
  # lax: TypeError("Wrong number of explicit pads ...") for a wrong count, ValueError("padding argument to
  # conv_general_dilated should be ...") for malformed pairs; jaxconv raises the same types with lax's words.
  want = _lax_error(lambda a, b: lax.conv_general_dilated(a, b, (1, 1), padding, dimension_numbers=NHWC),
                    _x(), _x((3, 3, 4, 4)))
  words = str(want).split(":")[0][:40]
  _raises_everywhere(type(want), re.escape(words), cgd(padding=padding), _x(), _x((3, 3, 4, 4)))


@pytest.mark.parametrize("padding", [[(-7, 0), (0, 0)], [(0, 0), (0, -7)], [(-4, -4), (0, 0)]])
def test_negative_padding_larger_than_input(padding):
  # lax: ValueError("Negative padding is larger than the size of the corresponding dimension ...")
  with pytest.raises(ValueError):
    lax.conv_general_dilated(_x(), _x((3, 3, 4, 4)), (1, 1), padding, dimension_numbers=NHWC)
  _raises_everywhere(ValueError, r"(?i)padding", cgd(padding=padding), _x(), _x((3, 3, 4, 4)))


def test_string_padding_with_lhs_dilation_is_rejected_like_lax():
  with pytest.raises(ValueError):
    lax.conv_general_dilated(_x(), _x((3, 3, 4, 4)), (1, 1), "SAME", lhs_dilation=(2, 2), dimension_numbers=NHWC)
  with pytest.raises(ValueError, match=r"(?i)padding"):
    cgd(padding="SAME", lhs_dilation=(2, 2))(_x(), _x((3, 3, 4, 4)))


@pytest.mark.parametrize("bad", [(0, 1), (1, -1)])
def test_bad_window_strides(bad):
  _raises_everywhere(ValueError, r"window_strides", cgd(window_strides=bad), _x(), _x((3, 3, 4, 4)))


def test_window_strides_wrong_length():
  want = _lax_error(lambda a, b: lax.conv_general_dilated(a, b, (1, 1, 1), "VALID", dimension_numbers=NHWC),
                    _x(), _x((3, 3, 4, 4)))
  assert type(want) is ValueError
  _raises_everywhere(ValueError, re.escape(str(want)), cgd(window_strides=(1, 1, 1)), _x(), _x((3, 3, 4, 4)))


@pytest.mark.parametrize("name", ["lhs_dilation", "rhs_dilation"])
@pytest.mark.parametrize("bad", [(0, 1), (1, -2)])
def test_bad_dilations(name, bad):
  # lax: TypeError("All dilations must be positive, got ...")
  with pytest.raises(TypeError):
    lax.conv_general_dilated(_x(), _x((3, 3, 4, 4)), (1, 1), [(0, 0)] * 2, dimension_numbers=NHWC,
                             **{name: bad})
  _raises_everywhere(TypeError, name, cgd(padding=[(0, 0)] * 2, **{name: bad}), _x(), _x((3, 3, 4, 4)))


def test_bad_dimension_numbers():
  with pytest.raises((TypeError, ValueError), match=r"(?i)dimension|spec|NHWC|HWIO"):
    cgd(dimension_numbers=("NHWC", "HWIO"))(_x(), _x((3, 3, 4, 4)))
  with pytest.raises((TypeError, ValueError)):
    cgd(dimension_numbers=("NHWC", "HWXO", "NHWC"))(_x(), _x((3, 3, 4, 4)))


def test_bad_precision():
  with pytest.raises(ValueError, match=r"(?i)precision"):
    cgd(precision="fp8")(_x(), _x((3, 3, 4, 4)))


def test_bad_preferred_element_type():
  with pytest.raises(TypeError, match=r"preferred_element_type"):
    cgd(preferred_element_type=jnp.int32)(_x(), _x((3, 3, 4, 4)))
  with pytest.raises(TypeError, match=r"preferred_element_type"):  # narrowing, as lax refuses
    cgd(preferred_element_type=jnp.bfloat16)(_x(), _x((3, 3, 4, 4)))


# ---- conv1d / conv2d / conv3d ----------------------------------------------------------------------------

def test_unknown_activation():
  with pytest.raises(ValueError, match=r"activation"):
    jaxconv.conv2d(_x(), _x((3, 3, 4, 4)), activation="tanh")
  with pytest.raises(ValueError, match=r"activation"):
    jax.jit(lambda x, w: jaxconv.conv2d(x, w, activation="Relu"))(_x(), _x((3, 3, 4, 4)))


@pytest.mark.parametrize("fmt", ["NHWC", "channels-last", None, "CHANNELS_FIRST"])
def test_bad_data_format(fmt):
  with pytest.raises(ValueError, match=r"data_format"):
    jaxconv.conv2d(_x(), _x((3, 3, 4, 4)), data_format=fmt)


@pytest.mark.parametrize("bias_shape", [(3,), (1, 4), (4, 1), ()])
def test_bias_shape(bias_shape):
  with pytest.raises(ValueError, match=r"bias"):
    jaxconv.conv2d(_x(), _x((3, 3, 4, 4)), jnp.ones(bias_shape))
  with pytest.raises(ValueError, match=r"bias"):
    jax.jit(jaxconv.conv2d)(_x(), _x((3, 3, 4, 4)), jnp.ones(bias_shape))


def test_bias_dtype_integer():
  with pytest.raises(TypeError, match=r"bias"):
    jaxconv.conv2d(_x(), _x((3, 3, 4, 4)), jnp.ones((4,), jnp.int32))


@pytest.mark.parametrize("fn,x_shape,w_shape", [
    (jaxconv.conv1d, (2, 6, 6, 4), (3, 3, 4, 4)),
    (jaxconv.conv2d, (2, 6, 4), (3, 4, 4)),
    (jaxconv.conv3d, (2, 6, 6, 4), (3, 3, 4, 4)),
    (jaxconv.conv2d, (2, 6, 6, 4), (3, 4, 4)),
])
def test_convnd_rank(fn, x_shape, w_shape):
  with pytest.raises(ValueError, match=r"(?i)\b(x|w)\b.*rank|rank.*\b(x|w)\b"):
    fn(_x(x_shape), _x(w_shape))


@pytest.mark.parametrize("kw,name", [
    (dict(stride=0), "stride"), (dict(stride=(1, -1)), "stride"), (dict(stride=(1, 1, 1)), "stride"),
    (dict(dilation=0), "dilation"), (dict(dilation=(2, -1)), "dilation"),
    (dict(groups=3), "groups"), (dict(groups=0), "groups"),
    (dict(padding="HALF"), "padding"), (dict(padding=(1, 1, 1)), "padding"),
    (dict(padding=[(1, 1)]), "padding"), (dict(padding=-9), "padding"),
])
def test_convnd_bad_arguments(kw, name):
  with pytest.raises((TypeError, ValueError), match=name):
    jaxconv.conv2d(_x(), _x((3, 3, 4, 4)), **kw)


def test_convnd_channels_do_not_match():
  with pytest.raises(ValueError, match=r"(?i)feature|channel|groups"):
    jaxconv.conv2d(_x(), _x((3, 3, 3, 4)))
  with pytest.raises(ValueError, match=r"(?i)feature|channel|groups"):
    jaxconv.conv2d(_x((2, 4, 6, 6)), _x((4, 3, 3, 3)), data_format="channels_first")


def test_convnd_algorithm_unknown():
  with pytest.raises(ValueError, match=r"algorithm"):
    jaxconv.conv2d(_x(), _x((3, 3, 4, 4)), algorithm="winograd")


@pytest.mark.kernels
@pytest.mark.parametrize("algorithm, x_shape, w_shape, kw, missing", [
    ("long1d", (2, 6, 6, 4), (3, 3, 4, 4), {}, "one spatial dim"),             # 2-D problem
    ("long1d", (2, 40, 4), (9, 4, 4), dict(stride=2), "stride"),               # strided
    ("depthwise", (2, 6, 6, 4), (3, 3, 4, 4), {}, "groups == c == k"),         # dense
    ("small", (2, 6, 6, 32), (3, 3, 32, 4), {}, "c <= 16"),                    # too many input channels
    ("small", (2, 6, 6, 4), (3, 3, 1, 4), dict(groups=4), "no groups"),       # grouped
    ("implicit_gemm", (2, 6, 6, 8), (3, 3, 1, 8), dict(groups=8), "groups"),  # grouped
    ("implicit_gemm_sm80", (2, 6, 6, 8), (3, 3, 1, 8), dict(groups=8), "groups"),
])
def test_forced_algorithm_that_does_not_apply_fails_at_trace_time(algorithm, x_shape, w_shape, kw, missing):
  """A forced algorithm is checked against its variants' predicates (the registry's code) when the function is traced,
  on every platform of a CUDA build, naming the argument and the condition it misses."""
  conv = {3: jaxconv.conv1d, 4: jaxconv.conv2d}[len(x_shape)]
  fn = jax.jit(lambda x, w: conv(x, w, algorithm=algorithm, **kw))
  with pytest.raises(ValueError, match=rf"algorithm='{algorithm}' cannot run this convolution.*{missing}"):
    fn.trace(_x(x_shape), _x(w_shape))


@pytest.mark.parametrize("algorithm, x_shape, w_shape, kw", [
    ("long1d", (2, 300, 2), (65, 2, 3), {}),
    ("depthwise", (2, 6, 6, 4), (3, 3, 1, 4), dict(groups=4)),
    ("small", (2, 6, 6, 3), (3, 3, 3, 8), {}),
    ("direct", (2, 6, 6, 4), (3, 3, 4, 4), {}),
    ("implicit_gemm", (2, 6, 6, 8), (3, 3, 8, 16), {}),
    ("implicit_gemm_sm80", (2, 9, 12), (3, 12, 4), {}),
    ("implicit_gemm", (2, 9, 9, 3), (3, 3, 3, 8), {}),  # c is zero-padded to the alignment
    ("implicit_gemm", (2, 6, 6, 8), (3, 3, 8, 67), {}),  # k too (the padded-k variants)
    ("implicit_gemm_sm80", (2, 6, 6, 8), (3, 3, 8, 67), {}),
])
def test_forced_algorithm_that_applies_runs(algorithm, x_shape, w_shape, kw):
  """The trace-time check accepts problems the family supports (and the result is lax's)."""
  conv = {3: jaxconv.conv1d, 4: jaxconv.conv2d}[len(x_shape)]
  rng = np.random.default_rng(len(algorithm))
  x = jnp.asarray(rng.standard_normal(x_shape), jnp.float32)
  w = jnp.asarray(rng.standard_normal(w_shape), jnp.float32)
  got = conv(x, w, algorithm=algorithm, precision="highest", **kw)
  dn = ("NWC", "WIO", "NWC") if len(x_shape) == 3 else ("NHWC", "HWIO", "NHWC")
  want = lax.conv_general_dilated(x, w, (1,) * (len(x_shape) - 2), "VALID", dimension_numbers=dn,
                                  feature_group_count=kw.get("groups", 1), precision="highest")
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-4)


def test_errors_do_not_leave_state_behind():
  """After an error the same function still works (no cached broken trace)."""
  f = jax.jit(lambda x, w: jaxconv.conv2d(x, w, padding="SAME"))
  with pytest.raises(ValueError):
    f(_x(), _x((3, 3, 3, 4)))
  y = f(_x(), _x((3, 3, 4, 4)))
  assert y.shape == (2, 6, 6, 4) and np.all(np.isfinite(np.asarray(y)))


# ---- magnitudes the kernels cannot take (csrc/core/conv_params.h bounds), refused when tracing --------------

@pytest.mark.parametrize("kw,name", [
    (dict(padding=[(2 ** 62, 0), (0, 0)]), "padding"),
    (dict(padding=[(0, 0), (0, -(2 ** 31))]), "padding"),
    (dict(padding=[(2 ** 30 + 1, 0), (0, 0)]), "padding"),
    (dict(window_strides=(2 ** 31, 1)), "window_strides"),
    (dict(rhs_dilation=(1, 2 ** 30 + 1)), "rhs_dilation"),
    (dict(lhs_dilation=(2 ** 31, 1), padding=[(0, 0), (0, 0)]), "lhs_dilation"),
])
def test_magnitudes_above_the_kernels_bounds(kw, name):
  x, w = jax.ShapeDtypeStruct((2, 6, 6, 4), jnp.float32), jax.ShapeDtypeStruct((3, 3, 4, 4), jnp.float32)
  args = dict(window_strides=(1, 1), padding="VALID", dimension_numbers=NHWC)
  args.update(kw)
  if not (name == "padding" and kw["padding"][1][1] < 0):  # lax types these (XLA would fail later)
    jax.eval_shape(lambda a, b: lax.conv_general_dilated(a, b, **args), x, w)
  with pytest.raises(ValueError, match=rf"{name}.*2\^30|{name}.*larger than"):
    jax.jit(lambda a, b: jaxconv.conv_general_dilated(a, b, **args)).trace(x, w)


def test_spatial_extent_above_2_32():
  # An input of 2^33 positions (abstract: nothing is allocated) exceeds the kernels' extents.
  x, w = jax.ShapeDtypeStruct((1, 2 ** 33, 1), jnp.float32), jax.ShapeDtypeStruct((1, 1, 1), jnp.float32)
  args = dict(window_strides=(1,), padding="VALID", dimension_numbers=("NWC", "WIO", "NWC"))
  jax.eval_shape(lambda a, b: lax.conv_general_dilated(a, b, **args), x, w)
  with pytest.raises(ValueError, match=r"lhs \(input\) spatial sizes.*2\^32"):
    jax.jit(lambda a, b: jaxconv.conv_general_dilated(a, b, **args)).trace(x, w)
  # An output of more than 2^32 positions from lhs dilation of a small input.
  x = jax.ShapeDtypeStruct((1, 9, 1), jnp.float32)
  args.update(lhs_dilation=(2 ** 30,), padding=[(0, 0)])
  with pytest.raises(ValueError, match=r"output spatial sizes.*2\^32.*lhs_dilation|output spatial sizes.*dilations"):
    jax.jit(lambda a, b: jaxconv.conv_general_dilated(a, b, **args)).trace(x, w)

