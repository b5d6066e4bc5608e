"""The benchmark harness's random sweep: its generator (determinism, the stated distribution, lax accepts every
case), its statistics, its command line, and a tiny run end to end on the CPU."""

import collections
import json
import math
import os
import re
import shlex
import subprocess
import sys
import threading

import jax
import numpy as np
import pytest
from jax import lax

from jaxconv.bench import cli, stats, sweep, sweep_run, sweep_timing

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DRAWS = 2000


@pytest.fixture(scope="module")
def many_cases():
  return sweep.draw_cases(_DRAWS, seed=11, scale="full")


def test_the_generator_is_deterministic_per_seed_and_differs_across_seeds():
  a = sweep.draw_cases(20, seed=4)
  assert a == sweep.draw_cases(20, seed=4)
  # Case i depends on (seed, i) alone: a longer sweep starts with the shorter one, and one case replays alone.
  assert sweep.draw_cases(25, seed=4)[:20] == a
  assert sweep.draw_case(4, 13) == a[13]
  others = [sweep.draw_cases(20, seed=s) for s in (5, -4, 2**70)]
  for b in others:
    assert sum(x.short() != y.short() for x, y in zip(a, b)) >= 15


def _independent_lax_shape(case):
  """The output shape lax.conv_general_dilated gives for the case, from its fields (not the harness's kwargs)."""
  sp = "DHW"[3 - case.nd:]
  dn = ("N" + sp + "C", sp + "IO", "N" + sp + "C") if case.layout == "channels_last" else \
       ("NC" + sp, "OI" + sp, "NC" + sp)
  n, c, k, g = case.batch, case.in_channels, case.out_channels, case.groups
  if case.layout == "channels_last":
    x, w = (n, *case.spatial, c), (*case.filter, c // g, k)
  else:
    x, w = (n, c, *case.spatial), (k, c // g, *case.filter)
  out = jax.eval_shape(
      lambda a, b: lax.conv_general_dilated(a, b, window_strides=case.stride, padding=case.padding,
                                            rhs_dilation=case.dilation, dimension_numbers=dn,
                                            feature_group_count=g),
      jax.ShapeDtypeStruct(x, np.float32), jax.ShapeDtypeStruct(w, np.float32))
  return dn, out.shape


def _frac(values, pred):
  return sum(1 for v in values if pred(v)) / len(values)


def test_draws_follow_the_stated_distribution(many_cases):
  cs = many_cases
  tol = 0.035  # about 3.5 standard deviations of a fraction near 0.5 over 2000 draws
  for nd, w in sweep.ND_WEIGHTS.items():
    assert abs(_frac(cs, lambda c: c.nd == nd) - w) < tol, nd
  assert abs(_frac(cs, lambda c: c.layout == "channels_first") - sweep.CHANNELS_FIRST_FRACTION) < tol
  kinds = collections.Counter(sweep.case_kind(c) for c in cs)
  for kind, w in sweep.KIND_WEIGHTS.items():
    assert abs(kinds[kind] / len(cs) - w) < tol, (kind, kinds)

  by_kind = {k: [c for c in cs if sweep.case_kind(c) == k] for k in sweep.KIND_WEIGHTS}
  assert all(c.groups == 1 and c.in_channels >= 5 for c in by_kind["dense"])
  assert all(c.groups == c.in_channels and c.out_channels in (c.in_channels, 2 * c.in_channels)
             for c in by_kind["depthwise"])
  assert all(1 < c.groups <= c.in_channels // 2 and c.in_channels % c.groups == 0 and c.out_channels % c.groups == 0
             for c in by_kind["grouped"])
  first = by_kind["first_layer"]
  assert all(c.groups == 1 and c.out_channels <= sweep.FIRST_LAYER_MAX_OUT for c in first)
  assert {c.in_channels for c in first} == {1, 2, 3, 4}

  # Channel counts: both round ones and arbitrary ones, every round one appearing.
  counts = [c.in_channels for c in cs if sweep.case_kind(c) != "first_layer"]
  counts += [c.out_channels for c in cs if sweep.case_kind(c) in ("dense", "grouped")]
  round_frac = _frac(counts, lambda v: v in sweep.ROUND_CHANNELS)
  assert 0.55 < round_frac < 0.85, round_frac
  assert set(sweep.ROUND_CHANNELS) <= set(counts)
  arbitrary = {v for v in counts if v not in sweep.ROUND_CHANNELS}
  assert len(arbitrary) > 50 and min(arbitrary) >= 5 and max(arbitrary) <= 200

  # Filters 1-7 (1-D up to 64, some longer than 7); strides 1-2; dilations 1-4, mostly 1; batch 1-32.
  assert all(max(c.filter) <= 7 for c in cs if c.nd > 1)
  assert all(max(c.filter) <= 64 for c in cs if c.nd == 1) and any(c.filter[0] > 7 for c in cs if c.nd == 1)
  assert {s for c in cs for s in c.stride} == {1, 2} and 0.15 < _frac(cs, lambda c: max(c.stride) == 2) < 0.45
  dil = [max(c.dilation) for c in cs]
  assert set(dil) == {1, 2, 3, 4} and _frac(dil, lambda d: d == 1) > 0.8
  assert {c.batch for c in cs} <= set(range(1, 33)) and {1, 32} <= {c.batch for c in cs}
  modes = collections.Counter(sweep.case_padding_mode(c) for c in cs)
  assert set(modes) == {"SAME", "VALID", "symmetric", "causal", "asymmetric"}, modes
  assert any(lo != hi for c in cs for lo, hi in c.padding)

  # Every case is a plausible layer: within the work and memory bounds, and one that lax accepts.
  full = sweep.SCALES["full"]
  for c in cs:
    assert full.min_flops <= c.flops("fwd") <= full.max_flops, c.short()
    assert sweep.fwdbwd_bytes(c) <= full.max_bytes, c.short()
    dn, shape = _independent_lax_shape(c)
    assert shape == c.shapes()[2], c.short()
    assert dn == c.dimension_numbers()
  # Sizes fit the channels: the widest layers see smaller images than the narrowest.
  side = lambda c: math.prod(c.spatial) ** (1 / c.nd)
  wide = [side(c) for c in cs if c.nd == 2 and max(c.in_channels, c.out_channels) >= 256]
  narrow = [side(c) for c in cs if c.nd == 2 and max(c.in_channels, c.out_channels) <= 16]
  assert np.median(wide) * 4 < np.median(narrow)


def test_the_tiny_scale_keeps_cpu_cases_small():
  tiny = sweep.SCALES["tiny"]
  for c in sweep.draw_cases(200, seed=2, scale="tiny"):
    assert tiny.min_flops <= c.flops("fwd") <= tiny.max_flops and c.batch <= tiny.max_batch
    assert sweep.fwdbwd_bytes(c) <= tiny.max_bytes


def test_the_doc_states_the_generators_distribution():
  with open(os.path.join(_ROOT, "docs", "sweep.md")) as f:
    doc = f.read()
  assert sweep.distribution_markdown() in doc
  # The numbers the statement is made of come from the constants.
  assert "1-D 25%, 2-D 60%, 3-D 15%" in doc and "channels-first (NCW / NCHW / NCDHW" in doc


def test_ratio_summary_on_known_ratios():
  r = [0.5, 1.0, 2.0, 4.0]
  s = stats.ratio_summary(r)
  assert s["n"] == 4 and s["min"] == 0.5 and s["max"] == 4.0
  assert s["median"] == pytest.approx(1.5)
  assert s["p10"] == pytest.approx(0.65)  # rank 0.3 between 0.5 and 1.0
  assert s["geomean"] == pytest.approx(math.sqrt(2.0))
  assert (s["below_0_7"], s["below_0_9"], s["at_least_1"]) == (1, 1, 3)
  v = list(np.random.default_rng(0).lognormal(0.0, 1.0, 101))
  s = stats.ratio_summary(v)
  assert s["p10"] == pytest.approx(np.percentile(v, 10)) and s["median"] == pytest.approx(np.median(v))
  assert s["geomean"] == pytest.approx(np.exp(np.mean(np.log(v)))) and s["min"] == min(v)
  with pytest.raises(ValueError):
    stats.ratio_summary([1.0, 0.0])


def _tiny_sweep(out, *extra):
  return subprocess.run([sys.executable, "-m", "jaxconv.bench", "--sweep", "2", "--seed", "5", "--repeats", "3",
                         "--sweep-scale", "tiny", "--out", str(out), *extra], capture_output=True, text=True,
                        timeout=600)


def test_a_tiny_sweep_runs_end_to_end(tmp_path):
  """On the default backend, as the subprocess sees it: the CPU here, the GPU on the device machine."""
  from jaxconv import registry
  on_gpu = jax.default_backend() == "gpu"
  proc = _tiny_sweep(tmp_path)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  res = json.loads((tmp_path / "results.json").read_text())
  assert res["meta"]["seed"] == 5 and res["meta"]["scale"] == "tiny" and len(res["cases"]) == 2
  ratios = {}
  for case, drawn in zip(res["cases"], sweep.draw_cases(2, seed=5, scale="tiny")):
    cfg = case["config"]
    assert cfg["spec"] == drawn.short() and cfg["lax_args"]["dimension_numbers"] == list(drawn.dimension_numbers())
    assert cfg["x_shape"] == list(drawn.shapes()[0]) and cfg["lax_args"]["feature_group_count"] == drawn.groups
    assert [(m["dtype"], m["op"]) for m in case["measurements"]] == [("bfloat16", "fwd+bwd"), ("float32", "fwd+bwd")]
    for m in case["measurements"]:
      assert m["precision"] == "DEFAULT"
      lx, jc = m["impls"]["lax"]["time_s"], m["impls"]["jaxconv"]["time_s"]
      assert lx > 0 and jc > 0 and m["ratio"] == pytest.approx(lx / jc)
      assert len(m["impls"]["lax"]["samples_s"]) == m["repeats"] == 3
      assert not m["mismatch"] and m["rel_err"] < 1e-2
      if on_gpu:  # the lowering's choice per op: a registry variant or XLA's floor
        assert set(m["variants"]) == {"fwd", "dgrad", "wgrad"}
        assert set(m["variants"].values()) <= set(registry.variant_names()), m["variants"]
      else:
        assert m["variants"] is None  # the CPU handlers have one kernel set: no variant to record
      ratios.setdefault(m["dtype"], []).append(m["ratio"])
  for dt, v in ratios.items():
    s = res["summary"][f"{dt} fwd+bwd"]
    assert s["n"] == 2 and s["failed"] == 0
    assert s["geomean"] == pytest.approx(math.sqrt(v[0] * v[1])) and s["min"] == pytest.approx(min(v))
  assert res["summary"]["all"]["n"] == 4
  assert len(res["recheck"]) == 1 and res["recheck"][0]["ratio"] == pytest.approx(min(sum(ratios.values(), [])))

  md = (tmp_path / "results.md").read_text()
  assert "| dtype op | n | min | p10 | median | geomean |" in md and "## Failures (0)" in md
  assert sweep.distribution_markdown() in md and "scale 'tiny'" in md
  assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert proc.stdout.splitlines()[-1].startswith("wrote ")

  # The printed replay command names the same case: run it with --list (no timing).
  replay = re.search(r"^(python -m jaxconv\.bench --sweep-case .*?)\s+# 1$", md, re.M).group(1)
  listed = subprocess.run([sys.executable, *shlex.split(replay)[1:], "--list"], capture_output=True, text=True,
                          check=True).stdout
  worst = min((m["ratio"], c["config"]["spec"]) for c in res["cases"] for m in c["measurements"])
  assert worst[1] in listed


@pytest.mark.kernels
def test_measurements_name_the_variants_auto_runs_on_a_gpu():
  """On a GPU each measurement records what auto runs per op (the lowering's choice), and the worst-case table shows
  it; the CUDA build answers for a default Hopper here."""
  from jaxconv.bench import cases, sweep_report
  resnet = cases.parse_case_spec("8:56x56:64->64:3x3:p1x1", [])
  grouped = cases.parse_case_spec("4:28x28:256->256:3x3:p1x1:g32", [])
  got = sweep_run.variants_of(resnet, "bfloat16", "fwd+bwd", gpu=True)
  assert got == dict.fromkeys(("fwd", "dgrad", "wgrad"), "implicit_gemm.sm90"), got
  assert sweep_run.variants_of(grouped, "bfloat16", "wgrad", gpu=True) == {"wgrad": "xla.conv"}
  assert sweep_run.variants_of(resnet, "bfloat16", "fwd+bwd", gpu=False) is None
  cell = sweep_report.variants_cell({"fwd": "implicit_gemm.sm90", "dgrad": "xla.conv"})
  assert cell == "fwd implicit_gemm.sm90, dgrad xla.conv" and sweep_report.variants_cell(None) == "-"


def test_programs_with_xla_convolutions_compile_after_lax_on_its_thread(monkeypatch):
  """XLA's convolutions autotune on the device: lax's and any other side's that hold some compile one after
  another on one thread, lax's first; host-only programs compile on the other thread."""
  events = []
  real = sweep_timing._Program.compile

  def compile_and_record(self, options):
    events.append((self.impl, self.dtype, self.op, threading.current_thread().name))
    return real(self, options)

  real_impl = sweep_timing._impl_fn
  # A side whose program holds XLA's convolution, as auto's floor lowers on a GPU (on the CPU jaxconv's requests
  # all run its CPU kernels).
  floor_like = lambda name: real_impl("lax" if name == "floor" else name)
  monkeypatch.setattr(sweep_timing._Program, "compile", compile_and_record)
  monkeypatch.setattr(sweep_timing, "_impl_fn", floor_like)
  case = sweep.draw_case(5, 0, "tiny")
  impls = ("lax", "jaxconv", "floor")
  progs = sweep_timing.compile_case(case, ("bfloat16", "float32"), ("fwd",), 1, impls=impls)
  try:
    assert all(p.error is None and p.compiled is not None for p in progs.values())
    assert sorted(e[:3] for e in events) == sorted(progs)
    lax_thread = {t for i, _, _, t in events if i == "lax"}
    assert len(lax_thread) == 1
    on_it = [i for i, _, _, t in events if t in lax_thread]
    assert on_it == ["lax", "lax", "floor", "floor"]
    assert all(t not in lax_thread for i, _, _, t in events if i == "jaxconv")
  finally:
    sweep_timing.release(progs)


def test_a_failing_side_is_reported_not_dropped(tmp_path, monkeypatch, capsys):
  real = sweep_timing._impl_fn

  def broken(name):
    if name == "jaxconv":
      def conv(*args, **kwargs):
        raise ValueError("no kernel for this case")
      return conv
    return real(name)
  monkeypatch.setattr(sweep_timing, "_impl_fn", broken)
  rc = cli.run(["--sweep", "1", "--seed", "1", "--repeats", "3", "--no-plots", "--out", str(tmp_path)])
  assert rc == 1
  res = json.loads((tmp_path / "results.json").read_text())
  (case,) = res["cases"]
  assert len(case["measurements"]) == 2
  for m in case["measurements"]:
    assert "ratio" not in m and "no kernel for this case" in m["impls"]["jaxconv"]["error"]
    assert m["impls"]["lax"]["time_s"] > 0
  assert res["summary"]["all"]["failed"] == 2 and res["summary"]["all"]["n"] == 0
  md = (tmp_path / "results.md").read_text()
  assert "## Failures (2)" in md and md.count("no kernel for this case") == 2
  assert re.search(r"^all\s+0 .* 2$", capsys.readouterr().out, re.M)


def test_the_budget_bounds_the_run_and_unmeasured_cases_are_reported(tmp_path, capsys):
  rc = cli.run(["--sweep", "3", "--seed", "1", "--budget", "0", "--no-plots", "--out", str(tmp_path)])
  assert rc == 0
  res = json.loads((tmp_path / "results.json").read_text())
  assert res["meta"]["skipped_indices"] == [0, 1, 2]
  assert all(c["skipped"] == "budget" and c["measurements"] == [] for c in res["cases"])
  assert "3 of 3 cases not measured: the budget ran out" in (tmp_path / "results.md").read_text()
  assert "NOT MEASURED (budget): 3 cases" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--sweep", "0"], "--sweep N needs N >= 1"),
    (["--sweep", "3", "--sweep-case", "1"], "exclusive"),
    (["--sweep-case", "x"], "--sweep-case takes case indices"),
    (["--sweep-case", "-1"], "non-negative"),
    (["--sweep", "3", "--case", "2:9x9:4->4:3x3"], "--case cannot be combined with --sweep"),
    (["--sweep", "3", "--dtypes", "float8"], "unknown dtype 'float8'"),
    (["--sweep", "3", "--ops", "backward"], "unknown op 'backward'"),
    (["--sweep", "3", "--budget", "-1"], "--budget must be >= 0"),
    (["--sweep", "3", "--sweep-scale", "huge"], "--sweep-scale must be one of full, tiny, got 'huge'"),
    (["--sweep-scale", "tiny", "--quick"], "--sweep-scale needs --sweep or --sweep-case"),
])
def test_bad_sweep_arguments_are_refused_clearly(argv, message, capsys):
  with pytest.raises(SystemExit) as e:
    cli.run(argv)
  assert e.value.code == 2
  assert message in capsys.readouterr().err


def test_replay_command_and_config_carry_the_full_call():
  from jaxconv.bench import sweep_report
  case = sweep.draw_case(3, 7)
  cfg = sweep_report.config_json(case)
  assert cfg["lax_args"]["dimension_numbers"] == list(case.dimension_numbers())
  assert cfg["lax_args"]["padding"] == [list(p) for p in case.padding]
  assert cfg["lax_args"]["rhs_dilation"] == list(case.dilation) and cfg["w_shape"] == list(case.shapes()[1])
  cmd = sweep_report.replay_command(3, 7, "full", "float32", "fwd+bwd")
  args = cli.build_parser().parse_args(shlex.split(cmd)[3:])
  assert (args.sweep_case, args.seed, args.sweep_scale, args.dtypes, args.ops) == ("7", 3, "full", "float32", "fwdbwd")
  slope = shlex.split(sweep_report.slope_command(case, "bfloat16", "fwd"))
  from jaxconv.bench import cases
  again = cases.parse_case_spec(slope[slope.index("--case") + 1])
  assert again.shapes() == case.shapes() and again.dimension_numbers() == case.dimension_numbers()
  assert (again.stride, again.padding, again.dilation, again.groups) == (case.stride, case.padding, case.dilation,
                                                                         case.groups)
  assert sweep_run.DEFAULT_DTYPES == ("bfloat16", "float32")


@pytest.mark.parametrize("on_host", [True, False])
def test_input_sets_are_random_normal_distinct_and_reproducible(on_host, monkeypatch):
  """Both ways of making inputs (numpy for small sets, a jitted generator for large ones) give the shapes and dtypes
  of the case, normal data (never zeros), distinct sets, and the same data again for the same seed."""
  if not on_host:
    monkeypatch.setattr(sweep_timing, "HOST_GEN_LIMIT", 0)
  case = sweep.draw_case(0, 2, "tiny")
  make = lambda seed: sweep_timing.InputSets(case, ("bfloat16", "float32"), 3, data_seed=seed)
  assert make(1).on_host == on_host
  sets = make(1).get()
  for dt in ("bfloat16", "float32"):
    assert len(sets[dt]) == 3
    for s in sets[dt]:
      assert [a.shape for a in s] == [tuple(v) for v in case.shapes()] and all(a.dtype == dt for a in s)
    x = [np.asarray(s[0], np.float32) for s in sets[dt]]
    assert 0.9 < np.std(x[0]) < 1.1 and abs(np.mean(x[0])) < 0.1
    assert not np.array_equal(x[0], x[1]) and not np.array_equal(x[1], x[2])
  np.testing.assert_array_equal(np.asarray(make(1).get()["float32"][2][1]), np.asarray(sets["float32"][2][1]))
  assert not np.array_equal(np.asarray(make(2).get()["float32"][0][0]), x[0])
