"""Sharded convolutions on 8 CPU host devices: results, gradients and the collectives in the compiled HLO.

jax fixes its device count when it first initialises (the rest of the suite runs on one device), so the
checks run in fresh interpreters: this file, run as a script, executes the checks with
XLA_FLAGS=--xla_force_host_platform_device_count=8 and prints one JSON line per check; the pytest side runs
it once per partitioner (Shardy, jax's default: every check; GSPMD: the core checks), both workers at once,
once per test session, and turns each line into a test.

Every check compares against the same computation on one device (jaxconv, unsharded). HLO checks count
collectives in the compiled (partitioned) module: `all-gather` of activations must be absent on the
batch-sharded paths and the filter gradient's all-reduce must appear exactly once.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import time
import traceback

import pytest

import conv_utils as cu

# 8 CPU host devices in CI; the multi-GPU run sets JAXCONV_SHARD_NDEV to its GPU count.
NDEV = int(os.environ.get("JAXCONV_SHARD_NDEV", "8"))
# Prefix of the worker's result lines (one JSON object per check) on its stdout.
REPORT = "JAXCONV_SHARDING "


# ---------------------------------------------------------------------------------------------------------
# The worker (runs in a subprocess with 8 host devices).
# ---------------------------------------------------------------------------------------------------------
def _worker(partitioner: str) -> None:
  import jax
  if partitioner == "gspmd":
    jax.config.update("jax_use_shardy_partitioner", False)
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  import jaxconv

  assert jax.device_count() == NDEV, jax.devices()
  jaxconv.set_debug_poison(True)
  # True float32 for lax references too (on a GPU, DEFAULT would run lax's convs in TF32).
  jax.config.update("jax_default_matmul_precision", "highest")
  mesh1 = jax.make_mesh((NDEV,), ("data",), axis_types=(AxisType.Auto,))
  mesh2 = jax.make_mesh((NDEV // 2, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
  keys = iter(jax.random.split(jax.random.key(0), 64))

  def rnd(*shape):
    return jax.random.normal(next(keys), shape, jnp.float32)

  def put(a, mesh, *spec):
    return jax.device_put(a, NamedSharding(mesh, P(*spec)))

  def close(got, want, what):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      g, w = np.asarray(g), np.asarray(w)
      assert g.shape == w.shape, (what, g.shape, w.shape)
      assert np.all(np.isfinite(g)), f"{what}: non-finite values"
      err = float(np.max(np.abs(g - w))) / max(1.0, float(np.max(np.abs(w))))
      assert err < 2e-5, f"{what}: relative error {err:.3g}"

  def collectives(hlo):
    return {op: len(re.findall(rf"= [^=]*? {op}(?:-start)?\(", hlo))
            for op in ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")}

  def all_reduce_shapes(hlo):
    """The array types reduced by each all-reduce (a combined all-reduce lists several)."""
    found = []
    for m in re.finditer(r"= \(?([^=]*?)\)? all-reduce(?:-start)?\(", hlo):
      found.extend(re.sub(r"\{[^}]*\}", "", t).strip() for t in m.group(1).split(", "))
    return sorted(found)

  results = []

  def check(name):
    def deco(fn):
      t0 = time.perf_counter()
      try:
        info = fn()
        results.append({"name": name, "ok": True, "info": info, "s": round(time.perf_counter() - t0, 2)})
      except Exception as e:  # noqa: BLE001 - reported to the pytest side
        results.append({"name": name, "ok": False,
                        "info": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"})
      return fn
    return deco

  def sharded(fn, *args):
    """Compiles fn for the sharded args once: (result, collective counts, all-reduced types)."""
    compiled = jax.jit(fn).lower(*args).compile()
    hlo = compiled.as_text()
    return compiled(*args), collectives(hlo), all_reduce_shapes(hlo)

  ref = lambda fn, *args: jax.jit(fn)(*args)  # the single-device answer (unsharded operands)
  conv = lambda x, w, b=None, **kw: jaxconv.conv2d(x, w, b, padding="SAME", **kw)
  full = partitioner == "shardy"  # GSPMD (the legacy partitioner) runs the core checks only

  # -- batch-sharded forward: local on every device ---------------------------------------------------
  @check("fwd_batch_sharded")
  def _():
    x, w, b = rnd(16, 12, 12, 3), rnd(3, 3, 3, 8), rnd(8)
    f = lambda x, w, b: conv(x, w, b, activation="relu")
    got, ops, _ = sharded(f, put(x, mesh1, "data"), w, b)
    close(got, ref(f, x, w, b), "y")
    assert got.sharding.spec[0] == "data", got.sharding
    assert sum(ops.values()) == 0, f"collectives in a batch-sharded forward: {ops}"
    return ops

  # -- data-parallel training step: one all-reduce for the filter gradients -----------------------------
  @check("train_step_batch_sharded")
  def _():
    x, w1, w2 = rnd(16, 12, 12, 3), rnd(3, 3, 3, 8), rnd(3, 3, 8, 4)

    def step(ws, x):
      def loss(ws):
        h = jax.nn.relu(conv(x, ws[0]))
        return jnp.sum(conv(h, ws[1]) ** 2)
      g = jax.grad(loss)(ws)
      return [w - 1e-3 * gw for w, gw in zip(ws, g)], g

    got, ops, reduced = sharded(step, [w1, w2], put(x, mesh1, "data"))
    close(got, ref(step, [w1, w2], x), "step")
    assert ops["all-gather"] == 0, f"activations all-gathered: {ops}"
    # The filter gradients are summed once and nothing else is: XLA may combine them into one tuple
    # all-reduce (CPU) or one flattened buffer (GPU: f32[504] = 3*3*3*8 + 3*3*8*4).
    sizes = [int(np.prod([int(d) for d in re.findall(r"\d+", t.split("[", 1)[1])])) for t in reduced]
    assert sum(sizes) == 3 * 3 * 3 * 8 + 3 * 3 * 8 * 4 and all(t.startswith("f32[") for t in reduced), reduced
    assert ops["all-reduce"] <= 2, ops
    assert sum(ops.values()) == ops["all-reduce"], ops
    return {"ops": ops, "all_reduce": reduced}

  # -- model parallel along K (output channels) ---------------------------------------------------------
  @check("model_parallel_K")
  def _():
    x, w, b = rnd(4, 10, 10, 6), rnd(3, 3, 6, 16), rnd(16)
    f = lambda x, w, b: conv(x, w, b, activation="gelu")
    ws, bs = put(w, mesh1, None, None, None, "data"), put(b, mesh1, "data")
    got, ops, _ = sharded(f, x, ws, bs)
    close(got, ref(f, x, w, b), "y")
    assert got.sharding.spec[-1] == "data", got.sharding
    assert sum(ops.values()) == 0, f"collectives in a K-sharded forward: {ops}"
    g = jax.grad(lambda x, w, b: jnp.sum(f(x, w, b) ** 2), (0, 1, 2))
    got, ops, reduced = sharded(g, x, ws, bs)
    close(got, ref(g, x, w, b), "grads")
    # dw and dbias stay K-sharded and local; dx is the one sum over the K shards
    assert ops["all-gather"] == 0 and reduced == ["f32[4,10,10,6]"], (ops, reduced)
    return {"grad_ops": ops, "all_reduce": reduced}

  # -- shard_map with replicated weights (varying manual axes) --------------------------------------------
  @check("shard_map_replicated_weights")
  def _():
    x, w, b = rnd(16, 10, 10, 3), rnd(3, 3, 3, 4), rnd(4)
    w2 = rnd(1, 1, 4, 2)

    def loss(params, x):
      w, b = params
      return jnp.sum(conv(conv(x, w, b, activation="silu"), w2) ** 2)

    sm = jax.shard_map(lambda p, x: jax.lax.psum(loss(p, x), "data"), mesh=mesh1,
                       in_specs=(P(), P("data")), out_specs=P())
    xs = put(x, mesh1, "data")
    vg = jax.value_and_grad(sm, argnums=(0, 1))
    got, ops, reduced = sharded(vg, (w, b), xs)
    close(got, ref(jax.value_and_grad(loss, argnums=(0, 1)), (w, b), x), "loss and grads")
    assert ops["all-gather"] == 0, ops
    if full:
      # grad inside the body w.r.t. the replicated (invariant) params: already summed over the devices (the
      # pvary before the conv transposes to a psum), exactly as with lax.conv_general_dilated
      conv_lax = lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                                           dimension_numbers=("NHWC", "HWIO", "NHWC"))
      for body in (lambda l: lambda p, x: jax.grad(l)(p, x),
                   lambda l: lambda p, x: jax.lax.psum(jax.grad(l)(p, x), "data")):
        run = lambda l: ref(jax.shard_map(body(l), mesh=mesh1, in_specs=(P(), P("data")), out_specs=P()),
                            w, xs)
        close(run(lambda p, x: jnp.sum(jnp.sin(conv(x, p)))),
              run(lambda p, x: jnp.sum(jnp.sin(conv_lax(x, p)))), "jaxconv vs lax inside shard_map")
    return {"ops": ops, "all_reduce": reduced}

  # -- explicit mesh axes (jax.make_mesh's default): result types carry the operands' shardings as lax's do ------
  mesh_e = jax.make_mesh((NDEV,), ("data",), axis_types=(AxisType.Explicit,))

  @check("explicit_result_types_as_lax")
  def _():
    cases = [  # (x shape, w shape, dimension numbers, strides, padding, whether to compile the gradients too)
        ((16, 9, 9, 3), (3, 3, 3, 5), ("NHWC", "HWIO", "NHWC"), (1, 1), "SAME", False),
        ((16, 3, 9, 9), (5, 3, 3, 3), ("NCHW", "OIHW", "NCHW"), (2, 2), "VALID", True),
        ((8, 13, 4), (3, 4, 6), ("NWC", "WIO", "NWC"), (1,), [(1, 2)], False),
        ((8, 5, 6, 7, 2), (2, 3, 2, 2, 3), ("NDHWC", "DHWIO", "NDHWC"), (1, 1, 1), "SAME", False),
        ((16, 7), (7, 5), ("NC", "IO", "NC"), (), (), True),
    ]
    types = []
    for xs, ws, dn, st, pad, grads in cases:
      x0, w0 = rnd(*xs), rnd(*ws)
      f = lambda conv: lambda x, w: conv(x, w, st, pad, dimension_numbers=dn)
      g = jax.grad(lambda x, w: jnp.sum(jnp.sin(f(jaxconv.conv_general_dilated)(x, w))), (0, 1))
      want_grads = ref(g, x0, w0) if grads else None
      with jax.set_mesh(mesh_e):
        x, w = put(x0, mesh_e, "data"), put(w0, mesh_e)
        want = jax.jit(f(jax.lax.conv_general_dilated)).trace(x, w).jaxpr.out_avals[0].str_short()
        got = jax.jit(f(jaxconv.conv_general_dilated)).trace(x, w).jaxpr.out_avals[0].str_short()
        assert got == want and "@data" in got, (dn, got, want)
        if grads:  # the cotangents of x and w carry their primals' types, and the values are the unsharded ones
          gx, gw = jax.jit(g)(x, w)
      if grads:
        assert jax.typeof(gx).str_short() == jax.typeof(x).str_short(), (jax.typeof(gx), jax.typeof(x))
        assert jax.typeof(gw).str_short() == jax.typeof(w).str_short(), (jax.typeof(gw), jax.typeof(w))
        close((gx, gw), want_grads, f"grads {dn}")
      types.append(got)
    return types

  @check("explicit_train_step")
  def _():
    x, w1, w2 = rnd(16, 12, 12, 3), rnd(3, 3, 3, 8), rnd(3, 3, 8, 4)

    def step(ws, x):
      def loss(ws):
        h = jax.nn.relu(conv(x, ws[0]))
        return jnp.sum(conv(h, ws[1]) ** 2)
      g = jax.grad(loss)(ws)
      return [w - 1e-3 * gw for w, gw in zip(ws, g)], g

    with jax.set_mesh(mesh_e):
      args = ([put(w1, mesh_e), put(w2, mesh_e)], put(x, mesh_e, "data"))
      got, ops, reduced = sharded(step, *args)
    close(got, ref(step, [w1, w2], x), "step")
    assert ops["all-gather"] == 0, f"activations all-gathered: {ops}"
    assert sum(ops.values()) == ops["all-reduce"] and ops["all-reduce"] <= 2, ops
    return {"ops": ops, "all_reduce": reduced}

  if full:
    # -- a data-parallel ResNet training step (benchmarks/train_step.py), Explicit and Auto axes ------------------
    @check("resnet_step_explicit_and_auto")
    def _():
      sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
      import models
      import train_step as rs
      rng = np.random.default_rng(3)
      images, labels = rng.standard_normal((16, 16, 16, 3)).astype(np.float32), np.arange(16) % 10
      losses = {}
      for axis_type in (AxisType.Explicit, AxisType.Auto):
        mesh = jax.make_mesh((NDEV,), ("data",), axis_types=(axis_type,))
        for backend in ("lax", "jaxconv") if axis_type == AxisType.Explicit else ("jaxconv",):
          model = models.ResNet((1, 1), models.BasicBlock, conv=models.CONV_CLASSES[backend], num_classes=10,
                            dtype=jnp.float32)
          tx = rs.make_optimizer(0.1, 1e-4)
          with jax.set_mesh(mesh):
            variables = jax.device_put(
                model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)), train=False), NamedSharding(mesh, P()))
            state = (variables["params"], variables["batch_stats"], tx.init(variables["params"]))
            x, y = put(images, mesh, "data"), put(labels, mesh, "data")
            step = jax.jit(rs.make_train_step(model, tx))
            state, l1 = step(state, x, y)
            state, l2 = step(state, x, y)
          losses[(str(axis_type), backend)] = (float(l1), float(l2))
      want = losses[(str(AxisType.Explicit), "lax")]  # lax's losses (the same under Auto axes)
      for (mode, backend), got in losses.items():
        assert np.allclose(got, want, rtol=1e-4), (mode, backend, got, want)
        assert got[1] < got[0], (mode, backend, got)  # the step trains
      return {f"{m} {b}": v for (m, b), v in losses.items()}

    # -- channels-first, 1-D, 3-D, groups: grads w.r.t. everything ---------------------------------------
    @check("grads_batch_sharded_layouts")
    def _():
      cases = [
          (lambda x, w: jaxconv.conv2d(x, w, stride=2, padding=1, data_format="channels_first"),
           rnd(8, 3, 9, 9), rnd(4, 3, 3, 3)),
          (lambda x, w: jaxconv.conv1d(x, w, padding="SAME", dilation=2), rnd(16, 20, 4), rnd(5, 4, 6)),
          (lambda x, w: jaxconv.conv3d(x, w), rnd(8, 4, 5, 6, 2), rnd(2, 3, 2, 2, 3)),
          (lambda x, w: jaxconv.conv2d(x, w, groups=2, padding="SAME"), rnd(8, 7, 7, 4), rnd(3, 3, 2, 6)),
      ]
      for i, (f, x, w) in enumerate(cases):
        g = jax.grad(lambda x, w: jnp.sum(jnp.sin(f(x, w))), (0, 1))
        got, ops, reduced = sharded(g, put(x, mesh1, "data"), w)
        close(got, ref(g, x, w), f"case {i}")
        assert ops["all-gather"] == 0 and len(reduced) == 1, (i, ops, reduced)
      return "ok"

    # -- 2-D mesh: data x model --------------------------------------------------------------------------
    @check("data_x_model_2d_mesh")
    def _():
      x, w = rnd(8, 8, 8, 6), rnd(3, 3, 6, 8)
      xs, ws = put(x, mesh2, "data"), put(w, mesh2, None, None, None, "model")
      y, ops, _ = sharded(conv, xs, ws)
      close(y, ref(conv, x, w), "y")
      batch_axis = "data" if NDEV // 2 > 1 else None  # a one-device axis drops out of the spec
      assert tuple(y.sharding.spec) == (batch_axis, None, None, "model") and sum(ops.values()) == 0, (
          y.sharding, ops)
      g = jax.grad(lambda x, w: jnp.sum(jnp.tanh(conv(x, w))), (0, 1))
      got, ops, reduced = sharded(g, xs, ws)
      close(got, ref(g, x, w), "grads")
      # dx summed over the model axis (local batch 8 / data), dw summed over the data axis (local K 8 / 2);
      # a data axis of one device needs no sum
      want_reduced = [f"f32[{8 // (NDEV // 2)},8,8,6]"] + (["f32[3,3,6,4]"] if NDEV // 2 > 1 else [])
      assert ops["all-gather"] == 0 and reduced == sorted(want_reduced), (ops, reduced)
      return {"ops": ops, "all_reduce": reduced}

    # -- shardings the plan replicates: correct answers ------------------------------------------------
    @check("fallbacks_replicate_correctly")
    def _():
      x, w = rnd(8, 8, 8, 8), rnd(3, 3, 8, 8)
      g = jax.grad(lambda x, w: jnp.sum(jnp.cos(conv(x, w))), (0, 1))
      want = ref(g, x, w)
      for spec in [(None, "data"), (None, None, None, "data")]:  # spatial-, channel-sharded x
        close(sharded(g, put(x, mesh1, *spec), w)[0], want, f"x sharded {spec}")
      # grouped channels (depthwise) with K-sharded filters and batch-sharded x
      wd = rnd(3, 3, 1, 8)
      gd = jax.grad(lambda x, w: jnp.sum(jnp.cos(jaxconv.conv2d(x, w, groups=8, padding="SAME"))), (0, 1))
      close(sharded(gd, put(x, mesh1, "data"), put(wd, mesh1, None, None, None, "data"))[0], ref(gd, x, wd),
            "depthwise")
      # batch groups with a batch-sharded lhs (the lax form of a grouped filter gradient)
      fb = lambda conv_fn: lambda x, w: jnp.sum(jnp.cos(conv_fn(
          x, w, (1, 1), "SAME", batch_group_count=2, dimension_numbers=("NHWC", "HWIO", "NHWC"))))
      gb = lambda conv_fn: jax.grad(fb(conv_fn), (0, 1))
      close(sharded(gb(jaxconv.conv_general_dilated), put(x, mesh1, "data"), w)[0],
            ref(gb(jax.lax.conv_general_dilated), x, w), "batch groups")
      return "ok"

    # -- second order and vmap (per-example gradients) on sharded data ----------------------------------
    @check("hvp_and_per_example_grads")
    def _():
      x, w = rnd(8, 6, 6, 3), rnd(3, 3, 3, 4)
      loss = lambda w, x: jnp.sum(jnp.sin(conv(x, w)))
      hvp = lambda w, x, v: jax.jvp(lambda w: jax.grad(loss)(w, x), (w,), (v,))[1]
      v = rnd(*w.shape)
      close(sharded(hvp, w, put(x, mesh1, "data"), v)[0], ref(hvp, w, x, v), "hvp")
      pe = jax.vmap(jax.grad(loss), in_axes=(None, 0))
      close(sharded(pe, w, put(x[:, None], mesh1, "data"))[0], ref(pe, w, x[:, None]), "per-example")
      return "ok"

  for r in results:
    print(REPORT + json.dumps(r), flush=True)


# ---------------------------------------------------------------------------------------------------------
# pytest side.
# ---------------------------------------------------------------------------------------------------------
CORE = ["fwd_batch_sharded", "train_step_batch_sharded", "model_parallel_K", "shard_map_replicated_weights",
        "explicit_result_types_as_lax", "explicit_train_step"]
SHARDY_ONLY = ["resnet_step_explicit_and_auto", "grads_batch_sharded_layouts", "data_x_model_2d_mesh",
               "fallbacks_replicate_correctly", "hvp_and_per_example_grads"]
CASES = [("shardy", c) for c in CORE + SHARDY_ONLY] + [("gspmd", c) for c in CORE]
_results: dict = {}


def _reported(stdout: str) -> dict:
  """A worker's check results by name, from its REPORT lines."""
  return {r["name"]: r for r in (json.loads(l[len(REPORT):]) for l in stdout.splitlines() if l.startswith(REPORT))}


def _run_workers() -> dict:
  """Both workers at once (they are independent): partitioner -> its checks' results, return code and output."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={NDEV}").strip()
  env["JAX_PLATFORMS"] = "cpu"
  env["JAXCONV_SHARD_NDEV"] = str(NDEV)
  procs = {p: subprocess.Popen([sys.executable, __file__, "--worker", p], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for p in ("shardy", "gspmd")}
  runs = {}
  for partitioner, proc in procs.items():
    try:
      stdout, stderr = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
      proc.kill()
      stdout, stderr = proc.communicate()
    runs[partitioner] = {"results": _reported(stdout), "rc": proc.returncode, "stdout": stdout[-3000:],
                         "stderr": stderr[-5000:]}
  return runs


def _run(partitioner: str, tmp_path_factory) -> dict:
  """The workers' output, computed once per test session. Under pytest-xdist the test processes share the
  session's temporary directory: the first to get here runs the workers while holding a lock and writes their
  output there, the others wait on the lock and read it (a run per test process had doubled the workers' CPU time
  in a two-process CI run)."""
  if not _results:
    shared = cu.session_shared_dir(tmp_path_factory)
    path = shared / "sharding_workers.json"
    with open(shared / "sharding_workers.lock", "w") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      if not path.exists():
        path.write_text(json.dumps(_run_workers()))
      _results.update(json.loads(path.read_text()))
  return _results[partitioner]


def _gpu_count():
  try:
    import jaxconv
    if not jaxconv.cuda_available():
      return 0
    import jax
    return len(jax.devices("gpu"))
  except Exception:  # noqa: BLE001
    return 0


@pytest.mark.gpu
@pytest.mark.skipif(_gpu_count() < 2, reason="needs a CUDA build of jaxconv and at least 2 GPUs")
def test_sharded_on_all_gpus():
  """The same checks (Shardy) on every GPU of this machine, through jaxconv's CUDA kernels."""
  n = _gpu_count()
  env = dict(os.environ, JAXCONV_SHARD_NDEV=str(n))
  proc = subprocess.run([sys.executable, __file__, "--worker", "shardy"], env=env, capture_output=True,
                        text=True, timeout=900)
  results = _reported(proc.stdout)
  assert set(results) == set(CORE + SHARDY_ONLY), (proc.returncode, proc.stderr[-3000:])
  bad = [r for r in results.values() if not r["ok"]]
  assert not bad, bad


@pytest.mark.parametrize("partitioner,check", CASES)
def test_sharded(partitioner, check, tmp_path_factory):
  run = _run(partitioner, tmp_path_factory)
  if check not in run["results"]:
    pytest.fail(f"the {partitioner} worker did not report {check!r} (rc={run['rc']}):\n{run['stdout']}\n"
                f"{run['stderr']}")
  r = run["results"][check]
  assert r["ok"], r["info"]


if __name__ == "__main__":
  if len(sys.argv) == 3 and sys.argv[1] == "--worker":
    _worker(sys.argv[2])
  else:
    sys.exit("usage: python tests/test_sharding.py --worker shardy|gspmd")
