"""benchmarks/ab_suite.py: how a pass records its times and how compare judges pairs of passes."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import ab_suite  # noqa: E402


def _pass(times):
  """A pass file's content: {key: (marked span, kernel time or None, spread of the rounds)}."""
  return {"measurements": {k: {"jaxconv": span, "spread": spread, **({"kernel": kern} if kern else {})}
                           for k, (span, kern, spread) in times.items()}}


def test_compare_prefers_kernel_times_over_the_pairs_that_have_them():
  a1 = _pass({"tiny": (4e-6, 3.0e-6, 0.1), "big": (100e-6, None, 0.01), "mixed": (4e-6, 3.0e-6, 0.1),
              "crossed": (4e-6, 3.0e-6, 0.1)})
  b1 = _pass({"tiny": (9e-6, 3.0e-6, 0.1), "big": (110e-6, None, 0.01), "mixed": (25e-6, None, 0.1),
              "crossed": (9e-6, None, 0.1)})
  a2 = _pass({"tiny": (5e-6, 3.1e-6, 0.1), "big": (101e-6, None, 0.01), "mixed": (5e-6, 3.1e-6, 0.1),
              "crossed": (5e-6, None, 0.1)})
  b2 = _pass({"tiny": (8e-6, 3.1e-6, 0.1), "big": (112e-6, None, 0.01), "mixed": (8e-6, 3.2e-6, 0.1),
              "crossed": (8e-6, 3.1e-6, 0.1)})
  rows, _ = ab_suite.compare([a1, b1, a2, b2], 1.03)
  by_key = {k: (ratio, spread, kern) for k, ratio, spread, kern in rows}
  # The launch gaps in the marked spans doubled "tiny"; its kernels took the same time in every pass.
  assert by_key["tiny"][0] == pytest.approx(1.0) and by_key["tiny"][2] is True
  assert by_key["tiny"][1] == pytest.approx(3.1 / 3.0 - 1.0)  # A/A across passes only
  # A pass whose span passed the recording bound has no kernel time: the pair that has them on both sides decides.
  assert by_key["mixed"][2] is True and by_key["mixed"][0] == pytest.approx(3.2 / 3.1)
  assert by_key["mixed"][1] == pytest.approx(3.1 / 3.0 - 1.0)
  # No pair with kernel times on both sides: the marked spans decide, their rounds' spread counts.
  assert by_key["crossed"][2] is False and by_key["crossed"][0] == pytest.approx((9 / 4 + 8 / 5) / 2)
  assert by_key["big"][2] is False and by_key["big"][0] == pytest.approx((1.10 + 112 / 101) / 2)
  assert [k for k, *_ in rows] == ["crossed", "big", "mixed", "tiny"]  # worst first


def test_compare_command_flags_only_slowdowns_beyond_the_noise(tmp_path, capsys):
  files = []
  for i, p in enumerate([_pass({"x": (10e-6, 5e-6, 0.0)}), _pass({"x": (10e-6, 6e-6, 0.0)})]):
    files.append(str(tmp_path / f"p{i}.json"))
    with open(files[-1], "w") as f:
      json.dump(p, f)
  assert ab_suite.main(["compare", *files]) == 1
  out = capsys.readouterr().out
  assert "1 measurements (1 by kernel time)" in out and "1.200  (A/A spread 0.0%, kernel time)  x" in out


def test_a_pass_records_kernel_times_of_fast_measurements(tmp_path):
  suite = {"cases": [{"name": "small", "batch": 2, "spatial": [9, 7], "in_channels": 5, "out_channels": 6,
                      "filter": [3, 3], "stride": [1, 1], "padding": [[1, 1], [1, 1]], "dilation": [1, 1],
                      "groups": 1, "layout": "channels_last", "dtypes": ["float32"], "ops": ["fwd", "wgrad"]}]}
  path = tmp_path / "suite.json"
  path.write_text(json.dumps(suite))
  for under, expect in ((1e9, True), (0.0, False)):
    out = tmp_path / f"pass{under}.json"
    assert ab_suite.main(["run", "--label", "A", "--out", str(out), "--suite", str(path), "--repeats", "3",
                          "--threads", "1", "--kernel-time-under", str(under)]) == 0
    m = json.loads(out.read_text())["measurements"]
    assert sorted(m) == ["small|float32|fwd", "small|float32|wgrad"]
    for rec in m.values():
      assert rec["jaxconv"] > 0 and not rec["error"]
      assert ("kernel" in rec) == expect and (not expect or rec["kernel"] > 0)
