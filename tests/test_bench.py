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


def _import_scorecard():
  """benchmarks/issue4_scorecard.py as a module (benchmarks/ is no package)."""
  sys.path.insert(0, os.path.join(_ROOT, "benchmarks"))
  import issue4_scorecard
  return issue4_scorecard


def _scorecard_verdicts(lines):
  """{case name: its 'target met' cell} from the scorecard's markdown table."""
  rows = [ln.strip("|").split("|") for ln in lines if ln.startswith("| ") and not ln.startswith("| case")]
  return {cells[0].strip(): cells[8].strip() for cells in rows}


def test_issue4_scorecard_applies_the_forward_target():
  """A case meets the forward target at 1.5x lax, or within 1.25x its floor when not slower than lax; dense cases
  (16+ input and output channels, groups 1) are left out of the count and the geometric mean."""
  sc = _import_scorecard()

  def rec(name, dtype, t_us, lax_us, pct_floor, cin=1, cout=1, groups=1):
    case = {"name": name, "in_channels": cin, "out_channels": cout, "groups": groups}
    return {"case": case, "dtype": dtype,
            "impls": {"jaxconv": {"time_s": t_us * 1e-6, "pct_floor_jaxconv_path": pct_floor, "time_source": "fit"},
                      "lax": {"time_s": lax_us * 1e-6}}}

  results = {"results": [
      rec("fast", "bfloat16", 10.0, 20.0, 10.0),              # 2x lax, far from its floor: met
      rec("near_floor", "bfloat16", 10.0, 12.0, 90.0),        # 1.2x lax, 1.11x its floor: met
      rec("slower", "float32-highest", 10.0, 9.9, 100.0),     # at its floor but slower than lax: not met
      rec("short", "float32-highest", 10.0, 14.0, 70.0),      # 1.4x lax, 1.43x its floor: not met
      rec("dense", "bfloat16", 10.0, 1.0, 1.0, 64, 64),       # 0.1x lax, but dense: not counted
      rec("depthwise", "bfloat16", 10.0, 30.0, 50.0, 64, 64, groups=64),  # 3x: counted (not dense)
  ]}
  lines = sc.scorecard(results)
  rows = _scorecard_verdicts(lines)
  assert rows["fast"] == "yes" and rows["near_floor"] == "yes"
  assert rows["slower"] == "**no**" and rows["short"] == "**no**"
  assert rows["dense"] == "dense: not a target" and rows["depthwise"] == "yes"
  bf16 = (2.0 * 1.2 * 3.0) ** (1 / 3)
  f32 = (0.99 * 1.4) ** 0.5
  every = (2.0 * 1.2 * 3.0 * 0.99 * 1.4) ** (1 / 5)
  assert lines[-1] == f"met 3 of 5; geomean {every:.2f}; bf16 {bf16:.2f}; f32 HIGHEST {f32:.2f}"


def test_issue4_scorecard_applies_the_fwdbwd_and_conv1d_targets(tmp_path):
  """fwd+bwd rows of the <= 4-channel and one-output msd cases meet at 10x lax or 1.5x the floor; other fwd+bwd
  rows are no target; the 1M conv1d float32 HIGHEST forward also needs <= 122 µs; several JSON files merge."""
  sc = _import_scorecard()

  def rec(name, op, dtype, t_us, lax_us, pct_floor, cin=1, cout=1):
    case = {"name": name, "in_channels": cin, "out_channels": cout, "groups": 1}
    return {"case": case, "op": cases.canon_op(op), "dtype": dtype,
            "impls": {"jaxconv": {"time_s": t_us * 1e-6, "pct_floor_jaxconv_path": pct_floor, "time_source": "fit"},
                      "lax": {"time_s": lax_us * 1e-6}}}

  fb = [rec("fb_10x", "fwdbwd", "bfloat16", 10.0, 120.0, 10.0, 4, 4),     # 12x, far from its floor: met
        rec("fb_floor", "fwdbwd", "bfloat16", 10.0, 20.0, 70.0, 64, 1),   # 2x lax, 1.43x its floor: met
        rec("fb_short", "fwdbwd", "float32-highest", 10.0, 95.0, 60.0, 4, 4),  # 9.5x, 1.67x its floor: not met
        rec("fb_dense", "fwdbwd", "bfloat16", 10.0, 5.0, 5.0, 16, 16)]    # not one of the target's cases
  fwd = [rec("seed_conv1d_1M_k2047", "fwd", "float32-highest", 130.0, 2600.0, 45.0),  # 20x but > 122 µs
         rec("seed_conv1d_1M_k2047", "fwd", "bfloat16", 130.0, 2600.0, 45.0)]         # the limit is f32's only
  paths = []
  for i, part in enumerate((fb, fwd)):
    paths.append(tmp_path / f"r{i}.json")
    paths[-1].write_text(json.dumps({"results": part}))
  lines = sc.scorecard({"results": fb + fwd})
  verdicts = _scorecard_verdicts(lines)
  assert verdicts["fb_10x"] == "yes" and verdicts["fb_floor"] == "yes" and verdicts["fb_short"] == "**no**"
  assert verdicts["fb_dense"] == "not a target"
  conv1d = [ln.strip("|").split("|") for ln in lines if ln.startswith("| seed_conv1d")]
  assert [(c[2].strip(), c[8].strip()) for c in conv1d] == [("f32 HIGHEST", "**no**"), ("bf16", "yes")]
  assert lines[-1] == ("forward: 0 slower than lax; fwd+bwd: met 2 of 3; conv1d 1M x 2047 float32 HIGHEST "
                       "forward: 130.0 µs (limit 122)")
  out = subprocess.run([sys.executable, sc.__file__, *map(str, paths)], capture_output=True, text=True, check=True)
  assert out.stdout.splitlines() == lines
  # A row measured again in a later file (a focused re-measurement) replaces the earlier one, not adds to it.
  again = tmp_path / "again.json"
  again.write_text(json.dumps({"results": [rec("fb_short", "fwdbwd", "float32-highest", 8.0, 95.0, 75.0, 4, 4)]}))
  out = subprocess.run([sys.executable, sc.__file__, *map(str, paths), str(again)], capture_output=True, text=True,
                       check=True).stdout.splitlines()
  assert _scorecard_verdicts(out)["fb_short"] == "yes" and sum(ln.startswith("| fb_short ") for ln in out) == 1
  assert "fwd+bwd: met 3 of 3" in out[-1]
  # lax compiled without autotuning (the float32 conv1d list) is named beside lax's time; other rows say nothing.
  fb[0]["impls"]["lax"]["compiler_options"] = {"xla_gpu_autotune_level": 0}
  cells = {c[0].strip(): c[4].strip() for c in (ln.strip("|").split("|") for ln in sc.scorecard({"results": fb})[2:6])}
  assert cells["fb_10x"] == "120 (xla_gpu_autotune_level=0)" and cells["fb_floor"] == "20"


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


def test_issue4_lists_measure_every_row_the_scorecard_scores(tmp_path):
  """issue4_run.sh's lists, as it hands them to the harness, cover item 5: the forward of every suite case that
  is not dense (nor grouped without being depthwise) and the fwd+bwd of every case the fwd+bwd target names, each
  in bf16 and float32 HIGHEST."""
  sc = _import_scorecard()

  fake = tmp_path / "py"  # records each harness call's arguments and writes an empty results.json to its --out
  fake.write_text('#!/bin/bash\nprintf "%s\\n" "$@" >> "$CALLS"\necho ---- >> "$CALLS"\n'
                  'prev=; for a in "$@"; do [ "$prev" = --out ] && mkdir -p "$a" && echo \'{"results": []}\' > "$a/results.json";'
                  ' prev=$a; done\n')
  fake.chmod(0o755)
  calls = tmp_path / "calls"
  env = dict(os.environ, PY=str(fake), OUT=str(tmp_path / "out"), CALLS=str(calls))
  subprocess.run(["bash", os.path.join(_ROOT, "benchmarks", "issue4_run.sh"), "fwd", "fb_fast", "fb_slow",
                  "fb_conv1d_f32"], env=env, check=True, capture_output=True, text=True)
  suite = cases.load_suite(os.path.join(_ROOT, "benchmarks", "suite.json"))
  measured = set()
  harness_calls = [c.splitlines() for c in calls.read_text().split("----\n")[:-1] if c.startswith("-m\n")]
  assert len(harness_calls) == 5  # fwd, fb_fast, the two parts of fb_slow, fb_conv1d_f32
  assert calls.read_text().split("----\n")[-2].startswith("benchmarks/issue4_scorecard.py\n")  # then the scorecard
  for args in harness_calls:
    opt = {k: args[args.index(k) + 1] for k in ("--ops", "--filter", "--dtypes")}
    for c in suite:
      if re.search(opt["--filter"], c.name):
        measured |= {(c.name, cases.canon_op(o), d) for o in opt["--ops"].split(",") for d in opt["--dtypes"].split(",")}
  as_dict = lambda c: {"in_channels": c.in_channels, "out_channels": c.out_channels, "groups": c.groups}
  both = ("bfloat16", "float32-highest")
  fwd = {(c.name, "fwd", d) for c in suite for d in both
         if not sc.is_dense(as_dict(c)) and c.groups in (1, c.in_channels)}
  fwdbwd = {(c.name, sc.FWDBWD, d) for c in suite for d in both if sc.is_fwdbwd_target(as_dict(c))}
  assert len(fwdbwd) == 24 and fwd - measured == set() and fwdbwd - measured == set()
