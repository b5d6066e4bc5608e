"""conv_utils.run_gpu_memory_test, which runs the GPU tests whose tensors take a tenth of the GPU's memory: under
pytest-xdist the named function runs in a child process with its arguments and the suite's debug poison, and a
failing child fails the test with its output; without xdist it runs in the test's own process."""

from __future__ import annotations

import os

import pytest

import conv_utils as cu


def _record(path, value):
  import jaxconv
  with open(path, "w") as f:
    f.write(f"{os.getpid()} {value} {jaxconv.debug_poison()}")


def _fail(message):
  raise AssertionError(message)


def test_under_xdist_it_runs_in_a_child_with_its_arguments(tmp_path, tmp_path_factory, monkeypatch):
  monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
  out = tmp_path / "out.txt"
  cu.run_gpu_memory_test(tmp_path_factory, _record, str(out), 42)
  pid, value, poison = out.read_text().split()
  assert int(pid) != os.getpid()
  assert (value, poison) == ("42", "True")


def test_a_failing_child_fails_the_test_with_its_output(tmp_path_factory, monkeypatch):
  monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
  with pytest.raises(AssertionError, match="boom in the child"):
    cu.run_gpu_memory_test(tmp_path_factory, _fail, "boom in the child")


def test_without_xdist_it_runs_here(tmp_path, tmp_path_factory, monkeypatch):
  monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
  out = tmp_path / "out.txt"
  cu.run_gpu_memory_test(tmp_path_factory, _record, str(out), 7)
  assert out.read_text().split()[:2] == [str(os.getpid()), "7"]
