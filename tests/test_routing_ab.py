"""benchmarks/routing_ab.py: which problems it takes and which variants it times, its offline judgement of a routing,
and its report. The registry's answers come from the CUDA build's predicates on the host (a default Hopper without a
GPU)."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

from jaxconv import registry
from jaxconv.bench import harness

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import routing_ab  # noqa: E402

PADDED = ("implicit_gemm.padded_k_sm90", "implicit_gemm.padded_k_sm80")


def _why(op, pr):
  return {n: r for n, r, _ in registry.explain(op, pr.params, pr.dtype, pr.out_dtype)}


@pytest.mark.kernels
def test_floor_only_takes_the_floors_problems_that_a_named_variant_applies_to():
  todo = routing_ab.select([5], 40, ["float32", "bfloat16"], "tiny", variants=PADDED, floor_only=True)
  assert len({t[0] for t in todo}) >= 3  # several cases of the draw have k off the alignment
  assert set().union(*(t[5] for t in todo)) == {"xla.conv", *PADDED}
  for tag, case, dt, op, auto, cands in todo:
    probs = harness.case_problems(case, dt)
    pr = probs[op]
    assert auto == "xla.conv" == registry.resolve(op, pr.params, pr.dtype, pr.out_dtype).name
    why = _why(op, pr)
    assert cands[0] == "xla.conv" or "xla.conv" in cands  # auto's choice is always timed
    assert set(cands) & set(PADDED), (tag, dt, op, cands)
    for v in cands:
      assert why[v] == "" and routing_ab.forward_runs(probs["fwd"], v), (tag, dt, op, v, why[v])


@pytest.mark.kernels
def test_without_a_filter_every_problem_times_each_candidate_in_the_tables_order():
  todo = routing_ab.select([5], 12, ["bfloat16"], "tiny")
  assert len(todo) >= 20  # about three ops of each case
  order = registry.variant_names()
  for tag, case, dt, op, auto, cands in todo:
    probs = harness.case_problems(case, dt)
    pr = probs[op]
    expect = [v for v in registry.candidates(op, pr.params, pr.dtype, pr.out_dtype)
              if routing_ab.forward_runs(probs["fwd"], v)]
    assert cands == expect and auto in cands, (tag, op, auto, cands)
    assert cands == sorted(cands, key=order.index)


@pytest.mark.kernels
def test_a_gradient_whose_forward_the_variant_refuses_is_left_out():
  """Forcing a variant checks its forward, so the timed gradient program of a problem whose forward the variant
  refuses cannot be built: such a problem is not taken. A 1-D filter gradient of 34 taps: the mma.sync kernels take
  windows of up to 32 taps, so they refuse the forward, while the filter gradient's problem is theirs."""
  from jaxconv.bench.cases import Case
  case = Case(name="wide1d", batch=2, spatial=(512,), in_channels=59, out_channels=59, filter=(34,), stride=(1,),
              padding=((16, 17),), dilation=(1,), layout="channels_first")
  probs = harness.case_problems(case, "float32")
  why = {op: _why(op, p) for op, p in probs.items()}
  assert why["wgrad"][PADDED[1]] == "" and "32 taps" in why["fwd"][PADDED[1]], why
  assert not routing_ab.forward_runs(probs["fwd"], PADDED[1])
  assert routing_ab.forward_runs(probs["fwd"], PADDED[0]) == (why["fwd"][PADDED[0]] == "")
  assert PADDED[1] not in routing_ab.candidates(probs, "wgrad")


def _row(op, lax, **us):
  return dict(tag="0/0", op=op, dtype="bfloat16", spec="s", candidates=list(us),
              us={"lax": lax, **{f"jaxconv:{k}": v for k, v in us.items()}})


def test_judge_compares_the_choice_with_the_best_candidate():
  rows = [_row("fwd", 10.0, a=5.0, b=20.0),   # choice a: best, lax/choice 2
          _row("fwd", 10.0, a=40.0, b=8.0),   # choice a: 5x slower than b
          _row("wgrad", 30.0, a=10.0),        # the only candidate
          _row("wgrad", 30.0, b=10.0)]        # a was not timed here
  j = routing_ab.judge(rows, lambda r: "a")
  assert j["choice"]["fwd"]["n"] == 2 and j["choice"]["fwd"]["min"] == pytest.approx(0.25)
  assert j["best"]["fwd"]["min"] == pytest.approx(1.25) and j["best"]["fwd"]["max"] == pytest.approx(2.0)
  assert j["choice"]["all"]["n"] == 3 and j["choice"]["wgrad"]["geomean"] == pytest.approx(3.0)
  assert [(m[1], m[2], m[3]) for m in j["misses"]] == [("a", "b", pytest.approx(5.0)), ("a", "a", 1.0),
                                                       ("a", "a", 1.0)]
  assert [(r["op"], c) for r, c in j["untimed"]] == [("wgrad", "a")]
  assert routing_ab.judge(rows, lambda r: "b")["choice"]["fwd"]["geomean"] == pytest.approx(math.sqrt(0.5 * 1.25))


@pytest.mark.kernels
def test_a_run_records_every_candidate_and_its_report_judges_this_build(tmp_path, capsys):
  out = tmp_path / "routing.json"
  assert routing_ab.main(["run", "--seeds", "5", "--cases-per-seed", "6", "--dtypes", "bfloat16", "--scale", "tiny",
                          "--budget", "3", "--out", str(out)]) == 0
  data = json.loads(out.read_text())
  rows = data["rows"]
  assert rows and data["selected"] >= len(rows) and data["scale"] == "tiny"
  assert data["device_info"] == list(registry.device())
  for r in rows:
    assert r["dtype"] == "bfloat16" and not r["errors"] and r["auto"] in r["candidates"]
    assert set(r["us"]) == {"lax", *(f"jaxconv:{v}" for v in r["candidates"])}
  for v, s in data["summary"].items():
    ratios = [r["us"]["lax"] / r["us"][f"jaxconv:{v}"] for r in rows if v in r["candidates"]]
    assert s["n"] == len(ratios) and s["min"] == pytest.approx(min(ratios))
  capsys.readouterr()
  rep = routing_ab.report([str(out)])
  # The same build routes as the recording did, so both judgements agree, and none beats the best candidate.
  assert rep["this_build"]["choice"] == rep["recorded"]["choice"] and not rep["this_build"]["untimed"]
  assert rep["this_build"]["choice"]["all"]["n"] == len(rows)
  assert rep["this_build"]["choice"]["all"]["max"] <= rep["this_build"]["best"]["all"]["max"]
  text = capsys.readouterr().out
  assert f"{len(rows)} measured (case, dtype, op)" in text and "this build's auto all" in text


def test_an_unknown_variant_is_refused_by_name(capsys):
  with pytest.raises(SystemExit):
    routing_ab.main(["run", "--variant", "implicit_gemm.winograd"])
  assert "unknown variant(s) ['implicit_gemm.winograd']" in capsys.readouterr().err
  assert "implicit_gemm.padded_k_sm90" in registry.variant_names()
