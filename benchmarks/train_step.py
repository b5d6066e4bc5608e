"""End-to-end speed: a jitted training step of a whole model on jaxconv's convolutions against lax's.

    python benchmarks/train_step.py --models resnet18,resnet50 --batch 128 --out OUT/steps
    python benchmarks/train_step.py --models msd --dtype float32 --out OUT/msd
    python benchmarks/train_step.py --quick --out /tmp/steps   # all models, tiny (batch 2), for a CPU

One training step = forward + backward + optimizer (the task's loss on random labels or targets, SGD with
momentum 0.9 and weight decay), jitted with the training state donated, on synthetic inputs already on the
device. The models (models.py, in flax.linen, channels-last) are ResNet-18, ResNet-50 (v1.5), MobileNetV2 and
ConvNeXt-T with torchvision's layers and parameter counts (classification), a 3-D UNet (segmentation) and the
depth-50 Mixed-Scale Dense network (regression), parameters in float32 and compute in --dtype, as in Flax's
ImageNet example; batch and input size default per model. The two backends differ only in the Conv class:
`partial(nn.Conv, conv_general_dilated=jaxconv.conv_general_dilated)` against plain `nn.Conv`.

Start-up checks, per model: the parameter trees of the two backends are identical; both backends start from
the same parameters, and the first step's loss (the forward pass) agrees within --loss-rtol, the losses of
the first --check-steps steps on the same batch (gradients and update) within --loss-rtol-steps, both
relative to the first loss; the jaxconv step's compiled HLO has 3 convolutions per convolution of the model (2
for the stem), jaxconv custom calls or, where jaxconv's `auto` leaves a problem to XLA (its floor), XLA's own.
A failed loss check is recorded and makes the exit status 1, after the timings, as does a different count;
different parameter trees or a jaxconv step without jaxconv calls stop the run.

Timing: compile, --warmup steps, then --repeats times --steps consecutive steps with one block_until_ready
at the end, the backends interleaved (jaxconv, lax, jaxconv, lax, ...) so that clock or thermal drift hits
both. Reported per backend: the median and min/max over repeats of the time per step, images/s at the
median, and lax/jaxconv = lax time / jaxconv time (> 1: jaxconv faster; the target is >= 1). --budget caps
each backend's timed seconds per model (fewer steps per repeat, recorded) so that a slow backend cannot run
the call past a device time limit. results.json and results.md are rewritten after every model.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from models import LAYER_SCALE_INIT, MODELS, ModelSpec, make_model, num_convs

BACKENDS = ("jaxconv", "lax")


# ---------------------------------------------------------------------------------------------------------
# Training step.
# ---------------------------------------------------------------------------------------------------------
def init_variables(model: nn.Module, input_shape: Sequence[int], seed: int) -> dict:
  """Flax's default initial values for these modules, drawn with numpy: kernels lecun_normal (normal truncated
  at 2 sigma, variance 1 / fan_in), BatchNorm and LayerNorm scales and variances 1, offsets, biases and means 0,
  ConvNeXt's layer scales LAYER_SCALE_INIT.

  Why not model.init: jitted, it spends 7-17 s of XLA:CPU compile time on one truncated normal per kernel
  shape (longer than the whole quick run's training steps), and unjitted about as long in op-by-op dispatch.
  """
  abstract = jax.eval_shape(functools.partial(model.init, train=False), jax.random.key(0),
                            jax.ShapeDtypeStruct((1, *input_shape[1:]), jnp.float32))
  rng = np.random.default_rng(seed)

  def draw(path, a):
    name = path[-1].key
    if name == "kernel":
      z = rng.standard_normal(a.shape)
      while np.any(out := np.abs(z) > 2):  # truncation by redrawing, as jax.random.truncated_normal's law
        z[out] = rng.standard_normal(np.count_nonzero(out))
      # 0.8796... = the std of a unit normal truncated at +-2 (the constant Flax's variance_scaling uses).
      v = z * np.sqrt(1.0 / np.prod(a.shape[:-1])) / 0.87962566103423978
    elif name in ("scale", "var"):
      v = np.ones(a.shape)
    elif name in ("bias", "mean"):
      v = np.zeros(a.shape)
    elif name == "layer_scale":
      v = np.full(a.shape, LAYER_SCALE_INIT)
    else:
      raise ValueError(f"no initializer for {jax.tree_util.keystr(path)}")
    return jnp.asarray(v, a.dtype)

  return jax.tree_util.tree_map_with_path(draw, abstract)


def make_optimizer(lr: float, weight_decay: float) -> optax.GradientTransformation:
  # Weight decay on kernels only (ndim > 1), as Flax's ImageNet example: not on BN scales and biases.
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim > 1, params)
  return optax.chain(optax.add_decayed_weights(weight_decay, mask=decay_mask),
                     optax.sgd(lr, momentum=0.9))


def make_train_step(model: nn.Module, tx: optax.GradientTransformation, task: str = "classify") -> Callable:
  """step(state, x, y) -> (state, loss), state = (params, batch_stats, opt_state); batch_stats is {} for a model
  without BatchNorm. The loss of a task (models.ModelSpec): softmax cross-entropy for "classify" and "segment",
  the mean squared error for "regress"."""

  def loss_fn(params, batch_stats, x, y):
    logits, updates = model.apply({"params": params, "batch_stats": batch_stats}, x, train=True,
                                  mutable=["batch_stats"])
    if task == "regress":
      loss = jnp.mean(jnp.square(logits - y))
    else:
      loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return loss, updates.get("batch_stats", {})

  def step(state, x, y):
    params, batch_stats, opt_state = state
    (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch_stats, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), batch_stats, opt_state), loss

  return step


def hlo_counts(hlo: str) -> dict:
  """Convolutions in a compiled module's HLO text, by who runs them."""
  return {"jaxconv_custom_calls": hlo.count('custom_call_target="jaxconv_'),
          "cudnn_convs": hlo.count('"__cudnn$conv'),
          # XLA's own convolution op (the CPU backend's; on a GPU they all become cuDNN calls).
          "hlo_convolutions": len(re.findall(r"\sconvolution\(", hlo))}


# Convolution custom-call targets of the two backends, by op.
_CONV_TARGETS = {"jaxconv_fwd": "fwd", "jaxconv_dgrad": "dgrad", "jaxconv_wgrad": "wgrad",
                 "__cudnn$convForward": "fwd", "__cudnn$convBiasActivationForward": "fwd",
                 "__cudnn$convBackwardInput": "dgrad", "__cudnn$convBackwardFilter": "wgrad"}


def conv_instructions(hlo: str) -> dict:
  """{instruction name: (op, (first operand, second operand, result) shapes)} for a compiled module's
  convolution custom calls. fwd: (x, w) -> y; dgrad: (dy, w) -> dx; wgrad: (x, dy) -> dw, on both backends."""
  shapes = {m.group(1): tuple(int(d) for d in m.group(2).split(",") if d)
            for m in re.finditer(r"%([\w.\-]+) = \(?[a-z0-9]+\[([\d,]*)\]", hlo)}
  # One pattern for both kinds: a custom call names its target; XLA's own convolution op (CPU) has none and
  # gets op "conv" (which of the three it is, the HLO does not say).
  out = {}
  for m in re.finditer(r"%([\w.\-]+) = [^\n]*? (custom-call|convolution)\(([^)]*)\)"
                       r"(?:[^\n]*custom_call_target=\"([^\"]+)\")?", hlo):
    op = "conv" if m.group(2) == "convolution" else _CONV_TARGETS.get(m.group(4))
    if op is not None:
      operands = re.findall(r"%([\w.\-]+)", m.group(3))[:2]
      out[m.group(1)] = (op, tuple(shapes.get(o, ()) for o in operands) + (shapes.get(m.group(1), ()),))
  return out


def profile_steps(compiled, state, x, y, steps: int):
  """Runs `steps` steps under jax.profiler; returns (state, {hlo instruction: µs per step})."""
  from jaxconv.bench import trace
  d = tempfile.mkdtemp(prefix="train_step_trace_")
  try:
    with jax.profiler.trace(d):
      for _ in range(steps):
        state, loss = compiled(state, x, y)
      jax.block_until_ready((state, loss))
    module = re.search(r"HloModule ([\w.\-]+)", compiled.as_text()).group(1)
    times = {k: v["ns"] / 1e3 / steps for k, v in trace.op_times(d, module).items()}
  finally:
    shutil.rmtree(d, ignore_errors=True)
  return state, times


def conv_breakdown(per_backend: dict) -> dict:
  """Per-layer device time of the convolutions of each backend's step, matched across backends.

  per_backend: {backend: (conv_instructions(hlo), {instruction: µs per step})}. Layers are matched by the
  element counts of their operands and result (layouts differ between the backends) and of their first
  operand, and by whether they are filter gradients: lax runs the data gradient of a 1x1 convolution as a
  cuDNN forward convolution, which then matches jaxconv's dgrad (the row's op is jaxconv's name). Identical
  layers (ResNet repeats blocks) are summed. Strided layers do not match: XLA pads their input explicitly.
  Returns {"rows": [...], "totals": {backend: {"conv", "other", "all", "unattributed"}}}, rows sorted by the
  largest time.
  """
  rows, totals = {}, {}
  for b, (convs, times) in per_backend.items():
    conv = sum(t for k, t in times.items() if k in convs)
    totals[b] = {"conv": conv, "all": sum(times.values()), "unattributed": times.get("", 0.0)}
    totals[b]["other"] = totals[b]["all"] - conv
    for name, (op, shapes) in convs.items():
      counts = [int(np.prod(s)) for s in shapes]
      key = (op == "wgrad", tuple(sorted(counts)), counts[0])
      row = rows.setdefault(key, {"op": op, "shapes": None, "calls": {}, "us": {}})
      if row["shapes"] is None or b == "jaxconv":  # jaxconv's names and logical NHWC / HWIO shapes
        x, w = {"dgrad": (2, 1), "wgrad": (0, 2)}.get(op, (0, 1))
        row["op"] = op
        row["shapes"] = ("x".join(map(str, shapes[x])), "x".join(map(str, shapes[w])))
      row["calls"][b] = row["calls"].get(b, 0) + 1
      row["us"][b] = row["us"].get(b, 0.0) + times.get(name, 0.0)
  ordered = sorted(rows.values(), key=lambda r: -max(r["us"].values()))
  return {"rows": ordered, "totals": totals}


def check_jaxconv_hlo(name: str, counts: dict) -> bool:
  """The point of the comparison: the jaxconv step runs its convolutions through jaxconv.

  Raises AssertionError if the step has no jaxconv call. Returns whether it has the expected convolutions: a
  forward, a filter gradient and a data gradient per conv, less the stem's data gradient (the images are not
  differentiated), counting those that jaxconv's `auto` leaves to XLA (cuDNN calls on a GPU, XLA convolution ops
  on a CPU). A different count is reported, not fatal: it would mean that XLA duplicated or dropped calls.
  """
  if not counts["jaxconv_custom_calls"]:
    raise AssertionError(f"{name}: the jaxconv step runs none of its convolutions on jaxconv: {counts}")
  total = counts["jaxconv_custom_calls"] + counts["cudnn_convs"] + counts["hlo_convolutions"]
  return total == 3 * num_convs(name) - 1


# ---------------------------------------------------------------------------------------------------------
# One model: checks, then interleaved timing.
# ---------------------------------------------------------------------------------------------------------
def _tree_signature(tree):
  return jax.tree.structure(tree), [(a.shape, jnp.dtype(a.dtype)) for a in jax.tree.leaves(tree)]


def sizes_for(spec: ModelSpec, args) -> tuple:
  """(batch, image side, learning rate) of a model: the arguments where given, else the model's defaults."""
  batch = args.batch or spec.batch
  image = args.image or (spec.quick_image if args.quick else spec.image)
  return batch, image, args.lr if args.lr is not None else 0.1 * batch / 256


def make_batch(spec: ModelSpec, batch: int, image: int, dtype, kx, ky):
  """(inputs, labels or targets) of one step: normal inputs in the compute dtype; integer labels per example
  ("classify") or per voxel ("segment"), or a normal float32 target image ("regress")."""
  spatial = (image,) * spec.nd
  x = jax.random.normal(kx, (batch, *spatial, spec.in_channels), dtype)
  if spec.task == "classify":
    y = jax.random.randint(ky, (batch,), 0, spec.classes)
  elif spec.task == "segment":
    y = jax.random.randint(ky, (batch, *spatial), 0, spec.classes)
  else:
    y = jax.random.normal(ky, (batch, *spatial, 1), jnp.float32)
  return x, y


def run_model(name: str, args, log=print) -> dict:
  dtype = jnp.dtype(args.dtype)
  backends = args.backends
  kx, ky, kp = jax.random.split(jax.random.key(args.seed), 3)  # kp: abstract init only
  spec = MODELS[name]
  batch, image, lr = sizes_for(spec, args)
  # Random normal inputs (zeros would let a kernel that skips work look fast), in the compute dtype as an
  # input pipeline would deliver them; random labels or targets. Both already on the device.
  x, y = jax.block_until_ready(make_batch(spec, batch, image, dtype, kx, ky))
  models = {b: make_model(name, b, dtype) for b in backends}

  # Parameter trees: abstract init of every backend, compared; one concrete init, so that all backends
  # start from the same values.
  sigs = {b: _tree_signature(jax.eval_shape(functools.partial(m.init, train=False), kp, x[:1]))
          for b, m in models.items()}
  same_tree = all(s == sigs[backends[0]] for s in sigs.values())
  if not same_tree:
    raise AssertionError(f"{name}: the parameter trees differ between backends: {sigs}")
  variables = init_variables(models[backends[0]], x.shape, args.seed)
  assert _tree_signature(variables) == sigs[backends[0]]
  params, batch_stats = variables["params"], variables.get("batch_stats", {})
  n_params = sum(a.size for a in jax.tree.leaves(params))
  tx = make_optimizer(lr, args.weight_decay)
  state0 = (params, batch_stats, tx.init(params))

  res = {"model": name, "task": spec.task, "batch": batch, "input": list(x.shape), "lr": lr,
         "num_params": int(n_params), "num_convs": num_convs(name), "same_param_tree": same_tree, "backends": {}}
  compiled, states = {}, {}
  for b in backends:
    t0 = time.perf_counter()
    lowered = jax.jit(make_train_step(models[b], tx, spec.task), donate_argnums=0).lower(state0, x, y)
    compiled[b] = lowered.compile()
    counts = hlo_counts(compiled[b].as_text())
    res["backends"][b] = {"compile_s": time.perf_counter() - t0, "hlo": counts}
    if b == "jaxconv":
      res["hlo_count_check"] = check_jaxconv_hlo(name, counts)
      if not res["hlo_count_check"]:
        log(f"  {name}: WARNING: {counts} convolutions, expected {3 * num_convs(name) - 1} in all (3 per "
            "convolution, 2 for the stem)")
    states[b] = jax.tree.map(jnp.copy, state0)  # donated below: one copy each
  del state0, params, batch_stats, variables

  # Loss check: same start, same fixed batch; the first loss is the forward pass, later ones follow the
  # gradients. These steps also warm up.
  for b in backends:
    losses = []
    for _ in range(args.check_steps):
      states[b], loss = compiled[b](states[b], x, y)
      losses.append(loss)
    res["backends"][b]["check_losses"] = [float(v) for v in jax.device_get(losses)]
  if len(backends) > 1:
    # Differences relative to the first loss (~ln 1000): on a tiny batch the loss falls fast, and bf16
    # rounding differences that compound over the steps would look large against a loss near 0. The later
    # steps get a looser tolerance: in bf16 the gradients of the BatchNorm parameters carry tens of percent
    # of rounding error against float32 on a small batch, on lax as well (ResNet-18 quick run: first loss
    # within 1e-5, up to 3e-2 after three updates; in float32 all within 1e-6). See FULL for the numbers.
    ref = np.asarray(res["backends"]["lax" if "lax" in backends else backends[-1]]["check_losses"])
    first = later = 0.0
    for b in backends:
      diff = np.abs(np.asarray(res["backends"][b]["check_losses"]) - ref) / max(abs(ref[0]), 1e-6)
      first, later = max(first, float(diff[0])), max(later, float(np.max(diff)))
    res["loss_first_rel_diff"], res["loss_max_rel_diff"] = first, later
    res["loss_check"] = bool(all(np.all(np.isfinite(v["check_losses"])) for v in res["backends"].values())
                             and first <= args.loss_rtol and later <= args.loss_rtol_steps)
  for b in backends:
    log(f"  {name} {b:8s} compile {res['backends'][b]['compile_s']:6.1f}s  losses "
        + " ".join(f"{v:.4f}" for v in res["backends"][b]["check_losses"]) + f"  HLO {res['backends'][b]['hlo']}")
  if "loss_check" in res:
    log(f"  {name} loss agreement: first step {res['loss_first_rel_diff']:.1e} (tolerance {args.loss_rtol:g}), "
        f"all {args.check_steps} steps {res['loss_max_rel_diff']:.1e} (tolerance {args.loss_rtol_steps:g}): "
        f"{'ok' if res['loss_check'] else 'FAILED'}")

  # Warm-up, timed as a whole to size the timed runs within --budget.
  steps = {}
  for b in backends:
    t0 = time.perf_counter()
    for _ in range(args.warmup):
      states[b], loss = compiled[b](states[b], x, y)
    jax.block_until_ready((states[b], loss))
    est = (time.perf_counter() - t0) / max(args.warmup, 1)
    steps[b] = args.steps
    if args.budget and args.warmup and est * args.steps * args.repeats > args.budget:
      steps[b] = max(1, int(args.budget / (est * args.repeats)))
      log(f"  {name} {b}: ~{est * 1e3:.0f} ms/step, {steps[b]} steps per repeat to stay within --budget "
          f"{args.budget:g}s")

  times, last_loss = {b: [] for b in backends}, {}
  for _ in range(args.repeats):
    for b in backends:  # interleaved: A B A B ...
      t0 = time.perf_counter()
      for _ in range(steps[b]):
        states[b], loss = compiled[b](states[b], x, y)
      jax.block_until_ready((states[b], loss))
      times[b].append((time.perf_counter() - t0) / steps[b])
      last_loss[b] = loss
  for b in backends:
    t = times[b]
    res["backends"][b].update(steps=steps[b], repeats=args.repeats, step_times_s=t,
                              median_ms=1e3 * statistics.median(t), min_ms=1e3 * min(t), max_ms=1e3 * max(t),
                              images_per_s=batch / statistics.median(t), final_loss=float(last_loss[b]))
  if "jaxconv" in backends and "lax" in backends:
    tj, tl = times["jaxconv"], times["lax"]
    paired = [l / j for l, j in zip(tl, tj)]  # same repeat, adjacent in time
    res["ratio_lax_over_jaxconv"] = statistics.median(tl) / statistics.median(tj)
    res["ratio_paired_min"], res["ratio_paired_max"] = min(paired), max(paired)
  if args.profile_steps:
    per_backend = {}
    for b in backends:
      states[b], times = profile_steps(compiled[b], states[b], x, y, args.profile_steps)
      per_backend[b] = (conv_instructions(compiled[b].as_text()), times)
    res["profile"] = conv_breakdown(per_backend)
    res["profile"]["steps"] = args.profile_steps
    log(profile_table(res["profile"], backends))
  del compiled, states
  return res


# ---------------------------------------------------------------------------------------------------------
# Reporting.
# ---------------------------------------------------------------------------------------------------------
def metadata(args, argv) -> dict:
  from jaxconv.bench.device import run_metadata
  meta = run_metadata(argv)
  if args.commit:
    meta["git_commit"], meta["git_dirty"] = args.commit, None
  meta["gpu"] = jax.devices()[0].device_kind
  try:  # which kernel choices the jaxconv step was lowered with (heuristic, cached or tuned)
    from jaxconv import algorithms
    meta["jaxconv_autotune"] = algorithms.autotune_mode()
  except (ImportError, AttributeError):
    meta["jaxconv_autotune"] = None
  meta["config"] = {k: getattr(args, k) for k in ("models", "backends", "batch", "image", "dtype", "steps",
                                                   "warmup", "repeats", "check_steps", "budget", "lr",
                                                   "weight_decay", "loss_rtol", "loss_rtol_steps", "seed",
                                                   "quick")}
  return meta


def table(results: list[dict]) -> str:
  rows = ["| model | backend | input | ms/step (median) | min | max | images/s | lax/jaxconv | compile s | "
          "jaxconv calls / cuDNN convs / HLO convs |", "|---|---|---|---|---|---|---|---|---|---|"]
  for r in results:
    for b, v in r["backends"].items():
      ratio = ""
      if b == "jaxconv" and "ratio_lax_over_jaxconv" in r:
        ratio = (f"**{r['ratio_lax_over_jaxconv']:.3f}** [{r['ratio_paired_min']:.3f}, "
                 f"{r['ratio_paired_max']:.3f}]")
      h = v["hlo"]
      rows.append(f"| {r['model']} | {b} | {'x'.join(map(str, r['input']))} | {v['median_ms']:.2f} | {v['min_ms']:.2f} | {v['max_ms']:.2f} | "
                  f"{v['images_per_s']:.0f} | {ratio} | {v['compile_s']:.1f} | "
                  f"{h['jaxconv_custom_calls']} / {h['cudnn_convs']} / {h['hlo_convolutions']} |")
  return "\n".join(rows)


def _ratio_cell(us: dict, on: bool) -> str:
  if not on:
    return ""
  return f" {us['lax'] / us['jaxconv']:.2f} |" if us.get("jaxconv") and "lax" in us else " - |"


def profile_table(prof: dict, backends) -> str:
  """Markdown table of conv_breakdown's result: µs per step, per layer and op, then the totals."""
  cols = " | ".join(f"{b} µs" for b in backends)
  ratio = len(backends) == 2 and set(backends) == {"jaxconv", "lax"}
  rows = [f"| op | x | w | calls | {cols} |" + (" lax/jaxconv |" if ratio else ""),
          "|---|---|---|---|" + "---|" * len(backends) + ("---|" if ratio else "")]
  for r in prof["rows"]:
    us = r["us"]
    rows.append(f"| {r['op']} | {r['shapes'][0]} | {r['shapes'][1]} | "
                f"{'/'.join(str(r['calls'].get(b, 0)) for b in backends)} | "
                + " | ".join(f"{us[b]:.1f}" if b in us else "-" for b in backends) + " |"
                + _ratio_cell(us, ratio))
  for what in ("conv", "other", "unattributed", "all"):
    t = {b: prof["totals"][b][what] for b in backends if b in prof["totals"]}
    rows.append(f"| **{what}** | | | | " + " | ".join(f"{t[b]:.1f}" if b in t else "-" for b in backends) + " |"
                + _ratio_cell(t, ratio))
  return "\n".join(rows)


def markdown(meta: dict, results: list[dict]) -> str:
  c = meta["config"]
  lines = [
      f"# Training step: jaxconv vs lax ({meta['gpu']})", "",
      f"- date (UTC): {meta['date']}",
      f"- device: {meta['gpu']} ({meta['platform']}), jax {meta['jax']}, jaxlib {meta['jaxlib']}",
      f"- jaxconv build: {meta['jaxconv_build_info']}, autotune: {meta['jaxconv_autotune']}",
      f"- commit: {meta.get('git_commit') or '?'}" + (" (dirty)" if meta.get("git_dirty") else ""),
      f"- inputs (batch, spatial dims, channels) per model in the table, channels-last; {c['dtype']} compute / "
      "float32 params, "
      f"SGD momentum 0.9, weight decay {c['weight_decay']:g}; {c['warmup']} warm-up steps, then {c['repeats']} "
      f"repeats of {c['steps']} steps" + (f" (fewer where --budget {c['budget']:g}s caps them)" if c["budget"]
                                           else "") + ", one block_until_ready per repeat, backends interleaved",
      f"- command: `python benchmarks/train_step.py {' '.join(meta['argv'])}`", "",
      "Time per step: median [min, max] over repeats. lax/jaxconv = lax median / jaxconv median (> 1: jaxconv "
      "faster; target >= 1), in brackets the range of the per-repeat ratios. The HLO column counts the "
      "convolutions of each compiled step: jaxconv custom calls / cuDNN convolutions / XLA convolution ops.", "",
      table(results), "", "Checks:", ""]
  for r in results:
    b0 = next(iter(r["backends"].values()))
    steps = ", ".join(f"{b} {v['steps']}" for b, v in r["backends"].items())
    line = (f"- {r['model']}: {r['num_params']:,} parameters, {r['num_convs']} convolutions, parameter trees "
            f"identical across backends: {r['same_param_tree']}; steps per repeat: {steps}")
    if "loss_check" in r:
      losses = "; ".join(f"{b} " + ", ".join(f"{v:.4f}" for v in r["backends"][b]["check_losses"])
                         for b in r["backends"])
      line += (f"; losses of the first {len(b0['check_losses'])} steps: {losses} (max rel diff "
               f"{r['loss_max_rel_diff']:.1e}, first step {r['loss_first_rel_diff']:.1e}, relative to the first "
               f"loss: {'ok' if r['loss_check'] else 'FAILED'})")
    lines.append(line)
  for r in results:
    if "profile" in r:
      lines += ["", f"## {r['model']}: device time per step by convolution (jax.profiler, {r['profile']['steps']} "
                "steps)", "",
                "µs per step of the kernels attributed to each convolution custom call; layers matched across "
                "backends by op and operand sizes, identical layers summed (calls = instances per step). "
                "'other': every other kernel of the step; 'unattributed': kernels without an HLO op (replayed "
                "command buffers: profile with XLA_FLAGS=--xla_gpu_enable_command_buffer=).", "",
                profile_table(r["profile"], list(r["backends"]))]
  return "\n".join(lines) + "\n"


def write_outputs(out: str, meta: dict, results: list[dict]) -> None:
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump({"meta": meta, "results": results}, f, indent=1)
  with open(os.path.join(out, "results.md"), "w") as f:
    f.write(markdown(meta, results))


# ---------------------------------------------------------------------------------------------------------
# Command line.
# ---------------------------------------------------------------------------------------------------------
# Loss tolerances: the bf16 rounding noise of the loss. Measured on the CPU (ResNet-50, training-mode
# BatchNorm, 3 initialisations): the bf16 loss of either backend is off the float32 loss by up to 7% at
# batch 2, 3% at batch 8, 1% at batch 32, falling with the batch (BatchNorm statistics over more values);
# in float32 the backends' losses agree within 1e-6 (ResNet-18). jaxconv's bf16 convs round correctly.
# batch and image: None takes each model's own (models.ModelSpec).
FULL = dict(batch=None, image=None, steps=20, warmup=5, repeats=5, check_steps=3, budget=60.0, loss_rtol=2e-2,
            loss_rtol_steps=5e-2)
# 64x64, not 32x32: at 32x32 the last stage is 1x1, and a training-mode BatchNorm over 2 values maps
# rounding-level differences to +-1 (float32 logits of the two backends then differ by O(1)).
QUICK = dict(batch=2, image=None, steps=3, warmup=1, repeats=2, check_steps=3, budget=0.0, loss_rtol=0.1,
             loss_rtol_steps=0.15)


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  csv = lambda s: [v for v in s.split(",") if v]
  p.add_argument("--models", type=csv, default=list(MODELS), help=f"comma-separated, of {','.join(MODELS)}")
  p.add_argument("--backends", type=csv, default=list(BACKENDS), help="comma-separated: jaxconv,lax")
  p.add_argument("--quick", action="store_true", help=f"tiny run for a CPU: defaults {QUICK}")
  p.add_argument("--batch", type=int, help="default: the model's (ResNets 128, MobileNetV2 64, ConvNeXt-T 32, "
                 "3-D UNet 2, MSD 4); --quick 2")
  p.add_argument("--image", type=int, help="input side, every spatial dim: default the model's (classifiers 224, "
                 "3-D UNet 64, MSD 512); --quick 64 (3-D UNet 16)")
  p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                 help="compute dtype (params stay float32)")
  p.add_argument("--steps", type=int, help=f"timed steps per repeat, default {FULL['steps']}")
  p.add_argument("--warmup", type=int, help=f"untimed steps after the checks, default {FULL['warmup']}")
  p.add_argument("--repeats", type=int, help=f"timed repeats per backend, default {FULL['repeats']}")
  p.add_argument("--check-steps", type=int, help="steps whose losses are compared across backends, default 3")
  p.add_argument("--budget", type=float, help="max timed seconds per backend and model (0: no cap), default "
                 f"{FULL['budget']:g}")
  p.add_argument("--lr", type=float, help="default 0.1 * batch / 256 (Flax's ImageNet example), per model")
  p.add_argument("--weight-decay", type=float, default=1e-4)
  p.add_argument("--loss-rtol", type=float, help="max difference of the first step's loss between backends, "
                 f"relative to it; default {FULL['loss_rtol']:g}, quick {QUICK['loss_rtol']:g}")
  p.add_argument("--loss-rtol-steps", type=float, help="max loss difference over all check steps, relative to "
                 f"the first loss; default {FULL['loss_rtol_steps']:g}, quick {QUICK['loss_rtol_steps']:g}")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--profile-steps", type=int, default=0,
                 help="after the timing, trace this many steps per backend with jax.profiler and tabulate the "
                 "device time of each convolution (0: off)")
  p.add_argument("--out", default="train_step_results", help="folder for results.json and results.md")
  p.add_argument("--commit", default=os.environ.get("JAXCONV_COMMIT"),
                 help="commit to record (default: env JAXCONV_COMMIT, else git)")
  args = p.parse_args(argv)
  for k, v in (QUICK if args.quick else FULL).items():
    if getattr(args, k) is None:
      setattr(args, k, v)
  for m in args.models:
    if m not in MODELS:
      p.error(f"unknown model {m!r}: choose from {', '.join(MODELS)}")
  for b in args.backends:
    if b not in BACKENDS:
      p.error(f"unknown backend {b!r}: choose from {', '.join(BACKENDS)}")
  if not args.backends or len(set(args.backends)) != len(args.backends):
    p.error(f"--backends must name distinct backends, got {args.backends}")
  if (min(v for v in (args.batch, args.image, args.steps, args.repeats) if v is not None) < 1 or args.warmup < 0
      or args.check_steps < 1):
    p.error("batch, image, steps, repeats, check-steps must be >= 1 and warmup >= 0")
  return args


def main(argv=None) -> dict:
  """Runs the benchmark; returns {"meta": ..., "results": [per model], "ok": loss checks passed}."""
  argv = sys.argv[1:] if argv is None else list(argv)
  args = parse_args(argv)
  meta = metadata(args, argv)
  print(f"Training step on {meta['gpu']} ({meta['platform']}), jax {meta['jax']}, batch {args.batch or 'per model'}, "
        f"image {args.image or 'per model'}, {args.dtype}, backends {', '.join(args.backends)}", flush=True)
  results = []
  for name in args.models:
    results.append(run_model(name, args, log=functools.partial(print, flush=True)))
    write_outputs(args.out, meta, results)  # after every model: a run cut off keeps what it measured
  print()
  print(table(results))
  ok = all(r.get("loss_check", True) and r.get("hlo_count_check", True) for r in results)
  for r in results:
    if "ratio_lax_over_jaxconv" in r:
      ratio = r["ratio_lax_over_jaxconv"]
      print(f"{r['model']}: lax/jaxconv {ratio:.3f} -> target (jaxconv no slower than lax) "
            f"{'met' if ratio >= 1 else 'not met'}")
  print(f"results: {os.path.join(args.out, 'results.json')}, results.md")
  return {"meta": meta, "results": results, "ok": ok}


if __name__ == "__main__":
  sys.exit(0 if main()["ok"] else 1)
