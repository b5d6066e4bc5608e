"""benchmarks/floor_ab.py: which problems it takes (auto's XLA floor, the variant applicable), and its report.
The registry's answers come from the CUDA build's predicates on the host (a default Hopper without a GPU)."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

from jaxconv import registry
from jaxconv.bench import harness

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import floor_ab  # noqa: E402

PADDED = ("implicit_gemm.padded_k_sm90", "implicit_gemm.padded_k_sm80")


@pytest.mark.kernels
def test_it_takes_the_floors_problems_that_a_variant_applies_to():
  todo = floor_ab.select(PADDED, [5], 40, ["float32", "bfloat16"], "tiny")
  assert len({t[0] for t in todo}) >= 3  # several cases of the draw have k off the alignment
  assert {t[4] for t in todo} == set(PADDED)
  for tag, case, dt, op, variant in todo:
    probs = harness.case_problems(case, dt)
    pr = probs[op]
    assert registry.resolve(op, pr.params, pr.dtype, pr.out_dtype).name == "xla.conv"
    why = {n: r for n, r, _ in registry.explain(op, pr.params, pr.dtype, pr.out_dtype)}
    # The first variant that applies is the one taken: the mma.sync one only where the Hopper one does not apply.
    assert why[variant] == "" and (variant == PADDED[0] or why[PADDED[0]]), (tag, dt, op, variant, why[PADDED[0]])
    assert floor_ab.forward_runs(probs["fwd"], variant)


@pytest.mark.kernels
def test_a_gradient_whose_forward_the_variant_refuses_is_left_out():
  """Forcing a variant checks its forward, so the timed gradient program of a problem whose forward the variant refuses
  cannot be built: such a problem is not taken. A 1-D filter gradient of 34 taps: the mma.sync kernels take windows of up
  to 32 taps, so they refuse the forward, while the filter gradient's problem is theirs."""
  from jaxconv.bench.cases import Case
  case = Case(name="wide1d", batch=2, spatial=(512,), in_channels=59, out_channels=59, filter=(34,), stride=(1,),
              padding=((16, 17),), dilation=(1,), layout="channels_first")
  probs = harness.case_problems(case, "float32")
  why = {op: {n: r for n, r, _ in registry.explain(op, p.params, p.dtype, p.out_dtype)} for op, p in probs.items()}
  assert why["wgrad"][PADDED[1]] == "" and "32 taps" in why["fwd"][PADDED[1]], why
  assert not floor_ab.forward_runs(probs["fwd"], PADDED[1])
  assert floor_ab.forward_runs(probs["fwd"], PADDED[0]) == (why["fwd"][PADDED[0]] == "")


@pytest.mark.kernels
def test_a_run_reports_every_measurement_and_its_summary(tmp_path, capsys):
  out = tmp_path / "floor.json"
  assert floor_ab.main(["--variant", PADDED[0], "--seeds", "5", "--cases-per-seed", "40", "--dtypes", "bfloat16",
                        "--scale", "tiny", "--budget", "3", "--out", str(out)]) == 0
  data = json.loads(out.read_text())
  rows = data["rows"]
  assert rows and data["selected"] >= len(rows) and data["scale"] == "tiny"
  for r in rows:
    assert r["variant"] == PADDED[0] and r["dtype"] == "bfloat16" and not r["errors"]
    assert r["ratio"] == pytest.approx(r["us"]["lax"] / r["us"][f"jaxconv:{PADDED[0]}"])
  ratios = [r["ratio"] for r in rows]
  s = data["summary"][PADDED[0]]
  assert s["n"] == len(ratios) and s["min"] == pytest.approx(min(ratios))
  assert s["geomean"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / len(ratios)))
  assert f"{PADDED[0]}: {len(ratios)} measured" in capsys.readouterr().out


def test_an_unknown_variant_is_refused_by_name(capsys):
  with pytest.raises(SystemExit):
    floor_ab.main(["--variant", "implicit_gemm.winograd"])
  assert "unknown variant(s) ['implicit_gemm.winograd']" in capsys.readouterr().err
  assert "implicit_gemm.padded_k_sm90" in registry.variant_names()
