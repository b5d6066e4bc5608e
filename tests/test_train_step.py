"""benchmarks/train_step.py and models.py: the training-step benchmark, on the CPU.

ResNet-18 runs the whole script (both backends, checks, timing, outputs) in-process; ResNet-50, MobileNetV2,
ConvNeXt-T, the 3-D UNet and MSD are checked as lowered StableHLO only (ResNet-50's CPU compile alone takes ~20 s
on two cores), which still covers each model definition, parameter tree and count, and that every one of its
convolutions goes to jaxconv.
"""

from __future__ import annotations

import json
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("flax")
pytest.importorskip("optax")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import models  # noqa: E402
import train_step  # noqa: E402

# torchvision's counts for the same models (conv kernels and biases, BN and LayerNorm scales and offsets, layer
# scales, dense layers with biases).
NUM_PARAMS = {"resnet18": 11_689_512, "resnet50": 25_557_032, "mobilenetv2": 3_504_872, "convnext_t": 28_589_128,
              # MSD: layer i has 9 (1 + i) weights and a bias, the output layer 51 + 1.
              "msd": sum(9 * (1 + i) + 1 for i in range(50)) + 52,
              # 3-D UNet: 27 c_in c_out weights per 3x3x3 conv, BatchNorm scale and offset per output channel.
              "unet3d": sum(27 * ci * co + 2 * co for ci, co in [(1, 16), (16, 16), (16, 32), (32, 32), (32, 64),
                                                                  (64, 64), (96, 32), (32, 32), (48, 16), (16, 16)])
              + 16 * 2 + 2}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("resnet")
  result = train_step.main(["--quick", "--models", "resnet18", "--out", str(out), "--commit", "abc1234",
                             "--profile-steps", "1"])
  return result, out


def test_quick_run_both_backends(quick_run):
  result, _ = quick_run
  assert result["ok"]
  (r,) = result["results"]
  assert r["model"] == "resnet18" and list(r["backends"]) == ["jaxconv", "lax"]
  assert r["same_param_tree"] and r["num_params"] == NUM_PARAMS["resnet18"]
  for b, v in r["backends"].items():
    assert v["steps"] == 3 and v["repeats"] == 2 and len(v["step_times_s"]) == 2, b
    assert all(t > 0 for t in v["step_times_s"]), b
    assert v["min_ms"] <= v["median_ms"] <= v["max_ms"], b
    assert v["images_per_s"] == pytest.approx(2 / (v["median_ms"] / 1e3)), b
  jc, lx = r["backends"]["jaxconv"], r["backends"]["lax"]
  assert r["ratio_lax_over_jaxconv"] == pytest.approx(lx["median_ms"] / jc["median_ms"])
  assert r["ratio_paired_min"] <= r["ratio_paired_max"]


def test_quick_run_profile_attributes_every_jaxconv_call(quick_run):
  if jax.default_backend() != "cpu" and not re.search(r"--xla_gpu_enable_command_buffer=(\s|$)",
                                                      os.environ.get("XLA_FLAGS", "")):
    # Inside XLA's CUDA graphs the trace gives the custom calls no kernel time.
    pytest.skip("per-kernel times on a GPU need XLA_FLAGS=--xla_gpu_enable_command_buffer= (command buffers off)")
  (r,) = quick_run[0]["results"]
  prof = r["profile"]
  jc_rows = [row for row in prof["rows"] if "jaxconv" in row["calls"]]
  # Every jaxconv custom call of the step is in a row of its op, with the time its thunk took.
  assert sum(row["calls"]["jaxconv"] for row in jc_rows) == 3 * train_step.num_convs("resnet18") - 1
  assert {row["op"] for row in jc_rows} == {"fwd", "dgrad", "wgrad"}
  assert all(row["us"]["jaxconv"] > 0 for row in jc_rows)
  # The stem: one forward and one filter gradient of a 7x7 conv on the 3-channel images, no data gradient.
  stem = [row for row in jc_rows if row["shapes"] == ("2x64x64x3", "7x7x3x64")]
  assert sorted(row["op"] for row in stem) == ["fwd", "wgrad"]
  t = prof["totals"]["jaxconv"]
  assert 0 < t["conv"] <= t["all"] and t["other"] == pytest.approx(t["all"] - t["conv"])
  assert "device time per step by convolution" in (quick_run[1] / "results.md").read_text()


def test_quick_run_losses_agree_and_decrease(quick_run):
  (r,) = quick_run[0]["results"]
  jc = np.asarray(r["backends"]["jaxconv"]["check_losses"])
  lx = np.asarray(r["backends"]["lax"]["check_losses"])
  assert len(jc) == len(lx) == 3 and np.all(np.isfinite(jc)) and np.all(np.isfinite(lx))
  # Same start, same batch: bf16 rounding apart, the same losses. Tighter than the quick run's own
  # tolerances (set for ResNet-50 at batch 2); measured here: first loss 7e-6, all steps 2e-2 of the first.
  assert r["loss_check"]
  assert r["loss_first_rel_diff"] == pytest.approx(abs(jc[0] - lx[0]) / lx[0]) and r["loss_first_rel_diff"] < 1e-2
  assert r["loss_max_rel_diff"] == pytest.approx(np.max(np.abs(jc - lx)) / lx[0]) and r["loss_max_rel_diff"] < 5e-2
  # Training on one fixed batch: the loss falls at every step, on both backends.
  for losses in (jc, lx):
    assert np.all(np.diff(losses) < 0), losses
  for b in ("jaxconv", "lax"):
    assert r["backends"][b]["final_loss"] < r["backends"][b]["check_losses"][-1], b


def test_quick_run_hlo_convolutions(quick_run):
  (r,) = quick_run[0]["results"]
  n = train_step.num_convs("resnet18")
  assert n == 20
  # jaxconv: a forward, a filter gradient and (except for the stem) a data gradient call per conv, and
  # nothing else convolving. lax: XLA's own convolution ops on the CPU, cuDNN calls on a GPU.
  assert r["backends"]["jaxconv"]["hlo"] == {"jaxconv_custom_calls": 3 * n - 1, "cudnn_convs": 0,
                                             "hlo_convolutions": 0}
  assert r["hlo_count_check"] is True
  lax_hlo = r["backends"]["lax"]["hlo"]
  assert lax_hlo["jaxconv_custom_calls"] == 0
  assert lax_hlo["cudnn_convs"] + lax_hlo["hlo_convolutions"] == 3 * n - 1, lax_hlo
  assert 0 in (lax_hlo["cudnn_convs"], lax_hlo["hlo_convolutions"]), lax_hlo


def test_quick_run_outputs(quick_run):
  result, out = quick_run
  data = json.loads((out / "results.json").read_text())
  meta = data["meta"]
  for key in ("date", "gpu", "jax", "jaxlib", "jaxconv_build_info", "git_commit", "config"):
    assert key in meta, key
  assert meta["git_commit"] == "abc1234" and meta["gpu"] == jax.devices()[0].device_kind
  assert meta["config"]["batch"] == 2 and meta["config"]["image"] is None  # the model's own quick size
  assert data["results"][0]["input"] == [2, 64, 64, 3] and data["results"][0]["batch"] == 2
  assert meta["config"]["dtype"] == "bfloat16"
  assert data["results"] == json.loads(json.dumps(result["results"]))
  md = (out / "results.md").read_text()
  assert "| model | backend | input | ms/step (median) |" in md and "abc1234" in md
  assert "| resnet18 | jaxconv | 2x64x64x3 |" in md and "| resnet18 | lax | 2x64x64x3 |" in md
  assert f"**{data['results'][0]['ratio_lax_over_jaxconv']:.3f}**" in md


@pytest.mark.parametrize("name, convs", [("resnet50", 53), ("mobilenetv2", 52), ("convnext_t", 22), ("unet3d", 11),
                                         ("msd", 51)])
def test_tree_and_lowered_step(name, convs):
  """ResNet-50 (v1.5), MobileNetV2, ConvNeXt-T, the 3-D UNet and MSD without compiling: parameter trees,
  parameter count, and the convolutions of the lowered training step of each backend."""
  spec = models.MODELS[name]
  x, y = jax.eval_shape(lambda: train_step.make_batch(spec, 2, spec.quick_image, jnp.bfloat16, jax.random.key(0),
                                                      jax.random.key(1)))
  tx = train_step.make_optimizer(0.01, 1e-4)
  n = train_step.num_convs(name)
  assert n == convs
  trees, n_params, texts = {}, {}, {}
  for b in train_step.BACKENDS:
    model = train_step.make_model(name, b)
    variables = jax.eval_shape(lambda k, m=model: m.init(k, jnp.zeros((1, *x.shape[1:]), jnp.bfloat16),
                                                          train=False), jax.random.key(0))
    trees[b] = (jax.tree.structure(variables), [(a.shape, a.dtype) for a in jax.tree.leaves(variables)])
    params = variables["params"]
    n_params[b] = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(params))
    state = (params, variables.get("batch_stats", {}), jax.eval_shape(tx.init, params))
    texts[b] = jax.jit(train_step.make_train_step(model, tx, spec.task)).lower(state, x, y).as_text()
    # The model's convolutions are its kernels of rank nd + 2 (ConvNeXt's 1x1 layers are dense).
    assert sum(a.ndim == spec.nd + 2 for a in jax.tree.leaves(params)) == n
  assert trees["jaxconv"] == trees["lax"]
  assert n_params == {"jaxconv": NUM_PARAMS[name], "lax": NUM_PARAMS[name]}
  assert ("batch_stats" in variables) == (name not in ("convnext_t", "msd"))
  jc, lx = texts["jaxconv"], texts["lax"]
  # A forward, a filter gradient and a data gradient per conv, less the stem's data gradient (the images are
  # not differentiated). On a GPU, `auto` leaves some problems to XLA at trace time (they lower to
  # stablehlo.convolution); on the CPU jaxconv takes every one.
  calls = {op: jc.count(f"custom_call @jaxconv_{op}") for op in ("fwd", "dgrad", "wgrad")}
  assert sum(calls.values()) > 0 and calls["fwd"] <= n and calls["wgrad"] <= n and calls["dgrad"] <= n - 1
  assert sum(calls.values()) + jc.count("stablehlo.convolution") == 3 * n - 1
  if jax.default_backend() == "cpu":
    assert calls == {"fwd": n, "dgrad": n - 1, "wgrad": n}
  assert lx.count("stablehlo.convolution") == 3 * n - 1 and "jaxconv_" not in lx


def test_initial_values_follow_flax_defaults():
  model = train_step.make_model("convnext_t", "lax", jnp.float32)
  v = train_step.init_variables(model, (1, 64, 64, 3), seed=0)
  block = v["params"]["ConvNeXtBlock_0"]
  np.testing.assert_array_equal(np.asarray(block["layer_scale"]), np.full(96, models.LAYER_SCALE_INIT, np.float32))
  np.testing.assert_array_equal(np.asarray(block["LayerNorm_0"]["scale"]), np.ones(96, np.float32))
  np.testing.assert_array_equal(np.asarray(block["Dense_0"]["bias"]), np.zeros(384, np.float32))
  k = np.asarray(block["Dense_0"]["kernel"])  # lecun_normal: std 1 / sqrt(fan_in), truncated at 2 sigma
  assert k.shape == (96, 384) and np.max(np.abs(k)) * np.sqrt(96) <= 2 / 0.8796 + 1e-6
  assert 0.9 < np.std(k) * np.sqrt(96) < 1.1


def test_check_jaxconv_hlo():
  n = 3 * train_step.num_convs("resnet18") - 1
  assert train_step.check_jaxconv_hlo("resnet18", {"jaxconv_custom_calls": n, "cudnn_convs": 0,
                                                   "hlo_convolutions": 0}) is True
  # Convolutions that jaxconv's auto leaves to XLA count towards the total.
  assert train_step.check_jaxconv_hlo("resnet18", {"jaxconv_custom_calls": n - 3, "cudnn_convs": 3,
                                                   "hlo_convolutions": 0}) is True
  for wrong in ({"jaxconv_custom_calls": n + 1, "cudnn_convs": 0, "hlo_convolutions": 0},
                {"jaxconv_custom_calls": n, "cudnn_convs": 1, "hlo_convolutions": 0},
                {"jaxconv_custom_calls": n, "cudnn_convs": 0, "hlo_convolutions": 2}):
    assert train_step.check_jaxconv_hlo("resnet18", wrong) is False
  with pytest.raises(AssertionError, match="runs none of its convolutions on jaxconv"):
    train_step.check_jaxconv_hlo("resnet18", {"jaxconv_custom_calls": 0, "cudnn_convs": n, "hlo_convolutions": 0})


def test_hlo_counts_on_gpu_style_text():
  """The cuDNN pattern, which the CPU run cannot exercise, on the text form XLA:GPU prints."""
  hlo = """
  %cudnn-conv.1 = (bf16[128,56,56,64]{3,2,1,0}, u8[0]{0}) custom-call(%p0, %p1),
      window={size=3x3 pad=1_1x1_1}, custom_call_target="__cudnn$convForward"
  %cudnn-conv-bw-filter = (bf16[3,3,64,64]{3,2,1,0}, u8[0]{0}) custom-call(%a, %b),
      custom_call_target="__cudnn$convBackwardFilter"
  %cudnn-conv-bias-activation = (bf16[128,56,56,64]{3,2,1,0}, u8[0]{0}) custom-call(%a, %b, %c),
      custom_call_target="__cudnn$convBiasActivationForward"
  %jaxconv_fwd_local = bf16[2,8,8,4]{3,2,1,0} custom-call(%x, %w), custom_call_target="jaxconv_fwd"
  %convolution.3 = f32[2,8,8,4]{3,2,1,0} convolution(f32[2,8,8,3]{3,2,1,0} %x, f32[3,3,3,4]{3,2,1,0} %w)
  %cublas-gemm.1 = bf16[128,1000]{1,0} custom-call(%a, %b), custom_call_target="__cublas$gemm"
  """
  assert train_step.hlo_counts(hlo) == {"jaxconv_custom_calls": 1, "cudnn_convs": 3, "hlo_convolutions": 1}


def test_arguments():
  args = train_step.parse_args(["--quick"])
  assert (args.batch, args.image, args.models, args.backends) == (2, None, list(models.MODELS), ["jaxconv", "lax"])
  assert (args.loss_rtol, args.loss_rtol_steps) == (0.1, 0.15)
  # Sizes and learning rate per model: the quick batch, each model's quick input side, 0.1 * batch / 256.
  assert train_step.sizes_for(models.MODELS["resnet18"], args) == (2, 64, pytest.approx(0.1 * 2 / 256))
  assert train_step.sizes_for(models.MODELS["unet3d"], args)[:2] == (2, 16)
  args = train_step.parse_args(["--models", "resnet50", "--batch", "128", "--dtype", "bfloat16", "--steps", "7"])
  assert (args.batch, args.image, args.steps, args.budget, args.models) == (128, None, 7, 60.0, ["resnet50"])
  assert train_step.sizes_for(models.MODELS["resnet50"], args) == (128, 224, pytest.approx(0.05))
  assert (args.loss_rtol, args.loss_rtol_steps) == (2e-2, 5e-2)
  args = train_step.parse_args(["--models", "mobilenetv2,msd", "--lr", "0.01"])
  assert train_step.sizes_for(models.MODELS["mobilenetv2"], args) == (64, 224, 0.01)
  assert train_step.sizes_for(models.MODELS["msd"], args) == (4, 512, 0.01)
  for bad in (["--models", "resnet34"], ["--backends", "cudnn"], ["--backends", "lax,lax"], ["--steps", "0"],
              ["--batch", "0"]):
    with pytest.raises(SystemExit):
      train_step.parse_args(bad)


def test_batches_of_each_task():
  keys = jax.random.key(0), jax.random.key(1)
  x, y = train_step.make_batch(models.MODELS["resnet18"], 3, 8, jnp.bfloat16, *keys)
  assert x.shape == (3, 8, 8, 3) and x.dtype == jnp.bfloat16 and y.shape == (3,) and y.dtype == jnp.int32
  assert 0 <= int(y.min()) and int(y.max()) < 1000 and float(jnp.std(x.astype(jnp.float32))) > 0.5
  x, y = train_step.make_batch(models.MODELS["unet3d"], 2, 4, jnp.float32, *keys)
  assert x.shape == (2, 4, 4, 4, 1) and y.shape == (2, 4, 4, 4) and set(np.unique(y)) <= {0, 1}
  x, y = train_step.make_batch(models.MODELS["msd"], 2, 6, jnp.float32, *keys)
  assert x.shape == y.shape == (2, 6, 6, 1) and y.dtype == jnp.float32


def test_conv_breakdown_matches_lax_data_gradients_run_as_forward_convolutions():
  """On the GPU, XLA runs the data gradient of a 1x1 convolution as a cuDNN forward convolution: the per-layer
  table matches it to jaxconv's dgrad, not to the layer's forward (same element counts, other first operand)."""
  hlo = "\n".join([
      "  %x = bf16[8,14,14,64]{3,2,1,0} parameter(0)",
      "  %w = bf16[1,1,64,256]{3,2,1,0} parameter(1)",
      "  %dy = bf16[8,14,14,256]{3,2,1,0} parameter(2)",
      "  %wt = bf16[64,1,1,256]{3,2,1,0} transpose(%w)",
      '  %cudnn-conv.1 = (bf16[8,14,14,256]{3,2,1,0}, u8[0]{0}) custom-call(%x, %w), window={size=1x1}, '
      'custom_call_target="__cudnn$convForward"',
      '  %cudnn-conv.2 = (bf16[8,14,14,64]{3,2,1,0}, u8[0]{0}) custom-call(%dy, %wt), window={size=1x1}, '
      'custom_call_target="__cudnn$convForward"',
      '  %cudnn-conv.3 = (bf16[1,1,64,256]{3,2,1,0}, u8[0]{0}) custom-call(%x, %dy), window={size=1x1}, '
      'custom_call_target="__cudnn$convBackwardFilter"'])
  lax_convs = train_step.conv_instructions(hlo)
  assert {k: v[0] for k, v in lax_convs.items()} == {"cudnn-conv.1": "fwd", "cudnn-conv.2": "fwd",
                                                      "cudnn-conv.3": "wgrad"}
  x, w, y = (8, 14, 14, 64), (1, 1, 64, 256), (8, 14, 14, 256)
  jc_convs = {"f": ("fwd", (x, w, y)), "d": ("dgrad", (y, w, x)), "g": ("wgrad", (x, y, w))}
  prof = train_step.conv_breakdown({
      "jaxconv": (jc_convs, {"f": 10.0, "d": 20.0, "g": 30.0, "other": 5.0}),
      "lax": (lax_convs, {"cudnn-conv.1": 11.0, "cudnn-conv.2": 22.0, "cudnn-conv.3": 33.0})})
  by_op = {r["op"]: r for r in prof["rows"]}
  assert set(by_op) == {"fwd", "dgrad", "wgrad"} and len(prof["rows"]) == 3
  assert by_op["fwd"]["us"] == {"jaxconv": 10.0, "lax": 11.0}
  assert by_op["dgrad"]["us"] == {"jaxconv": 20.0, "lax": 22.0}
  assert by_op["wgrad"]["us"] == {"jaxconv": 30.0, "lax": 33.0}
  assert by_op["dgrad"]["shapes"] == ("8x14x14x64", "1x1x64x256")
  assert prof["totals"]["jaxconv"]["conv"] == 60.0 and prof["totals"]["jaxconv"]["other"] == 5.0
  assert prof["totals"]["lax"]["conv"] == 66.0
