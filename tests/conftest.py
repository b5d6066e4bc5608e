"""pytest configuration for jaxconv.

- 64-bit types are NOT enabled globally; float64 tests enter `conv_utils.enable_x64()` themselves and every
  reference is computed in float64 on the CPU backend from the same rounded inputs (see conv_utils).
- `poison` (session, autouse): jaxconv.set_debug_poison(True), so every kernel output starts as NaN and any
  element a kernel forgets to write fails the comparison.
- `gpu` marker: skipped cleanly unless jaxconv.cuda_available().
- `kernels` marker: needs a build with the CUDA kernels (the registry's predicates run on the host, no GPU needed);
  skipped cleanly in a CPU-only build.
- JAXCONV_FUZZ_CASES: random configurations per dtype in the fuzz tests (default 60; GPU CI sets hundreds).
- pytest-xdist workers (`-n auto`, the README's command) leave XLA_PYTHON_CLIENT_PREALLOCATE false unless set.
"""

from __future__ import annotations

import os
import sys
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import conv_utils  # noqa: E402


def pytest_configure(config):
  if hasattr(config, "workerinput"):
    # A pytest-xdist worker: several share one GPU, so none may take XLA's default 75 % of its memory up front
    # (read when the backend starts, after this).
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped cleanly without one)")
  config.addinivalue_line("markers", "kernels: needs a CUDA build (the GPU predicates), not a GPU")
  config.addinivalue_line("markers", "slow: long-running")


def _cuda_available() -> bool:
  try:
    import jaxconv
    return bool(jaxconv.cuda_available())
  except Exception:  # noqa: BLE001 - an unimportable package fails the other tests, not collection
    return False


def _has_kernels() -> bool:
  try:
    import jaxconv
    return bool(jaxconv.registry.has_kernels())
  except Exception:  # noqa: BLE001
    return False


def pytest_collection_modifyitems(config, items):
  if any("gpu" in item.keywords for item in items) and not _cuda_available():
    skip = pytest.mark.skip(reason="needs CUDA: jaxconv.cuda_available() is False")
    for item in items:
      if "gpu" in item.keywords:
        item.add_marker(skip)
  if any("kernels" in item.keywords for item in items) and not _has_kernels():
    skip = pytest.mark.skip(reason="needs a CUDA build: this one has no GPU kernels or predicates")
    for item in items:
      if "kernels" in item.keywords:
        item.add_marker(skip)


def pytest_report_header(config):
  try:
    import jax
    import jaxconv
    return (f"jax {jax.__version__}, backend {jax.default_backend()}, jaxconv build_info "
            f"{jaxconv.build_info()}, JAXCONV_FUZZ_CASES={conv_utils.FUZZ_CASES}")
  except Exception as e:  # noqa: BLE001
    return f"jaxconv not importable: {e!r}"


@pytest.fixture(scope="session", autouse=True)
def poison():
  """Fill every jaxconv output with NaN before its kernel runs, for the whole session."""
  import jaxconv
  jaxconv.set_debug_poison(True)
  yield True
  jaxconv.set_debug_poison(False)


@pytest.fixture
def rng(request):
  """A numpy Generator seeded from the test id (deterministic, distinct per test)."""
  return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def x64():
  """Run the test with 64-bit types enabled."""
  with conv_utils.enable_x64():
    yield


@pytest.fixture(scope="session")
def fuzz_cases():
  return conv_utils.FUZZ_CASES
