"""Train a CNN and a small ResNet on scikit-learn's handwritten digits, on jaxconv's convolutions.

    python examples/digits.py                 # full run: both models, >= 97% test accuracy, plot
    python examples/digits.py --quick         # a few hundred steps (what the test runs)
    python examples/digits.py --backend lax   # the same models on lax.conv_general_dilated

The data set (`sklearn.datasets.load_digits`: 1797 8x8 grey-level images, ten classes) ships inside
scikit-learn, so nothing is downloaded. Every convolution (forward and both gradients) runs on jaxconv's
kernels, under jit, on whatever device JAX picks (CPU here, the GPU in a CUDA build):

- "cnn": the seeds' CNN, 5x5 conv with 16 filters + ReLU (one fused `jaxconv.flax.ConvBiasAct`), 2x2
  max-pool, dense classifier.
- "resnet": conv-BN-ReLU stem, two residual stages (the second strided, with a 1x1 projection), global
  average pool, dense. For inference its BatchNorms are folded into the convolutions
  (`jaxconv.flax.fold_batch_norm_variables`), giving one fused conv+bias(+ReLU) kernel per conv-BN pair.

`--backend lax` builds the same models from `flax.linen.Conv`: the parameter trees are identical (the
jaxconv modules are drop-in), which is how the test compares the two loss curves.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

import jaxconv.flax as jf

MODELS = ("cnn", "resnet")
BACKENDS = ("jaxconv", "lax")


# ---------------------------------------------------------------------------------------------------------
# Data.
# ---------------------------------------------------------------------------------------------------------
def load_data(test_fraction: float = 0.2, seed: int = 0):
  """(x_train, y_train, x_test, y_test): NHWC float32 images in [0, 1], int32 labels; a fixed split."""
  from sklearn.datasets import load_digits
  digits = load_digits()
  x = (digits.images.astype(np.float32) / 16.0)[..., None]  # (1797, 8, 8, 1)
  y = digits.target.astype(np.int32)
  perm = np.random.default_rng(seed).permutation(len(x))
  n_test = int(round(len(x) * test_fraction))
  test, train = perm[:n_test], perm[n_test:]
  return x[train], y[train], x[test], y[test]


# ---------------------------------------------------------------------------------------------------------
# Models. `backend` picks the convolution; the parameter names do not depend on it.
# ---------------------------------------------------------------------------------------------------------
def _conv_act(backend: str, features, kernel_size, *, strides=1, activation=None, use_bias=True, name):
  """A conv followed by an optional ReLU: fused on jaxconv, conv then nn.relu on lax."""
  if backend == "jaxconv":
    return jf.ConvBiasAct(features, kernel_size, strides=strides, activation=activation,
                          use_bias=use_bias, name=name)
  conv = nn.Conv(features, kernel_size, strides=strides, use_bias=use_bias, name=name)
  return conv if activation is None else (lambda x: nn.relu(conv(x)))


class CNN(nn.Module):
  """The seeds' CNN: 5x5 conv (16 filters) + ReLU, 2x2 max-pool, dense classifier."""
  backend: str = "jaxconv"

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = _conv_act(self.backend, 16, (5, 5), activation="relu", name="conv")(x)
    x = nn.max_pool(x, (2, 2), strides=(2, 2))
    return nn.Dense(10, name="head")(x.reshape(x.shape[0], -1))


class ResNet(nn.Module):
  """A small ResNet: stem, stage 1 (16 channels, 8x8), stage 2 (32 channels, 4x4, strided), pool, dense.

  Every conv is followed by a BatchNorm; with folded=True each conv+BN pair is one ConvBiasAct whose
  params come from fold_params (inference only).
  """
  backend: str = "jaxconv"
  folded: bool = False

  def conv_bn(self, x, features, kernel_size, *, strides=1, relu: bool, train: bool, name: str):
    act = "relu" if relu else None
    if self.folded:
      return _conv_act(self.backend, features, kernel_size, strides=strides, activation=act, name=name)(x)
    x = _conv_act(self.backend, features, kernel_size, strides=strides, use_bias=False,
                  name=f"{name}_conv")(x)
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9, name=f"{name}_bn")(x)
    return nn.relu(x) if relu else x

  def block(self, x, features, strides, train, name):
    y = self.conv_bn(x, features, (3, 3), strides=strides, relu=True, train=train, name=f"{name}a")
    y = self.conv_bn(y, features, (3, 3), relu=False, train=train, name=f"{name}b")
    if strides != 1 or x.shape[-1] != features:
      x = self.conv_bn(x, features, (1, 1), strides=strides, relu=False, train=train, name=f"{name}p")
    return nn.relu(x + y)

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = self.conv_bn(x, 16, (3, 3), relu=True, train=train, name="stem")
    x = self.block(x, 16, 1, train, "s1")
    x = self.block(x, 32, 2, train, "s2")
    x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(10, name="head")(x)


def fold_params(variables) -> dict:
  """ResNet variables (params + batch_stats) -> the params of ResNet(folded=True)."""
  params, stats = variables["params"], variables["batch_stats"]
  out = {}
  for name, value in params.items():
    if name.endswith("_conv"):
      base = name[:-len("_conv")]
      out[base] = jf.fold_batch_norm_variables(
          value, {"params": params[f"{base}_bn"], "batch_stats": stats[f"{base}_bn"]}, epsilon=1e-5)
    elif not name.endswith("_bn"):
      out[name] = value
  return {"params": out}


def make_model(name: str, backend: str = "jaxconv") -> nn.Module:
  if name not in MODELS:
    raise ValueError(f"model must be one of {MODELS}, got {name!r}")
  if backend not in BACKENDS:
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
  return CNN(backend) if name == "cnn" else ResNet(backend)


# ---------------------------------------------------------------------------------------------------------
# Training.
# ---------------------------------------------------------------------------------------------------------
class ProgressBar:
  """A one-line text progress bar (no dependency): [#####.....] step/total and the latest metrics."""

  def __init__(self, total: int, label: str, enabled: bool = True, width: int = 30, stream=sys.stderr):
    self.total, self.label, self.enabled, self.width, self.stream = total, label, enabled, width, stream
    self.start = time.perf_counter()

  def update(self, step: int, **metrics):
    if not self.enabled:
      return
    filled = int(self.width * step / max(self.total, 1))
    info = " ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
    elapsed = time.perf_counter() - self.start
    self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] "
                      f"{step}/{self.total} {elapsed:5.1f}s {info}   ")
    self.stream.flush()

  def close(self):
    if self.enabled:
      self.stream.write("\n")
      self.stream.flush()


def train(model_name: str, *, backend: str = "jaxconv", steps: int = 1500, batch_size: int = 64,
          learning_rate: float = 3e-3, seed: int = 0, eval_every: int = 100, data=None,
          progress: bool = True) -> dict[str, Any]:
  """Trains one model with Adam (cosine decay) on minibatches drawn from a seeded permutation.

  Returns a dict: losses (per step), eval_steps, test_acc (at each eval), final test_acc, variables,
  seconds, and for the ResNet folded_test_acc (the BatchNorm-folded inference model's accuracy).
  """
  x_train, y_train, x_test, y_test = data if data is not None else load_data()
  model = make_model(model_name, backend)
  key = jax.random.key(seed)
  variables = model.init(key, jnp.asarray(x_train[:1]), train=False)
  params = variables["params"]
  stats = variables.get("batch_stats", {})
  tx = optax.adam(optax.cosine_decay_schedule(learning_rate, steps, alpha=0.05))
  opt_state = tx.init(params)

  def loss_fn(params, stats, x, y):
    if stats:
      logits, updates = model.apply({"params": params, "batch_stats": stats}, x, train=True,
                                    mutable=["batch_stats"])
      stats = updates["batch_stats"]
    else:
      logits = model.apply({"params": params}, x, train=True)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), stats

  @jax.jit
  def step(params, stats, opt_state, x, y):
    (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, stats, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), stats, opt_state, loss

  @jax.jit
  def accuracy(variables, x, y):
    return jnp.mean(jnp.argmax(model.apply(variables, x, train=False), -1) == y)

  def evaluate(params, stats):
    v = {"params": params, **({"batch_stats": stats} if stats else {})}
    return float(accuracy(v, x_test, y_test))

  # Minibatches: consecutive slices of per-epoch permutations from one seeded generator.
  rng = np.random.default_rng(seed)
  order = np.empty((0,), np.int64)
  losses, eval_steps, accs = [], [], []
  bar = ProgressBar(steps, f"{model_name:6s} ({backend})", enabled=progress)
  t0 = time.perf_counter()
  for i in range(1, steps + 1):
    if len(order) < batch_size:
      order = np.concatenate([order, rng.permutation(len(x_train))])
    idx, order = order[:batch_size], order[batch_size:]
    params, stats, opt_state, loss = step(params, stats, opt_state, x_train[idx], y_train[idx])
    losses.append(loss)
    if i % eval_every == 0 or i == steps:
      eval_steps.append(i)
      accs.append(evaluate(params, stats))
      bar.update(i, loss=float(loss), test_acc=accs[-1])
  losses = [float(l) for l in jax.device_get(losses)]
  bar.close()
  out = dict(model=model_name, backend=backend, losses=losses, eval_steps=eval_steps, test_accs=accs,
             test_acc=accs[-1], seconds=time.perf_counter() - t0, n_test=len(y_test),
             variables={"params": params, **({"batch_stats": stats} if stats else {})})
  if stats:  # inference with every BatchNorm folded into its convolution
    folded_model = ResNet(backend, folded=True)
    logits = jax.jit(folded_model.apply)(fold_params(out["variables"]), x_test)
    out["folded_test_acc"] = float(jnp.mean(jnp.argmax(logits, -1) == y_test))
  return out


def plot(histories, path: str) -> None:
  """Training loss (smoothed) and test accuracy of each run, side by side, into a PNG."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4.2))
  for h in histories:
    label = f"{h['model']} ({h['backend']})"
    losses = np.asarray(h["losses"])
    k = max(1, len(losses) // 50)
    smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
    ax_loss.plot(np.arange(k, len(losses) + 1), smooth, label=label)
    ax_acc.plot(h["eval_steps"], 100 * np.asarray(h["test_accs"]), marker="o", ms=3,
                label=f"{label}: {100 * h['test_acc']:.1f}%")
  ax_loss.set(yscale="log", xlabel="step", ylabel="training loss (moving average)",
              title="Training loss")
  ax_acc.axhline(97, color="grey", lw=0.8, ls="--")
  ax_acc.set(xlabel="step", ylabel="test accuracy (%)", title=f"Test accuracy ({histories[0]['n_test']} held-out digits)",
             ylim=(80, 100.5))
  for ax in (ax_loss, ax_acc):
    ax.grid(alpha=0.3)
    ax.legend()
  fig.suptitle(f"scikit-learn digits on jaxconv ({jax.default_backend()})")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true", help="a few hundred steps (CI smoke run)")
  parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
  parser.add_argument("--backend", choices=BACKENDS, default="jaxconv")
  parser.add_argument("--steps", type=int, default=None, help="steps per model (default 1500, quick 150)")
  parser.add_argument("--batch-size", type=int, default=64)
  parser.add_argument("--lr", type=float, default=3e-3)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--plot", default="digits.png", help="where to write the loss/accuracy plot")
  parser.add_argument("--no-progress", action="store_true")
  args = parser.parse_args(argv)
  steps = args.steps or (150 if args.quick else 1500)
  data = load_data(seed=args.seed)
  print(f"digits: {len(data[0])} train / {len(data[2])} test images, backend {args.backend} on "
        f"{jax.default_backend()}, {steps} steps per model")
  histories = []
  for name in args.models:
    h = train(name, backend=args.backend, steps=steps, batch_size=args.batch_size,
              learning_rate=args.lr, seed=args.seed, eval_every=max(1, steps // 15), data=data,
              progress=not args.no_progress)
    extra = f", BN-folded inference {100 * h['folded_test_acc']:.2f}%" if "folded_test_acc" in h else ""
    print(f"{name}: test accuracy {100 * h['test_acc']:.2f}%{extra}, final loss {h['losses'][-1]:.4f}, "
          f"{h['seconds']:.1f}s")
    histories.append(h)
  if args.plot:
    plot(histories, args.plot)
    print(f"plot: {args.plot}")
  return histories


if __name__ == "__main__":
  main()
