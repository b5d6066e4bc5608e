"""Weak scaling of a data-parallel training step of a small CNN on jaxconv: 1 device against all devices,
with the global batch growing with the device count (the issue's target: within 1.2x of one device).

    python benchmarks/multi_gpu_scaling.py [--per-device-batch 64] [--steps 20]

Prints one JSON line (times are medians of wall time per step, each step blocked on) and a verdict. Also
checks the compiled step: no all-gather of activations, and the filter gradients' all-reduce present.
"""

import argparse
import json
import re
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxconv


def init(key):
  k1, k2, k3 = jax.random.split(key, 3)
  return {"w1": jax.random.normal(k1, (3, 3, 3, 32)) * 0.2, "w2": jax.random.normal(k2, (3, 3, 32, 32)) * 0.06,
          "wd": jax.random.normal(k3, (32, 10)) * 0.1}


def loss(p, x, y):
  h = jaxconv.conv2d(x, p["w1"], padding="SAME", activation="relu")
  h = jaxconv.conv2d(h, p["w2"], padding="SAME", stride=2, activation="relu")
  logits = jnp.mean(h, axis=(1, 2)) @ p["wd"]
  return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, 10), -1))


def step(p, x, y):
  value, g = jax.value_and_grad(loss)(p, x, y)
  return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), value


def time_step(ndev, per_device_batch, steps):
  mesh = jax.make_mesh((ndev,), ("data",), devices=jax.devices()[:ndev], axis_types=(AxisType.Auto,))
  rng = np.random.default_rng(0)
  n = ndev * per_device_batch
  x = jax.device_put(rng.standard_normal((n, 32, 32, 3)).astype(np.float32), NamedSharding(mesh, P("data")))
  y = jax.device_put(rng.integers(0, 10, n), NamedSharding(mesh, P("data")))
  p = jax.device_put(init(jax.random.key(0)), NamedSharding(mesh, P()))
  compiled = jax.jit(step).lower(p, x, y).compile()
  hlo = compiled.as_text()
  for _ in range(3):
    p, value = compiled(p, x, y)
  jax.block_until_ready(p)
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    p, value = compiled(p, x, y)
    jax.block_until_ready((p, value))
    times.append(time.perf_counter() - t0)
  return {"devices": ndev, "global_batch": n, "step_s": statistics.median(times),
          "all_gather": len(re.findall(r"all-gather(?:-start)?\(", hlo)),
          "all_reduce": len(re.findall(r"all-reduce(?:-start)?\(", hlo)), "loss": float(value)}


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--per-device-batch", type=int, default=64)
  ap.add_argument("--steps", type=int, default=20)
  args = ap.parse_args()
  ndev = jax.device_count()
  one = time_step(1, args.per_device_batch, args.steps)
  many = time_step(ndev, args.per_device_batch, args.steps)
  ratio = many["step_s"] / one["step_s"]
  ok = ndev > 1 and ratio <= 1.2 and many["all_gather"] == 0 and many["all_reduce"] >= 1
  print(json.dumps({"device": jax.devices()[0].device_kind, "jax": jax.__version__, "one": one, "all": many,
                    "ratio": ratio, "ok": ok}))
  print(f"{ndev} devices: step {many['step_s'] * 1e3:.2f} ms at batch {many['global_batch']} vs 1 device "
        f"{one['step_s'] * 1e3:.2f} ms at batch {one['global_batch']}: ratio {ratio:.3f} (target <= 1.2); "
        f"all-gathers {many['all_gather']}, all-reduces {many['all_reduce']}: {'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
  main()
