"""Smoke check of an installed jaxconv (a wheel in a fresh environment): it imports from site-packages, not from a
source tree, and its convolution and gradients match lax's on the CPU, and on the GPU when the build has CUDA.

  python tools/wheel_smoke.py --source-tree REPO [--expect-cuda]

--expect-cuda fails unless the build has CUDA kernels and a GPU runs them. Run it from outside the source tree.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys


def check_on(device, jax, jnp, jaxconv):
  """jaxconv.conv2d and its gradients against lax.conv_general_dilated on one device; the largest relative error."""
  k1, k2 = jax.random.split(jax.random.key(0))
  x = jax.device_put(jax.random.normal(k1, (2, 17, 19, 3), jnp.float32), device)
  w = jax.device_put(jax.random.normal(k2, (3, 3, 3, 8), jnp.float32), device)
  dn = ("NHWC", "HWIO", "NHWC")
  precision = jax.lax.Precision.HIGHEST

  def ours(x, w):
    return jaxconv.conv2d(x, w, stride=(1, 2), padding="SAME", precision=precision)

  def ref(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 2), "SAME", dimension_numbers=dn, precision=precision)

  worst = 0.0
  for fn in (lambda f: f, lambda f: jax.grad(lambda x, w: jnp.sum(f(x, w) ** 2), argnums=(0, 1))):
    got, want = jax.jit(fn(ours))(x, w), jax.jit(fn(ref))(x, w)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      err = float(jnp.max(jnp.abs(g - r)) / (jnp.max(jnp.abs(r)) + 1e-30))
      worst = max(worst, err)
  # The lowered program calls jaxconv's custom call, so the numbers above are jaxconv's and not a fallback.
  hlo = jax.jit(ours).lower(x, w).as_text()
  assert "jaxconv_fwd" in hlo, "jaxconv.conv2d did not lower to jaxconv's custom call"
  return worst


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--source-tree", type=pathlib.Path, required=True, help="jaxconv must not import from here")
  parser.add_argument("--expect-cuda", action="store_true")
  args = parser.parse_args(argv)

  import jax
  import jax.numpy as jnp
  import jaxconv

  where = pathlib.Path(jaxconv.__file__).resolve().parent
  assert not where.is_relative_to(args.source_tree.resolve()), f"jaxconv imported from the source tree: {where}"
  # An editable install's .so would live in the source tree's build directory; an installed wheel's sits beside it.
  assert list(where.glob("_jaxconv_native*.so")), f"no compiled extension in {where}"
  info = jaxconv.build_info()
  print("jaxconv", jaxconv.__version__, "from", where)
  print("build_info", json.dumps(info))
  print("jax", jax.__version__, "devices", [str(d) for d in jax.devices()])

  errors = {"cpu": check_on(jax.devices("cpu")[0], jax, jnp, jaxconv)}
  if jaxconv.cuda_available():
    errors["gpu"] = check_on(jax.devices("gpu")[0], jax, jnp, jaxconv)
  elif args.expect_cuda:
    print(f"FAIL: expected CUDA kernels and a GPU; build_info {info}, cuda_available False", file=sys.stderr)
    return 1
  print("max relative error vs lax:", {k: f"{v:.2e}" for k, v in errors.items()})
  bad = {k: v for k, v in errors.items() if not v < 1e-4}  # float32 rounding is ~1e-6; a wrong kernel is O(1)
  if bad:
    print(f"FAIL: jaxconv differs from lax: {bad}", file=sys.stderr)
    return 1
  print("wheel smoke check: ok")
  return 0


if __name__ == "__main__":
  sys.exit(main())
