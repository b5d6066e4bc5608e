"""jax.export of functions that use jaxconv (CPU round trip).

jaxconv's convolutions lower to custom calls (jaxconv_fwd / jaxconv_dgrad / jaxconv_wgrad) that are not
in JAX's list of custom calls with compatibility guarantees, so exporting needs the explicit opt-out
`jax.export.DisabledSafetyCheck.custom_call(name)` for each target that appears; the process that calls
the deserialized artefact must have imported jaxconv (which registers the targets).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export, lax

import conv_utils as cu
import jaxconv

TARGETS = ("jaxconv_fwd", "jaxconv_dgrad", "jaxconv_wgrad")
CHECKS = [export.DisabledSafetyCheck.custom_call(t) for t in TARGETS]
HI = lax.Precision.HIGHEST


def _f(x, w, b):
  return jaxconv.conv2d(x, w, b, stride=(1, 2), padding="SAME", activation="gelu", precision=HI)


def _loss(x, w, b):
  return jnp.sum(_f(x, w, b) ** 2)


def _args(rng):
  return (jnp.asarray(cu.randn(rng, (2, 9, 10, 3), np.float32)),
          jnp.asarray(cu.randn(rng, (3, 3, 3, 4), np.float32)),
          jnp.asarray(cu.randn(rng, (4,), np.float32)))


def _round_trip(exp):
  """serialize -> bytes -> deserialize, when jax's serializer (flatbuffers) is installed."""
  pytest.importorskip("flatbuffers", reason="jax.export serialization needs the flatbuffers package")
  blob = exp.serialize(vjp_order=0) if not exp.has_vjp() else exp.serialize(vjp_order=1)
  return export.deserialize(bytearray(blob))


def test_export_needs_the_custom_call_opt_out(rng):
  with pytest.raises(ValueError, match="jaxconv_fwd"):
    export.export(jax.jit(_f))(*_args(rng))


def test_export_forward_in_memory(rng):
  args = _args(rng)
  exp = export.export(jax.jit(_f), disabled_checks=CHECKS)(*args)
  assert exp.platforms == (export.default_export_platform(),)
  assert "stablehlo.custom_call @jaxconv_fwd" in exp.mlir_module()
  cu.assert_close(exp.call(*args), _f(*args), 0.0, "exported forward")


def test_export_forward_serialized_round_trip(rng):
  args = _args(rng)
  exp = _round_trip(export.export(jax.jit(_f), disabled_checks=CHECKS)(*args))
  cu.assert_close(jax.jit(exp.call)(*args), _f(*args), 0.0, "deserialized forward")
  assert exp.in_avals == tuple(jax.core.ShapedArray(a.shape, a.dtype) for a in args)


def test_export_gradient_function_round_trip(rng):
  """An exported gradient holds all three custom calls (fwd, dgrad, wgrad)."""
  args = _args(rng)
  grad = jax.jit(jax.grad(_loss, argnums=(0, 1, 2)))
  exp = export.export(grad, disabled_checks=CHECKS)(*args)
  text = exp.mlir_module()
  for t in TARGETS:
    assert f"@{t}" in text, t
  exp = _round_trip(exp)
  for a, b in zip(exp.call(*args), grad(*args)):
    cu.assert_close(a, b, 0.0, "deserialized gradient")


def test_export_with_vjp_differentiates_after_deserializing(rng):
  args = _args(rng)
  exp = _round_trip(export.export(jax.jit(_f), disabled_checks=CHECKS)(*args))
  assert exp.has_vjp()
  g = jax.grad(lambda *a: jnp.sum(exp.call(*a) ** 2), argnums=(0, 1, 2))(*args)
  for a, b in zip(g, jax.grad(_loss, argnums=(0, 1, 2))(*args)):
    cu.assert_close(a, b, 1e-6, "vjp of the deserialized function")


def test_export_flax_model(rng):
  flax = pytest.importorskip("flax")  # noqa: F841
  import jaxconv.flax as jf
  from flax import linen as nn

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = jf.ConvBiasAct(8, (3, 3), strides=2, activation="relu")(x)
      x = jf.Conv(8, (3, 3), feature_group_count=8)(x)
      return nn.Dense(3)(x.reshape(x.shape[0], -1))

  x = jnp.asarray(cu.randn(rng, (2, 12, 12, 3), np.float32))
  params = Net().init(jax.random.key(0), x)
  exp = _round_trip(export.export(jax.jit(Net().apply), disabled_checks=CHECKS)(params, x))
  cu.assert_close(exp.call(params, x), Net().apply(params, x), 0.0, "exported flax model")


def test_symbolic_batch_is_not_supported(rng):
  """jaxconv specialises every shape at trace time: shape-polymorphic export fails while tracing."""
  _, w, b = _args(rng)
  (n,) = export.symbolic_shape("n")
  with pytest.raises(Exception, match="[Ss]ymbolic|constant"):
    export.export(jax.jit(_f), disabled_checks=CHECKS)(jax.ShapeDtypeStruct((n, 9, 10, 3), jnp.float32), w, b)


@pytest.mark.skipif(not jaxconv.build_info()["cuda"], reason="jaxconv was built without CUDA")
def test_cuda_lowering_gives_the_filter_gradient_a_workspace_result():
  """The CUDA wgrad custom call returns (dw, u8 workspace); its size is the extension's split-K plan.

  Lowered for CUDA on any machine (no GPU needed): a 1024x1024 single-channel filter gradient is one long
  reduction, so the plan splits it and the workspace must be non-empty; the CPU lowering has no workspace.
  """
  x = jax.ShapeDtypeStruct((1, 1024, 1024, 1), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((3, 3, 1, 1), jnp.bfloat16)

  def loss(x, w):
    return jnp.sum(jaxconv.conv2d(x, w, padding="SAME", dilation=2).astype(jnp.float32))

  exp = export.export(jax.jit(jax.grad(loss, argnums=1)), platforms=["cuda", "cpu"], disabled_checks=CHECKS)(x, w)
  calls = [ln for ln in exp.mlir_module().splitlines() if "stablehlo.custom_call @jaxconv_wgrad" in ln]
  results = sorted(ln.rsplit("->", 1)[1].strip() for ln in calls)
  assert len(results) == 2, calls  # one per platform
  cuda_result = [r for r in results if "ui8" in r]
  assert len(cuda_result) == 1 and "tensor<3x3x1x1xbf16>" in cuda_result[0], results
  nbytes = int(cuda_result[0].split("tensor<")[2].split("xui8")[0])
  assert nbytes > 0 and nbytes % (9 * 4) == 0, nbytes  # splits x 9 filter taps x f32 partial sums


def _workspace_result_bytes(mlir_text: str, target: str) -> int:
  """Bytes of the u8 workspace result of the one custom call to `target` in a lowered module."""
  lines = [ln for ln in mlir_text.splitlines() if f"stablehlo.custom_call @{target}" in ln]
  assert len(lines) == 1, (target, lines)
  result = lines[0].rsplit("->", 1)[1]
  assert "xui8>" in result, (target, result)
  return int(result.split("xui8>")[0].rsplit("tensor<", 1)[1])


def _cuda_grad_module(x, w, **conv_kw):
  """The MLIR text of value_and_grad of sum(conv2d(x, w, algorithm="implicit_gemm", **conv_kw)), exported for CUDA
  (lowered without a GPU)."""
  def loss(x, w):
    y = jaxconv.conv2d(x, w, algorithm="implicit_gemm", **conv_kw)
    return jnp.sum(y.astype(jnp.float32))

  return export.export(jax.jit(jax.value_and_grad(loss, argnums=(0, 1))), platforms=["cuda"],
                       disabled_checks=CHECKS)(x, w).mlir_module()


@pytest.mark.skipif(not jaxconv.build_info()["cuda"], reason="jaxconv was built without CUDA")
def test_cuda_lowering_gives_the_tensor_core_path_its_staging_workspace():
  """On the tensor-core path every op has a workspace result: fwd and dgrad stage the filter as KTRSC (at
  least its bytes), wgrad an f32 KTRSC gradient; the bytes come from the extension, lowered here without a GPU."""
  x = jax.ShapeDtypeStruct((2, 14, 14, 64), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((3, 3, 64, 32), jnp.bfloat16)
  text = _cuda_grad_module(x, w, padding="SAME")
  for target, least in (("jaxconv_fwd", 9 * 64 * 32 * 2), ("jaxconv_dgrad", 9 * 64 * 32 * 2),
                        ("jaxconv_wgrad", 9 * 64 * 32 * 4)):
    nbytes = _workspace_result_bytes(text, target)
    assert nbytes >= least, (target, nbytes, least)


@pytest.mark.skipif(not jaxconv.build_info()["cuda"], reason="jaxconv was built without CUDA")
def test_cuda_lowering_gives_small_grids_their_split_workspace():
  """ResNet-50's res5 3x3 at batch 32 has 52 output tiles of 128x128 for 132 SMs: in float32 at DEFAULT (TF32) the
  Hopper forward splits the reduction in two, so its workspace holds the staged filter and two f32 slices of the
  output; so does the data gradient's, which runs as the forward of dy with the flipped filter."""
  x = jax.ShapeDtypeStruct((32, 7, 7, 512), jnp.float32)
  w = jax.ShapeDtypeStruct((3, 3, 512, 512), jnp.float32)
  text = _cuda_grad_module(x, w, padding="SAME")
  filt, slices = 9 * 512 * 512 * 4, 2 * 32 * 7 * 7 * 512 * 4
  for target in ("jaxconv_fwd", "jaxconv_dgrad"):
    nbytes = _workspace_result_bytes(text, target)
    assert nbytes >= filt + slices, (target, nbytes, filt + slices)


@pytest.mark.skipif(not jaxconv.build_info()["cuda"], reason="jaxconv was built without CUDA")
@pytest.mark.parametrize("shape, stride, swapped", [
    ((32, 56, 56, 64), 1, True),    # ResNet-50 res2 3x3 at batch 32
    ((32, 56, 56, 128), 2, True),   # res3's strided 3x3
    ((30, 56, 56, 64), 1, False),   # batch % 4 != 0: the batch is the swapped forward's channel dim
    ((4, 200, 200, 64), 1, False),  # a 200x200 window is beyond the rank-2 TMA im2col box
])
def test_cuda_lowering_gives_the_swapped_tf32_wgrad_its_transposes(shape, stride, swapped):
  """The TF32 filter gradient runs on the Hopper as a large-window forward with batch and channels swapped, when
  the extension's host checks (CUTLASS's can_implement included) take it: its workspace then holds x and dy
  transposed. Lowered without a GPU."""
  x = jax.ShapeDtypeStruct(shape, jnp.float32)
  w = jax.ShapeDtypeStruct((3, 3, shape[-1], shape[-1]), jnp.float32)
  text = _cuda_grad_module(x, w, stride=stride, padding=((1, 1), (1, 1)))
  n, h, wd, c = shape
  out = -(-h // stride) * -(-wd // stride)
  transposes = 4 * (n * h * wd * c + n * out * c)
  nbytes = _workspace_result_bytes(text, "jaxconv_wgrad")
  assert (nbytes >= transposes) == swapped, (nbytes, transposes)


@pytest.mark.skipif(not jaxconv.build_info()["cuda"], reason="jaxconv was built without CUDA")
def test_cuda_lowering_bounds_the_first_layer_workspace():
  """A first layer (3 channels, 7x7/2, as ResNet's stem) on the tensor-core path: the forward stages each tile's
  patch in shared memory (no workspace), the data gradient unrolls the window in chunks of images (at least one
  image's unrolled window, 112*112 pixels x 147 columns), and no op's workspace comes near the whole batch's unrolled
  window (128 times that, ~480 MB)."""
  x = jax.ShapeDtypeStruct((128, 224, 224, 3), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((7, 7, 3, 64), jnp.bfloat16)
  text = _cuda_grad_module(x, w, stride=2, padding=((3, 3), (3, 3)))
  one_image = 112 * 112 * 147 * 2
  sizes = {t: _workspace_result_bytes(text, t) for t in ("jaxconv_fwd", "jaxconv_dgrad", "jaxconv_wgrad")}
  assert sizes["jaxconv_fwd"] == 0 and sizes["jaxconv_dgrad"] >= one_image, sizes
  assert all(n < 128 * one_image // 4 for n in sizes.values()), sizes
