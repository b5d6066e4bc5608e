"""The curated performance baselines and the doc generated from them (jaxconv/bench/baseline.py)."""

from __future__ import annotations

import json
import pathlib
import statistics

import pytest

from jaxconv.bench import baseline

ROOT = pathlib.Path(__file__).resolve().parents[1]
BASELINES = sorted((ROOT / "benchmarks" / "baselines").glob("*.json"))


def test_performance_doc_is_generated_from_the_baselines():
  docs = baseline.doc([json.loads(p.read_text()) for p in BASELINES])
  assert (ROOT / "docs" / "performance.md").read_text() == docs, \
      "regenerate it: python -m jaxconv.bench.baseline doc benchmarks/baselines/*.json --out docs/performance.md"


@pytest.mark.parametrize("path", BASELINES, ids=[p.stem for p in BASELINES])
def test_each_baseline_names_where_and_when_it_was_measured_and_its_sweep_summary_holds(path):
  b = json.loads(path.read_text())
  assert b["format"] == baseline.FORMAT and b["gpu"] and b["date"] and b["jax"] and b["commit"]
  assert b["suite"] and all(r["jaxconv_us"] > 0 for dts in b["suite"].values() for ops in dts.values()
                            for r in ops.values() if r["jaxconv_us"] is not None)
  if "sweep" in b:
    ratios = [c["ratio"] for c in b["sweep"]["cases"]]
    assert b["sweep"]["summary"] == baseline.summary(ratios)


def test_summary_against_numpy_free_statistics():
  r = [0.5, 2.0, 1.0, 4.0, 0.25, 1.5, 3.0, 0.8, 1.2, 0.6]
  s = baseline.summary(r)
  assert s["n"] == 10 and s["min"] == 0.25 and s["p10"] == 0.25 and s["median"] == 1.1
  assert s["geomean"] == pytest.approx(statistics.geometric_mean(r), abs=1e-3)
  assert s["below_0_7"] == 3 and s["below_0_9"] == 4
