"""The benchmark harness: its quick mode end to end (the README's benchmark command), and its statistics."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from jaxconv.bench import cases, device, merge, stats


def test_quick_benchmark_runs_and_writes_its_reports(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "jaxconv.bench", "--quick", "--out", str(tmp_path)],
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  res = json.loads((tmp_path / "results.json").read_text())
  assert res["results"]
  for r in res["results"]:
    for impl in ("jaxconv", "lax"):
      t = r["impls"][impl].get("time_s")
      assert t is not None and t > 0, (r["case"]["name"], impl, r["impls"][impl])
      # Timed between the in-stream marks; the marks are not counted as jaxconv's calls.
      assert r["impls"][impl]["timing"] == "stream marks"
      assert not any("hlo_" in f for f in r["impls"][impl].get("flags", [])), r["impls"][impl]["flags"]
    # Both sides computed the same convolution on the same inputs.
    assert r["rel_err"] < 2e-2, (r["case"]["name"], r["dtype"], r["rel_err"])
  # The recorded command names no directory outside the working one (here: the --out temp dir).
  assert not any(a.startswith("/") for a in res["meta"]["argv"]), res["meta"]["argv"]
  md = (tmp_path / "results.md").read_text()
  assert "jaxconv" in md and "lax" in md
  for png in ("speedup.png", "roofline.png"):
    assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

  # Merging this run with itself (runs split over several device calls are merged so) keeps every
  # measurement and rewrites the three outputs; --commit names the commit the device could not know.
  merged = tmp_path / "merged"
  merge.main([str(merged), str(tmp_path / "results.json"), str(tmp_path / "results.json"), "--commit", "abc1234"])
  both = json.loads((merged / "results.json").read_text())
  assert len(both["results"]) == 2 * len(res["results"])
  assert both["meta"]["git_commit"] == "abc1234" and len(both["meta"]["argv"]) == 2
  assert [m.split("/")[-1] for m in both["meta"]["merged_from"]] == ["results.json"] * 2
  assert not any(m.startswith("/") for m in both["meta"]["merged_from"])
  assert "abc1234" in (merged / "results.md").read_text()
  assert (merged / "speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_display_path_is_relative_inside_the_working_directory(tmp_path, monkeypatch):
  (tmp_path / "sub").mkdir()
  monkeypatch.chdir(tmp_path)
  assert device.display_path(str(tmp_path / "sub" / "r.json")) == "sub/r.json"
  assert device.display_path("sub/r.json") == "sub/r.json"
  assert device.display_path(str(tmp_path.parent / "elsewhere" / "r.json")) == "r.json"
  assert device.display_path(None) is None


def test_slope_fit_recovers_a_known_device_time():
  rng = np.random.default_rng(0)
  a, b = 150e-6, 37e-6  # dispatch and per-op time
  samples = {t: list(a + b * t + rng.normal(0, 2e-6, 12)) for t in (1, 2, 4, 8, 16)}
  fit = stats.fit_samples(samples)
  assert fit["ok"], fit
  lo, hi = fit["ci"]
  assert lo < b < hi and hi - lo < 0.1 * b, fit
  assert abs(fit["b"] - b) < 0.02 * b


def test_slope_fit_flags_noise_it_cannot_resolve():
  rng = np.random.default_rng(1)
  samples = {t: list(150e-6 + rng.normal(0, 50e-6, 6)) for t in (1, 2, 4, 8)}  # no signal at all
  assert not stats.fit_samples(samples)["ok"]


def test_one_timing_source_per_ratio():
  """A poor fit on one side puts every side of the measurement on the profiler; a ratio never mixes sources."""
  from jaxconv.bench.harness import choose_sources
  rng = np.random.default_rng(2)
  good = stats.fit_samples({t: list(150e-6 + 40e-6 * t + rng.normal(0, 1e-6, 8)) for t in (1, 2, 4, 8)})
  poor = stats.fit_samples({t: list(150e-6 + rng.normal(0, 50e-6, 8)) for t in (1, 2, 4, 8)})
  assert good["ok"] and not poor["ok"]
  tmax = {"jaxconv": [1e-3], "lax": [2e-3]}
  prof = {"jaxconv": {"ok": True, "per_op_us": 30.0}, "lax": {"ok": True, "per_op_us": 20.0}}

  both_good = choose_sources({"jaxconv": good, "lax": good}, prof, 8, tmax)
  assert {s for _, _, s in both_good.values()} == {"fit"}
  assert both_good["lax"][0] == good["b"]

  mixed = choose_sources({"jaxconv": good, "lax": poor}, prof, 8, tmax)
  assert mixed["jaxconv"][2] == mixed["lax"][2] == "profiler"  # the good fit gives way too
  assert mixed["jaxconv"][0] == pytest.approx(30e-6) and mixed["lax"][0] == pytest.approx(20e-6)

  # No profiler time for one side: each falls back alone, the good fit stays.
  no_prof = choose_sources({"jaxconv": good, "lax": poor}, {"jaxconv": prof["jaxconv"], "lax": {"ok": False}}, 8,
                           tmax)
  assert no_prof["jaxconv"][2] == "fit"
  assert no_prof["lax"][2] in ("min-fit", "upper-bound(min time/T)")
  if no_prof["lax"][2].startswith("upper"):
    assert no_prof["lax"][0] == pytest.approx(2e-3 / 8)


def test_commit_label_shortens_hashes_only():
  from jaxconv.bench.report import commit_label
  assert commit_label({"git_commit": "0123456789abcdef0123456789abcdef01234567"}) == "0123456789"
  merged = "f5a4b61 (bfloat16), 21080b2 (float32)"  # a merge's --commit names several runs: kept whole
  assert commit_label({"git_commit": merged}) == merged
  assert commit_label({}) == "?"


def test_t_quantile_matches_tables():
  assert stats.t_quantile(0.95, 10) == pytest.approx(1.8125, abs=1e-4)  # two-sided 90%, 10 dof
  assert stats.t_quantile(0.975, 3) == pytest.approx(3.1824, abs=1e-4)


def test_flop_count_of_a_strided_grouped_case():
  case = cases.parse_case_spec("2:9x10:4->6:3x3:s2:p1:g2")
  oh, ow = (9 + 2 - 3) // 2 + 1, (10 + 2 - 3) // 2 + 1
  assert case.out_spatial == (oh, ow)
  assert case.flops("fwd") == 2 * 2 * oh * ow * 6 * (4 // 2) * 9


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A small case and quick timing settings for the tests that run the harness itself.
_TINY_CASE = "2:9x11:4->8:3x3:p1"
_TINY_TIMING = dict(Ts=(1, 2), repeats=2, min_repeats=2, budget_s=0.2, profile="never")


def test_lax_compiler_options_reach_lax_compilations_only(tmp_path):
  """--lax-autotune-level sets lax's XLA options and no one else's: an unknown option fails lax's entry alone,
  a real one is recorded per entry, in the metadata and in the report."""
  from jaxconv.bench import harness
  case, kw = cases.parse_case_spec(_TINY_CASE, []), _TINY_TIMING
  bad = harness.time_entry(case, "float32", "fwd", compiler_options={"lax": {"xla_no_such_option": 1}}, **kw)
  assert "xla_no_such_option" in bad["impls"]["lax"]["error"]
  assert bad["impls"]["jaxconv"]["time_s"] > 0 and "error" not in bad["impls"]["jaxconv"]

  proc = subprocess.run([sys.executable, "-m", "jaxconv.bench", "--case", _TINY_CASE, "--dtypes", "float32",
                         "--ops", "fwd", "--ts", "1,2", "--repeats", "2", "--budget", "0.2", "--profile", "never",
                         "--no-plots", "--lax-autotune-level", "2", "--out", str(tmp_path)],
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  res = json.loads((tmp_path / "results.json").read_text())
  assert res["meta"]["compiler_options"] == {"lax": {"xla_gpu_autotune_level": 2}}
  (entry,) = res["results"]
  assert entry["impls"]["lax"]["compiler_options"] == {"xla_gpu_autotune_level": 2}
  assert "compiler_options" not in entry["impls"]["jaxconv"] and entry["impls"]["lax"]["time_s"] > 0
  assert "lax compiled with XLA options {'xla_gpu_autotune_level': 2}" in (tmp_path / "results.md").read_text()


def test_a_slow_compilation_is_reported_while_it_runs():
  """A compilation past slow_compile_s is logged while it runs (lax's autotuning once outlasted a device call with
  nothing in the log); one shorter than that logs nothing."""
  from jaxconv.bench import harness
  case, kw = cases.parse_case_spec(_TINY_CASE, []), _TINY_TIMING
  quiet, chatty = [], []
  harness.time_entry(case, "float32", "fwd+bwd", log=quiet.append, **kw)
  assert quiet == []
  harness.time_entry(case, "float32", "fwd+bwd", log=chatty.append, slow_compile_s=1e-3, **kw)
  for impl in ("jaxconv", "lax"):
    assert any(m.startswith(f"{case.name} float32 fwd+bwd: compiling {impl} (T=1): still running after") for m in chatty)


def test_forced_implementation_runs_the_named_variant_and_matches_lax():
  import jax
  from jaxconv.bench import harness
  case = cases.parse_case_spec("2:9x11:5->7:3x3:s2x1:p1x0")
  x_shape, w_shape, _ = case.shapes()
  rng = np.random.default_rng(3)
  x = rng.standard_normal(x_shape).astype(np.float32)
  w = rng.standard_normal(w_shape).astype(np.float32)
  kw = harness.conv_kwargs(case, "float32-highest")
  want = np.asarray(jax.lax.conv_general_dilated(x, w, **kw))
  from jaxconv import _native, registry

  def requested(impl):  # the algorithm field of the custom call's packed params
    hlo = jax.jit(lambda x, w: harness._impl_fn(impl)(x, w, **kw)).lower(x, w).as_text()
    params = [int(v) for v in re.search(r"params = dense<\[([-0-9, ]+)\]>", hlo).group(1).split(",")]
    offset = 0
    for name, count in _native.param_fields():
      if name == "algorithm":
        return params[offset]
      offset += count

  assert requested("jaxconv") == registry.request_code("auto")
  assert requested("jaxconv:direct.gemm") == registry.request_code("direct.gemm")
  # On the CPU every request runs the CPU kernels: the result is lax's.
  forced = harness._impl_fn("jaxconv:direct.gemm")
  np.testing.assert_allclose(np.asarray(jax.jit(lambda x, w: forced(x, w, **kw))(x, w)), want, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="unknown jaxconv algorithm 'nope'"):
    harness._impl_fn("jaxconv:nope")
