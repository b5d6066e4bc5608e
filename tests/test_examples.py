"""examples/digits.py: the quick run, lax vs jaxconv loss curves, and per-example gradients on the CNN."""

from __future__ import annotations

import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import conv_utils as cu

pytest.importorskip("flax")
pytest.importorskip("optax")
pytest.importorskip("sklearn", reason="the digits example needs scikit-learn (pip install -e '.[test]')")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import digits  # noqa: E402


@pytest.fixture(scope="module")
def data():
  return digits.load_data()


def test_quick_mode_trains_both_models_and_plots(tmp_path, capsys):
  png = tmp_path / "digits.png"
  histories = digits.main(["--quick", "--plot", str(png), "--no-progress"])
  assert [h["model"] for h in histories] == ["cnn", "resnet"]
  for h in histories:
    assert len(h["losses"]) == 150 and np.all(np.isfinite(h["losses"]))
    assert h["losses"][-1] < 0.5 * h["losses"][0], h["model"]
    assert h["test_acc"] >= 0.9, (h["model"], h["test_acc"])
  # Folding the ResNet's BatchNorms into its convolutions changes no prediction (up to rounding ties).
  assert abs(histories[1]["folded_test_acc"] - histories[1]["test_acc"]) <= 1 / 359
  assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert "test accuracy" in capsys.readouterr().out


@pytest.mark.parametrize("model", ["cnn", "resnet"])
def test_same_loss_curve_as_lax(data, model):
  """Same seed, same batches, lax.conv_general_dilated vs jaxconv: the loss curves agree."""
  run = functools.partial(digits.train, model, steps=40, eval_every=40, seed=3, data=data, progress=False)
  # True float32 everywhere (on a GPU, XLA's DEFAULT precision would run lax's convs and the dense layers
  # in TF32, and the curves would part for that reason alone).
  with jax.default_matmul_precision("highest"):
    ref, got = run(backend="lax"), run(backend="jaxconv")
  # Drop-in modules: the two models have the same parameter tree.
  assert jax.tree.structure(ref["variables"]) == jax.tree.structure(got["variables"])
  np.testing.assert_allclose(got["losses"], ref["losses"], rtol=2e-3, atol=1e-5)
  assert got["losses"][-1] < 0.8 * got["losses"][0]  # and it is learning


@jax.default_matmul_precision("highest")  # no TF32 in the dense layer on a GPU: compare true float32
def test_per_example_gradients_cnn(data):
  x_train, y_train, _, _ = data
  x, y = jnp.asarray(x_train[:12]), jnp.asarray(y_train[:12])
  model = digits.CNN("jaxconv")
  params = model.init(jax.random.key(0), x[:1])["params"]
  params = jax.tree.map(lambda a: a + 0.05, params)  # non-zero bias: every ReLU pattern is exercised

  def loss(p, xi, yi):  # one example
    logits = model.apply({"params": p}, xi[None])
    return -jax.nn.log_softmax(logits)[0, yi]

  per_example = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))
  got = jax.jit(per_example)(params, x, y)
  single = jax.jit(jax.grad(loss))
  for i in range(len(x)):
    jax.tree.map(lambda a, b: cu.assert_close(a[i], b, 1e-5, f"example {i}"), got, single(params, x[i], y[i]))

  # And equal to the lax model's per-example gradients.
  ref_model = digits.CNN("lax")
  ref = jax.jit(jax.vmap(jax.grad(lambda p, xi, yi: -jax.nn.log_softmax(
      ref_model.apply({"params": p}, xi[None]))[0, yi]), in_axes=(None, 0, 0)))(params, x, y)
  jax.tree.map(lambda a, b: cu.assert_close(a, b, 1e-5, "vs lax"), got, ref)

  # One custom call per convolution op: the forward conv and one grouped filter gradient for the whole
  # batch (vmap folds the examples into feature groups), no loop, no data gradient (x is not differentiated).
  jaxpr = jax.make_jaxpr(per_example)(params, x, y).jaxpr
  convs = [e for e in cu.all_eqns(jaxpr) if e.primitive.name.startswith("jaxconv_")]
  assert sorted(e.primitive.name for e in convs) == ["jaxconv_fwd", "jaxconv_wgrad"], convs
  wgrad = next(e for e in convs if e.primitive.name == "jaxconv_wgrad")
  assert wgrad.params["spec"].feature_groups == len(x)
  assert not any(e.primitive.name in ("while", "scan") for e in cu.all_eqns(jaxpr))
  # Lowered, each is one jaxconv custom call, or XLA's own convolution where the registry picks it for the GPU.
  hlo = jax.jit(per_example).lower(params, x, y).as_text()
  calls = hlo.count("custom_call @jaxconv_fwd") + hlo.count("custom_call @jaxconv_wgrad")
  assert calls <= 2 and "custom_call @jaxconv_dgrad" not in hlo, hlo
  assert calls + hlo.count("stablehlo.convolution") == 2, hlo
