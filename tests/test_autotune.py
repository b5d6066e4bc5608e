"""Autotuning (jaxconv/tuning/): candidates, the cache, the mode, and cached variants in lowered programs.

CPU-runnable: the candidates against forced requests (CUDA builds: the predicates run on the host), the cache
(keys, location, atomic store, merge, unreadable files and entries), the mode switch, and, lowered for CUDA with
jax.export on any machine when the extension has CUDA, that a cached variant reaches the params of each op's custom
call (fwd, dgrad and wgrad independently) while mode 'off', forced requests and the CPU lowering ignore the cache.
GPU tests (skipped cleanly without CUDA) time real candidates and check the tuned programs against lax at HIGHEST
in float64.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import conv_utils as cu
import jaxconv
from jaxconv import _native, registry
from jaxconv import algorithms as alg
from jaxconv.tuning import cache as cache_mod

TARGETS = ("jaxconv_fwd", "jaxconv_dgrad", "jaxconv_wgrad")
CHECKS = [export.DisabledSafetyCheck.custom_call(t) for t in TARGETS]
NWC, NHWC = cu.channels_last_dn(1), cu.channels_last_dn(2)
FAKE_KIND = "Fake GPU for lowering tests"
OP_OF_TARGET = {"jaxconv_fwd": "fwd", "jaxconv_dgrad": "dgrad", "jaxconv_wgrad": "wgrad"}
needs_cuda_build = pytest.mark.skipif(not jaxconv.build_info()["cuda"],
                                      reason="lowering for CUDA needs a CUDA build of jaxconv")


def _variant_of(values):
  """The name of the variant a custom call's packed params name (or "handler" when the lowering chose none)."""
  index = values[_native.param_offset("variant")]
  return registry.variant_names()[index] if index >= 0 else "handler"


@pytest.fixture
def cache(tmp_path, monkeypatch):
  """An empty cache directory of the test's own, mode 'off' on entry, the mode restored on exit."""
  monkeypatch.setenv("JAXCONV_CACHE_DIR", str(tmp_path / "cache"))
  previous = jaxconv.set_autotune("off")
  yield tmp_path / "cache" / cache_mod.CACHE_FILE
  jaxconv.set_autotune(previous)


@pytest.fixture
def fake_gpu(monkeypatch):
  """Lowering for CUDA keys the cache on this device_kind (the machine may have no GPU)."""
  monkeypatch.setattr(cache_mod, "gpu_kind", lambda: FAKE_KIND)
  return FAKE_KIND


def _sds(shape, dtype=jnp.float32):
  return jax.ShapeDtypeStruct(shape, dtype)


# ---- the names algorithm= takes -------------------------------------------------------------------------

def test_every_name_is_described_and_auto_comes_first():
  assert list(alg.ALGORITHMS)[0] == "auto"
  assert set(alg.ALGORITHMS) == {"auto", *registry.families(), *registry.variant_names()}
  assert alg.names() == registry.families() + registry.variant_names() and "auto" not in alg.names()
  for name, text in alg.ALGORITHMS.items():
    assert text and "\n" not in text, name


# (conv function, x shape, w shape, dtype, kwargs of conv1d/conv2d)
FORCED_CASES = [
    (jaxconv.conv1d, (2, 64, 1), (5, 1, 1), "float32", dict(padding="SAME")),
    (jaxconv.conv1d, (2, 50, 4), (3, 4, 4), "float32", dict(stride=2)),
    (jaxconv.conv2d, (2, 9, 9, 8), (3, 3, 1, 8), "float32", dict(groups=8, padding="SAME")),
    (jaxconv.conv2d, (2, 9, 9, 16), (3, 3, 16, 32), "bfloat16", dict(padding="SAME")),
    (jaxconv.conv2d, (2, 3, 9, 9), (4, 3, 3, 3), "float32", dict(data_format="channels_first")),
    (jaxconv.conv2d, (1, 9, 9, 8), (3, 3, 8, 8), "float64", dict(dilation=2)),
    (jaxconv.conv2d, (1, 9, 9, 24), (3, 3, 24, 80), "float16", dict(padding=((-1, 2), (1, 1)))),
]


def _forced_fwd_accepted(conv, x, w, kw):
  """The names a forced forward accepts at trace time (the forward's predicates on the default GPU)."""
  accepted = set()
  for name in alg.names():
    try:
      jax.eval_shape(lambda x, w: conv(x, w, algorithm=name, **kw), x, w)
      accepted.add(name)
    except ValueError as e:
      assert "algorithm=" in str(e), e
  return accepted


def _cgd_kwargs(x_shape, kw):
  """conv_general_dilated arguments of a conv1d/conv2d call."""
  ns = len(x_shape) - 2
  first = kw.get("data_format") == "channels_first"
  pad = kw.get("padding", "VALID")
  return dict(window_strides=(kw.get("stride", 1),) * ns,
              padding=pad if isinstance(pad, str) else tuple(pad),
              rhs_dilation=(kw.get("dilation", 1),) * ns,
              dimension_numbers=None if first else cu.channels_last_dn(ns),
              feature_group_count=kw.get("groups", 1))


@pytest.mark.kernels
def test_candidates_are_the_variants_a_forced_call_accepts():
  sizes, rejected = [], 0
  for conv, xs, ws, dtype, kw in FORCED_CASES:
    with cu.enable_x64():
      x, w = _sds(xs, dtype), _sds(ws, dtype)
      problem = alg.problems(x, w, **_cgd_kwargs(xs, kw))["fwd"]
      accepted = _forced_fwd_accepted(conv, x, w, kw)
      cands = problem.candidates()
      # A forced variant without a forward kernel hands the forward to its family, so it is accepted as its family.
      fwd_variants = {v.name for v in registry.variants() if "fwd" in v.ops}
      assert set(cands) == accepted & fwd_variants, (xs, ws, dtype, kw)
      # A family is accepted exactly when one of its variants is.
      families = {v.family for v in registry.variants() if v.name in cands}
      families |= {v.also for v in registry.variants() if v.name in cands and v.also}
      assert accepted & set(registry.families()) == families, (xs, ws, dtype, kw)
    assert "direct.gemm" in cands and "xla.conv" in cands
    assert list(cands) == [n for n in registry.variant_names() if n in accepted & fwd_variants]  # table order
    sizes.append(len(cands))
    rejected += len(registry.variant_names()) - len(cands)
  # The cases exercise both answers of the predicates.
  assert max(sizes) >= 4 and rejected > 0, sizes


@pytest.mark.kernels
def test_candidates_of_the_gradients_use_their_own_dtypes():
  """bf16 inputs with an f32 result: the forward writes f32 from bf16 operands (no tensor-core path: that
  needs the result in the operand type); the gradients run on f32 operands and results (tensor cores apply)."""
  x, w = _sds((2, 8, 8, 16), jnp.bfloat16), _sds((3, 3, 16, 32), jnp.bfloat16)
  probs = alg.problems(x, w, (1, 1), "SAME", dimension_numbers=NHWC, preferred_element_type=jnp.float32)
  assert set(probs) == {"fwd", "dgrad", "wgrad"}
  assert (probs["fwd"].dtype, probs["fwd"].out_dtype) == (np.dtype(jnp.bfloat16), np.dtype(np.float32))
  for op in ("dgrad", "wgrad"):
    assert (probs[op].dtype, probs[op].out_dtype) == (np.dtype(np.float32),) * 2, op
  for op, p in probs.items():
    expect = {n for n in registry.variant_names()
              if registry.resolve(op, p.spec.replace(algorithm=n).ffi_params(2, 16, 32), p.dtype, p.out_dtype).ok}
    assert set(p.candidates()) == expect, op
  tensor_cores = {v.name for v in registry.variants() if v.family == "implicit_gemm"}
  assert not tensor_cores & set(probs["fwd"].candidates()) and tensor_cores & set(probs["dgrad"].candidates())


def test_candidates_rejects_an_unknown_op():
  p = alg.problems(_sds((1, 8, 1)), _sds((3, 1, 1)), (1,), "SAME", dimension_numbers=NWC)["fwd"]
  with pytest.raises(ValueError, match="op must be one of"):
    alg.candidates("forward", p.params, p.dtype)


# ---- cache keys ------------------------------------------------------------------------------------------

BASE = dict(x=(2, 16, 16, 8), w=(3, 3, 8, 16), dtype="float32",
            kw=dict(window_strides=(1, 1), padding="SAME", dimension_numbers=NHWC))


def _key(x=BASE["x"], w=BASE["w"], dtype=BASE["dtype"], op="fwd", kind="GPU A", **changes):
  kw = {**BASE["kw"], **changes}
  return alg.problems(_sds(x, dtype), _sds(w, dtype), **kw)[op].key(kind)


def test_cache_key_is_stable_and_ignores_the_algorithm_debug_and_epilogue_fields():
  p = alg.problems(_sds(BASE["x"]), _sds(BASE["w"]), **BASE["kw"])["fwd"]
  assert _key() == _key() == p.key("GPU A")
  for change in (dict(algorithm="direct"), dict(algorithm="direct.gemm"), dict(poison=True),
                 dict(activation="relu", has_bias=True)):
    variant = dataclasses.replace(p, spec=p.spec.replace(**change))
    assert not np.array_equal(variant.params, p.params), change  # the packed params do differ...
    assert variant.key("GPU A") == p.key("GPU A"), change        # ...the key does not


def test_cache_key_changes_with_every_part_of_the_problem(monkeypatch):
  keys = {
      "base": _key(),
      "batch": _key(x=(3, 16, 16, 8)),
      "spatial": _key(x=(2, 16, 17, 8)),
      "in channels": _key(x=(2, 16, 16, 4), w=(3, 3, 4, 16)),
      "out channels": _key(w=(3, 3, 8, 12)),
      "window": _key(w=(3, 5, 8, 16)),
      "stride": _key(window_strides=(2, 1)),
      "padding": _key(padding="VALID"),
      "rhs dilation": _key(rhs_dilation=(1, 2)),
      "lhs dilation": _key(lhs_dilation=(2, 1), padding=((1, 1), (1, 1))),
      "groups": _key(w=(3, 3, 4, 16), feature_group_count=2),
      "precision": _key(precision="highest"),
      "dtype": _key(dtype="bfloat16"),
      "result dtype": _key(dtype="bfloat16", preferred_element_type=jnp.float32),
      "op dgrad": _key(op="dgrad"),
      "op wgrad": _key(op="wgrad"),
      "gpu": _key(kind="GPU B"),
  }
  monkeypatch.setattr(jaxconv, "__version__", jaxconv.__version__ + ".post1")
  keys["jaxconv version"] = _key()
  assert len(set(keys.values())) == len(keys), {k: v for k, v in keys.items()
                                                if list(keys.values()).count(v) > 1}


# ---- the cache file --------------------------------------------------------------------------------------

def test_cache_location_follows_the_environment(monkeypatch, tmp_path):
  monkeypatch.setenv("JAXCONV_CACHE_DIR", str(tmp_path / "explicit"))
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert cache_mod.cache_path() == str(tmp_path / "explicit" / "autotune.json")
  monkeypatch.delenv("JAXCONV_CACHE_DIR")
  assert cache_mod.cache_path() == str(tmp_path / "xdg" / "jaxconv" / "autotune.json")
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert cache_mod.cache_path() == str(tmp_path / "home" / ".cache" / "jaxconv" / "autotune.json")


def test_store_then_load_in_a_fresh_process(cache):
  key_a, key_b = _key(), _key(op="wgrad")
  cache_mod.store({key_a: {"algorithm": "small", "times_us": {"small": 3.0, "direct": 5.0}}})
  cache_mod.store({key_b: {"algorithm": "direct"}})
  data = json.loads(cache.read_text())
  assert data["format"] == 1
  assert {k: v["algorithm"] for k, v in data["entries"].items()} == {key_a: "small", key_b: "direct"}
  assert data["entries"][key_a]["times_us"] == {"small": 3.0, "direct": 5.0}
  assert cache_mod.lookup(key_a) == "small" and cache_mod.lookup(_key(op="dgrad")) is None
  # Another process reads the file (and takes its mode from JAXCONV_AUTOTUNE).
  code = ("import json, sys, jaxconv; from jaxconv.tuning import cache as c; "
          "print(json.dumps([jaxconv.autotune_mode(), c.lookup(sys.argv[1]), c.lookup(sys.argv[2])]))")
  env = dict(os.environ, JAXCONV_AUTOTUNE="Cache", JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", code, key_a, key_b], env=env, capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 0, out.stderr
  assert json.loads(out.stdout.strip().splitlines()[-1]) == ["cache", "small", "direct"]


def test_store_replaces_the_file_atomically(cache, monkeypatch):
  key_a, key_b = _key(), _key(op="dgrad")
  cache_mod.store({key_a: {"algorithm": "small"}})
  before = cache.read_text()
  real_dump = json.dump

  def dump_then_fail(obj, f, **kw):
    f.write(json.dumps(obj)[:20])  # a partial write...
    raise RuntimeError("interrupted")  # ...then the writer dies

  monkeypatch.setattr(cache_mod.json, "dump", dump_then_fail)
  with pytest.raises(RuntimeError, match="interrupted"):
    cache_mod.store({key_b: {"algorithm": "direct"}})
  monkeypatch.setattr(cache_mod.json, "dump", real_dump)
  assert cache.read_text() == before  # readers never see the partial file
  assert sorted(os.listdir(cache.parent)) == [".autotune.lock", "autotune.json"]  # no temporary left


def test_store_merges_with_entries_another_process_wrote(cache):
  key_a, key_b, key_c = _key(), _key(op="dgrad"), _key(op="wgrad")
  cache_mod.store({key_a: {"algorithm": "small"}})
  data = json.loads(cache.read_text())
  data["entries"][key_c] = {"algorithm": "implicit_gemm"}  # written by another process meanwhile
  cache.write_text(json.dumps(data))
  cache_mod.store({key_b: {"algorithm": "direct"}})
  entries = json.loads(cache.read_text())["entries"]
  assert {k: v["algorithm"] for k, v in entries.items()} == {key_a: "small", key_b: "direct",
                                                           key_c: "implicit_gemm"}


def test_store_rejects_an_unknown_algorithm(cache):
  with pytest.raises(ValueError, match="algorithm"):
    cache_mod.store({_key(): {"algorithm": "winograd"}})
  assert not cache.exists()


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"format": 99, "entries": {}}', "\udcff"])
def test_a_corrupt_cache_file_is_ignored_with_one_warning_and_then_replaced(cache, content):
  key = _key()
  cache.parent.mkdir(parents=True)
  cache.write_bytes(content.encode("utf-8", "surrogateescape"))
  with pytest.warns(UserWarning, match="ignoring the autotuning cache"):
    assert cache_mod.lookup(key) is None
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # the same file again: no second warning
    assert cache_mod.lookup(key) is None
  cache_mod.store({key: {"algorithm": "direct"}})
  assert json.loads(cache.read_text())["entries"][key]["algorithm"] == "direct"


def test_entries_with_unknown_algorithms_are_skipped_with_a_warning(cache):
  good, bad = _key(), _key(op="dgrad")
  cache.parent.mkdir(parents=True)
  cache.write_text(json.dumps({"format": 1, "entries": {good: {"algorithm": "direct"},
                                                        bad: {"algorithm": "winograd"}}}))
  with pytest.warns(UserWarning, match="winograd"):
    assert cache_mod.lookup(good) == "direct" and cache_mod.lookup(bad) is None


@pytest.mark.parametrize("entry", [{"algorithm": ["direct"]}, {"algorithm": {"a": 1}}, {"algorithm": None}, [1],
                                   "direct"])
def test_entries_of_the_wrong_shape_are_skipped_with_a_warning(cache, entry):
  good, bad = _key(), _key(op="dgrad")
  cache.parent.mkdir(parents=True)
  cache.write_text(json.dumps({"format": 1, "entries": {good: {"algorithm": "direct"}, bad: entry}}))
  with pytest.warns(UserWarning, match="algorithms this jaxconv does not have"):
    assert cache_mod.lookup(good) == "direct" and cache_mod.lookup(bad) is None


def test_deeply_nested_cache_content_is_ignored_with_a_warning(cache):
  cache.parent.mkdir(parents=True)
  cache.write_text('{"format": 1, "entries": ' + "[" * 100000 + "]" * 100000 + "}")
  with pytest.warns(UserWarning, match="RecursionError"):
    assert cache_mod.lookup(_key()) is None


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
def test_a_cache_path_that_is_a_fifo_is_ignored_without_blocking(cache):
  cache.parent.mkdir(parents=True)
  os.mkfifo(cache)  # opening it for reading would block until a writer came
  with pytest.warns(UserWarning, match="not a regular file"):
    assert cache_mod.lookup(_key()) is None


# ---- the mode switch -------------------------------------------------------------------------------------

def test_set_autotune_returns_the_previous_mode_and_validates(cache):
  assert jaxconv.autotune_mode() == "off"
  assert jaxconv.set_autotune("cache") == "off"
  assert jaxconv.autotune_mode() == "cache"
  assert jaxconv.set_autotune("ON") == "cache"
  assert jaxconv.autotune_mode() == "on"
  with pytest.raises(ValueError, match=r"set_autotune: mode must be one of 'off', 'cache', 'on'"):
    jaxconv.set_autotune("always")
  assert jaxconv.autotune_mode() == "on"


def test_environment_mode_parsing():
  assert cache_mod._mode_from_env(None) == cache_mod._mode_from_env("") == "off"
  assert cache_mod._mode_from_env(" Cache ") == "cache" and cache_mod._mode_from_env("on") == "on"
  with pytest.warns(UserWarning, match="JAXCONV_AUTOTUNE"):
    assert cache_mod._mode_from_env("1") == "off"


# ---- cached choices in the lowered CUDA custom calls -----------------------------------------------------

X1, W1 = _sds((2, 64, 1)), _sds((5, 1, 1))  # c == k == 1: direct, depthwise, long1d and small variants apply
KW1 = dict(window_strides=(1,), padding="SAME", dimension_numbers=NWC)


def _loss(x, w):
  return jnp.sum(jaxconv.conv_general_dilated(x, w, **KW1) ** 2)


def _lowered_variants(fn, *args, platform="cuda"):
  """{op: [variant name of each custom call]} of fn's gradient program lowered for `platform` ("handler": the
  lowering chose none, as for the CPU)."""
  fresh = lambda *a: fn(*a)  # a new function: nothing comes from jit's caches of an earlier lowering
  exp = export.export(jax.jit(jax.value_and_grad(fresh, argnums=(0, 1))), platforms=[platform],
                      disabled_checks=CHECKS)(*args)
  found = {}
  for m in re.finditer(r"custom_call @(jaxconv_\w+)\(.*?params = dense<\[([-\d, ]+)\]>", exp.mlir_module()):
    values = [int(v) for v in m.group(2).split(",")]
    found.setdefault(OP_OF_TARGET[m.group(1)], []).append(_variant_of(values))
  assert set(found) == {"fwd", "dgrad", "wgrad"}, found
  return found


def _auto_choices(probs):
  """The variant auto runs for each op (on the GPU the lowering compiles for)."""
  return {op: registry.resolve(op, p.params, p.dtype, p.out_dtype).name for op, p in probs.items()}


def _distinct_choices():
  """A different variant for each op of the X1/W1 problem, none of them auto's, from its candidates; and auto's."""
  probs = alg.problems(X1, W1, **KW1)
  auto = _auto_choices(probs)
  choice = {}
  for op in ("fwd", "dgrad", "wgrad"):
    cands = [n for n in probs[op].candidates()
             if n not in (auto[op], "xla.conv") and n not in choice.values()]
    assert cands, (op, probs[op].candidates())
    choice[op] = cands[0]
  return probs, choice, auto


@needs_cuda_build
def test_cached_choices_reach_each_ops_cuda_custom_call(cache, fake_gpu):
  probs, choice, auto = _distinct_choices()
  as_auto = {op: [name] for op, name in auto.items()}
  assert _lowered_variants(_loss, X1, W1) == as_auto  # nothing cached yet
  cache_mod.store({probs[op].key(fake_gpu): {"algorithm": name} for op, name in choice.items()})
  assert _lowered_variants(_loss, X1, W1) == as_auto  # mode 'off'
  jaxconv.set_autotune("cache")
  assert _lowered_variants(_loss, X1, W1) == {op: [name] for op, name in choice.items()}
  if not jaxconv.cuda_available():  # (with a GPU, mode 'on' would time this problem for the real device)
    jaxconv.set_autotune("on")  # 'on' uses the cache too
    assert _lowered_variants(_loss, X1, W1) == {op: [name] for op, name in choice.items()}


@needs_cuda_build
@pytest.mark.parametrize("only", ["fwd", "dgrad", "wgrad"])
def test_one_cached_op_leaves_the_others_to_auto(cache, fake_gpu, only):
  probs, choice, auto = _distinct_choices()
  cache_mod.store({probs[only].key(fake_gpu): {"algorithm": choice[only]}})
  jaxconv.set_autotune("cache")
  expect = {op: [choice[op] if op == only else auto[op]] for op in choice}
  assert _lowered_variants(_loss, X1, W1) == expect


@needs_cuda_build
def test_cache_is_keyed_on_the_gpu_of_the_lowering(cache, fake_gpu, monkeypatch):
  probs, choice, auto = _distinct_choices()
  cache_mod.store({probs[op].key("Another GPU"): {"algorithm": name} for op, name in choice.items()})
  jaxconv.set_autotune("cache")
  assert _lowered_variants(_loss, X1, W1) == {op: [name] for op, name in auto.items()}
  monkeypatch.setattr(cache_mod, "gpu_kind", lambda: None)  # no GPU at all: nothing to key on
  cache_mod.store({probs[op].key(fake_gpu): {"algorithm": name} for op, name in choice.items()})
  assert _lowered_variants(_loss, X1, W1) == {op: [name] for op, name in auto.items()}


@needs_cuda_build
def test_forced_algorithms_and_the_cpu_lowering_ignore_the_cache(cache, fake_gpu):
  probs, choice, _ = _distinct_choices()
  cache_mod.store({probs[op].key(fake_gpu): {"algorithm": name} for op, name in choice.items()})
  jaxconv.set_autotune("cache")
  forced = lambda x, w: jnp.sum(jaxconv.conv1d(x, w, padding="SAME", algorithm="direct") ** 2)
  assert _lowered_variants(forced, X1, W1) == {op: ["direct.gemm"] for op in choice}
  assert _lowered_variants(_loss, X1, W1, platform="cpu") == {op: ["handler"] for op in choice}


@needs_cuda_build
def test_fused_epilogue_uses_the_entry_of_its_convolution(cache, fake_gpu):
  """conv1d(x, w, bias, activation=...) shares the key of the plain convolution (what autotune tunes)."""
  probs, choice, _ = _distinct_choices()
  cache_mod.store({probs[op].key(fake_gpu): {"algorithm": name} for op, name in choice.items()})
  jaxconv.set_autotune("cache")
  b = jnp.zeros((1,), jnp.float32)
  fused = lambda x, w: jnp.sum(jaxconv.conv1d(x, w, b, padding="SAME", activation="relu") ** 2)
  assert _lowered_variants(fused, X1, W1) == {op: [name] for op, name in choice.items()}


@needs_cuda_build
def test_a_cached_choice_that_no_longer_applies_is_ignored_with_a_warning(cache, fake_gpu):
  x, w = _sds((2, 64, 2)), _sds((5, 2, 3))  # c != k: no depthwise variant applies
  kw = dict(window_strides=(1,), padding="SAME", dimension_numbers=NWC)
  probs = alg.problems(x, w, **kw)
  assert "depthwise.tiled" not in probs["fwd"].candidates()
  cache_mod.store({probs["fwd"].key(fake_gpu): {"algorithm": "depthwise.tiled"}})
  jaxconv.set_autotune("cache")
  with pytest.warns(UserWarning, match="ignoring the cached algorithm 'depthwise.tiled'"):
    found = _lowered_variants(lambda x, w: jnp.sum(jaxconv.conv_general_dilated(x, w, **kw) ** 2), x, w)
  assert found["fwd"] == [_auto_choices(probs)["fwd"]]


# ---- without a GPU -----------------------------------------------------------------------------------------

no_gpu = pytest.mark.skipif(jaxconv.cuda_available(), reason="checks the behaviour without a GPU")


@no_gpu
def test_autotune_refuses_without_a_gpu(cache):
  with pytest.raises(RuntimeError, match="autotune: .*(GPU|CUDA)"):
    jaxconv.autotune(X1, W1, **KW1)
  assert not cache.exists()


@no_gpu
def test_mode_on_without_a_gpu_times_nothing(cache, rng):
  x = jnp.asarray(cu.randn(rng, X1.shape, np.float32))
  w = jnp.asarray(cu.randn(rng, W1.shape, np.float32))
  off = jax.jit(jax.grad(_loss, argnums=(0, 1)))(x, w)
  jaxconv.set_autotune("on")
  on = jax.jit(jax.grad(lambda *a: _loss(*a), argnums=(0, 1)))(x, w)
  for a, b in zip(on, off):
    cu.assert_close(a, b, 0.0, "mode on vs off on the CPU")
  assert not cache.exists()


def test_autotune_argument_errors(cache):
  with pytest.raises(ValueError, match="autotune: ops must be"):
    jaxconv.autotune(X1, W1, **KW1, ops=("fwd", "backward"))
  with pytest.raises(ValueError, match="autotune: .*feature"):
    jaxconv.autotune(_sds((2, 64, 3)), W1, **KW1)


# ---- on a GPU ----------------------------------------------------------------------------------------------

def _custom_call_variants(text):
  found = {}
  for m in re.finditer(r"custom_call @(jaxconv_\w+)\(.*?params = dense<\[([-\d, ]+)\]>", text):
    values = [int(v) for v in m.group(2).split(",")]
    found.setdefault(OP_OF_TARGET[m.group(1)], []).append(_variant_of(values))
  return found


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,precision", [("float32", "highest"), ("bfloat16", None)])
def test_autotune_picks_the_fastest_candidate_and_the_tuned_program_matches_lax(cache, rng, dtype, precision):
  xs, ws = (4, 24, 24, 16), (3, 3, 16, 32)  # direct, small and tensor-core variants all apply
  kw = dict(window_strides=(1, 1), padding="SAME", dimension_numbers=NHWC, precision=precision)
  x, w = (jnp.asarray(cu.randn(rng, s, dtype)) for s in (xs, ws))
  result = jaxconv.autotune(_sds(xs, x.dtype), _sds(ws, w.dtype), **kw)
  probs = alg.problems(x, w, **kw)
  kind = jax.devices("gpu")[0].device_kind
  assert set(result) == {"fwd", "dgrad", "wgrad"}
  for op, r in result.items():
    cands = probs[op].candidates()
    assert len(cands) >= 2 and r.winner in cands, (op, cands, r)
    assert r.source == "timed" and set(r.times_us) | set(r.errors) == set(cands), r
    assert r.winner == min(r.times_us, key=r.times_us.get) and all(t > 0 for t in r.times_us.values()), r
    assert cache_mod.lookup(probs[op].key(kind)) == r.winner
  assert str(result).count("\n") == 2

  jaxconv.set_autotune("cache")
  ct = jnp.asarray(cu.randn(rng, (4, 24, 24, 32), dtype))
  f = lambda x, w: jaxconv.conv_general_dilated(x, w, **kw)
  g = jax.jit(lambda x, w, ct: (f(x, w), *jax.vjp(f, x, w)[1](ct)))
  # A winner that is XLA's own convolution lowers to no custom call.
  expect = {op: [r.winner] for op, r in result.items() if r.winner != "xla.conv"}
  assert _custom_call_variants(g.lower(x, w, ct).as_text()) == expect
  y, dx, dw = g(x, w, ct)
  tol = 3e-5 if dtype == "float32" else cu.tolerance(dtype)  # 3xTF32 on the tensor-core path: about FP32
  ref_kw = {k: v for k, v in kw.items() if k != "precision"}
  cu.assert_close(y, cu.lax_ref_conv(x, w, **ref_kw), tol, "fwd")
  rdx, rdw = cu.lax_ref_conv_vjp(x, w, ct, **ref_kw)
  cu.assert_close(dx, rdx, tol, "dgrad")
  cu.assert_close(dw, rdw, tol, "wgrad")
  # Asked again with reuse_cache, nothing is timed.
  again = jaxconv.autotune(x, w, **kw, reuse_cache=True)
  assert {op: (r.winner, r.source) for op, r in again.items()} == {op: (r.winner, "cache") for op, r in result.items()}


@pytest.mark.gpu
def test_mode_on_tunes_while_tracing_and_the_gradient_matches_lax(cache, rng):
  xs, ws = (2, 20, 20, 8), (3, 3, 8, 8)
  kw = dict(window_strides=(1, 1), padding="SAME", dimension_numbers=NHWC, precision="highest")
  x, w, ct = (cu.to_gpu(cu.randn(rng, s, np.float32)) for s in (xs, ws, xs))
  probs = alg.problems(x, w, **kw)
  kind = jax.devices("gpu")[0].device_kind
  jaxconv.set_autotune("on")
  f = lambda x, w: jaxconv.conv_general_dilated(x, w, **kw)
  g = jax.jit(lambda x, w, ct: (f(x, w), *jax.vjp(f, x, w)[1](ct)))
  lowered = g.lower(x, w, ct)  # tracing times the three ops and stores the winners
  chosen = {op: cache_mod.lookup(p.key(kind)) for op, p in probs.items()}
  assert all(chosen[op] in probs[op].candidates() for op in chosen), chosen
  assert _custom_call_variants(lowered.as_text()) == {op: [n] for op, n in chosen.items() if n != "xla.conv"}
  y, dx, dw = lowered.compile()(x, w, ct)
  ref_kw = {k: v for k, v in kw.items() if k != "precision"}
  cu.assert_close(y, cu.lax_ref_conv(x, w, **ref_kw), 3e-5, "fwd")
  rdx, rdw = cu.lax_ref_conv_vjp(x, w, ct, **ref_kw)
  cu.assert_close(dx, rdx, 3e-5, "dgrad")
  cu.assert_close(dw, rdw, 3e-5, "wgrad")
