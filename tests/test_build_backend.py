"""tools/build_backend: CUTLASS is a build requirement only for CUDA builds, AUTO without a CUDA compiler builds no
CUDA, and a reused build directory survives a new isolated build environment of the same scikit-build-core."""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import sys
import tomllib

import pytest

pytest.importorskip("scikit_build_core", reason="the build backend wraps scikit-build-core (a test extra)")

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def backend(monkeypatch, tmp_path):
  monkeypatch.syspath_prepend(str(ROOT / "tools" / "build_backend"))
  monkeypatch.chdir(ROOT)  # scikit-build-core reads pyproject.toml from the working directory, as under pip
  for var in ("JAXCONV_CUDA", "JAXCONV_CUTLASS_DIR", "CUDACXX", "CUDA_PATH"):
    monkeypatch.delenv(var, raising=False)
  monkeypatch.setenv("CMAKE_BUILD_PARALLEL_LEVEL", "")  # recorded, so what the backend sets is undone
  monkeypatch.delenv("CMAKE_BUILD_PARALLEL_LEVEL")
  module = importlib.import_module("jaxconv_build_backend")
  yield module
  sys.modules.pop("jaxconv_build_backend", None)


def _fake_nvcc(directory: pathlib.Path) -> pathlib.Path:
  nvcc = directory / "nvcc"
  nvcc.write_text("#!/bin/sh\nexit 0\n")
  nvcc.chmod(0o755)
  return nvcc


def _no_compiler(monkeypatch, tmp_path):
  empty = tmp_path / "empty-bin"
  empty.mkdir()
  monkeypatch.setenv("PATH", str(empty))


def test_auto_without_a_cuda_compiler_is_off_and_needs_no_cutlass(backend, monkeypatch, tmp_path):
  _no_compiler(monkeypatch, tmp_path)
  assert backend.cuda_compiler() is None
  assert backend.cuda_mode() == "OFF"
  assert backend._extra_requires(None) == []
  # The decision reaches CMake as OFF, so CMake never builds CUDA without the headers asked for here.
  assert backend._settings(None)[backend._DEFINE] == "OFF"


def test_builds_use_every_core_unless_told(backend, monkeypatch):
  backend._settings(None)
  assert os.environ["CMAKE_BUILD_PARALLEL_LEVEL"] == str(len(os.sched_getaffinity(0)))
  monkeypatch.setenv("CMAKE_BUILD_PARALLEL_LEVEL", "3")
  backend._settings(None)
  assert os.environ["CMAKE_BUILD_PARALLEL_LEVEL"] == "3"


def test_auto_with_a_cuda_compiler_asks_for_cutlass(backend, monkeypatch, tmp_path):
  _no_compiler(monkeypatch, tmp_path)
  nvcc = _fake_nvcc(tmp_path / "empty-bin")
  assert backend.cuda_compiler() == str(nvcc)
  assert backend.cuda_mode() == "AUTO"
  assert backend._extra_requires(None) == [backend.CUTLASS_REQUIREMENT]


@pytest.mark.parametrize("where", ["CUDACXX", "CUDA_PATH"])
def test_the_compiler_is_found_where_cmake_looks(backend, monkeypatch, tmp_path, where):
  _no_compiler(monkeypatch, tmp_path)
  (tmp_path / "cuda" / "bin").mkdir(parents=True)
  nvcc = _fake_nvcc(tmp_path / "cuda" / "bin")
  monkeypatch.setenv(where, str(nvcc) if where == "CUDACXX" else str(tmp_path / "cuda"))
  assert backend.cuda_compiler() == str(nvcc)


def test_explicit_settings_win(backend, monkeypatch, tmp_path):
  _no_compiler(monkeypatch, tmp_path)
  monkeypatch.setenv("JAXCONV_CUDA", "on")
  assert backend.cuda_mode() == "ON" and backend._extra_requires(None) == [backend.CUTLASS_REQUIREMENT]
  # A config setting (-C cmake.define.JAXCONV_CUDA=OFF) wins over the environment; a repeated one takes the last.
  assert backend.cuda_mode({backend._DEFINE: "OFF"}) == "OFF"
  assert backend.cuda_mode({backend._DEFINE: ["ON", "OFF"]}) == "OFF"
  # A CUTLASS checkout of one's own replaces the wheel.
  monkeypatch.setenv("JAXCONV_CUTLASS_DIR", str(tmp_path))
  assert backend._extra_requires(None) == []
  monkeypatch.setenv("JAXCONV_CUDA", "maybe")
  with pytest.raises(ValueError, match="ON, OFF or AUTO"):
    backend.cuda_mode()


def test_cpu_build_requirements_have_no_cutlass_and_cuda_ones_do(backend, monkeypatch):
  monkeypatch.setenv("JAXCONV_CUDA", "OFF")
  cpu = backend.get_requires_for_build_wheel() + backend.get_requires_for_build_editable()
  assert not any("cutlass" in r for r in cpu), cpu
  monkeypatch.setenv("JAXCONV_CUDA", "ON")
  assert backend.CUTLASS_REQUIREMENT in backend.get_requires_for_build_wheel()
  assert backend.CUTLASS_REQUIREMENT in backend.get_requires_for_build_editable()


def test_pyproject_uses_this_backend_without_an_unconditional_cutlass():
  system = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
  assert system["build-backend"] == "jaxconv_build_backend"
  assert system["backend-path"] == ["tools/build_backend"]
  assert not any("cutlass" in r for r in system["requires"]), system["requires"]


def _record(build_dir: pathlib.Path, python: dict | None, **info) -> pathlib.Path:
  build_dir.mkdir(parents=True)
  path = build_dir / ".skbuild-info.json"
  path.write_text(json.dumps(info))
  if python is not None:
    (build_dir / ".jaxconv-python.json").write_text(json.dumps(python))
  return path


def test_a_build_dir_of_this_checkout_survives_a_new_isolated_environment(backend, monkeypatch, tmp_path):
  import scikit_build_core
  monkeypatch.setattr(backend, "_SOURCE_DIR", tmp_path)
  here = os.fspath(pathlib.Path(scikit_build_core.__file__).parent.resolve())
  gone = "/gone/isolated-env/scikit_build_core"
  same = dict(source_dir=str(tmp_path), python_executable="/gone/isolated-env/bin/python",
              skbuild_version=scikit_build_core.__version__, skbuild_path=gone)
  python = backend._python_identity()
  mine = _record(tmp_path / "build" / "cp3-linux", python, **same)
  other_python = _record(tmp_path / "build" / "other-python", dict(python, include="/other/include"), **same)
  unknown_python = _record(tmp_path / "build" / "unknown-python", None, **same)
  other_version = _record(tmp_path / "build" / "other-version", python, **dict(same, skbuild_version="0.0.1"))
  other_source = _record(tmp_path / "build" / "other-source", python, **dict(same, source_dir="/elsewhere"))
  backend._keep_build_dirs({"build-dir": "build/{wheel_tag}"})
  assert json.loads(mine.read_text())["skbuild_path"] == here
  # Anything else is left to scikit-build-core's own check (which clears that cache).
  for path in (other_python, unknown_python, other_version, other_source):
    assert json.loads(path.read_text())["skbuild_path"] == gone, path


def test_a_build_notes_the_python_it_used(backend, monkeypatch, tmp_path):
  monkeypatch.setattr(backend, "_SOURCE_DIR", tmp_path)
  this = _record(tmp_path / "b" / "this", None, source_dir=str(tmp_path), python_executable=sys.executable)
  other = _record(tmp_path / "b" / "other", None, source_dir=str(tmp_path), python_executable="/other/python")
  backend._note_python({"build-dir": "b/{wheel_tag}"})
  assert json.loads((this.parent / ".jaxconv-python.json").read_text()) == backend._python_identity()
  assert not (other.parent / ".jaxconv-python.json").exists()
