"""jaxconv's PEP 517 build backend: scikit-build-core's, with three changes.

1. nvidia-cutlass (the CUTLASS/CuTe headers of the tensor-core kernels) is a build requirement only when the CUDA
   kernels will be built, so a CPU-only build neither downloads nor needs it. The CUDA decision is made here once,
   from JAXCONV_CUDA (a `-C cmake.define.JAXCONV_CUDA=...` config setting, else the environment variable, else
   AUTO): ON, OFF, or AUTO = ON when a CUDA compiler is found the way CMake looks for one (CUDACXX, nvcc on the
   PATH, $CUDA_PATH/bin). An AUTO that finds none is passed to CMake as OFF, so CMake never builds CUDA without
   the headers this backend asked for. JAXCONV_CUTLASS_DIR (a CUTLASS include directory) also drops the wheel.
2. Builds run one compile job per usable core unless CMAKE_BUILD_PARALLEL_LEVEL says otherwise.
3. A reused build directory keeps its CMake cache and objects across pip's isolated build environments.
   scikit-build-core clears the cache and CMakeFiles/ (every object file) whenever its own location changes, and
   under build isolation that is a new temporary directory on every `pip install`, so `pip install -e '.[test]'`
   after `pip install -e .` rebuilt everything. Nothing in this project's configuration goes stale when the build
   environment moves (CMakeLists.txt copies the headers it takes from build-environment packages into the build
   tree, and find_package searches again for a package whose recorded directory is gone), so before handing over
   this backend records the current scikit-build-core location in a build directory that this same checkout,
   Python (the same version and headers, in whichever virtual environment) and scikit-build-core version made.
   Anything else (another source tree, Python or version) is left to scikit-build-core's own check.
"""

from __future__ import annotations

import glob
import json
import os
import pathlib
import re
import shutil
import sys
import sysconfig

import scikit_build_core
from scikit_build_core import build as _skbuild

# The CUTLASS release whose C++ API the kernels are written against.
CUTLASS_REQUIREMENT = "nvidia-cutlass==4.2.0.0"
_DEFINE = "cmake.define.JAXCONV_CUDA"
_SKBUILD_INFO = ".skbuild-info.json"  # scikit-build-core's record of a build directory
_PYTHON_INFO = ".jaxconv-python.json"  # this backend's note of the Python that made it
_SOURCE_DIR = pathlib.Path.cwd()

__all__ = [
    "build_editable", "build_sdist", "build_wheel", "get_requires_for_build_editable",
    "get_requires_for_build_sdist", "get_requires_for_build_wheel", "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel", "cuda_mode", "cuda_compiler",
]


def _setting(config_settings, key):
  value = (config_settings or {}).get(key)
  if isinstance(value, list):  # pip passes a repeated -C key as a list: the last one wins, as in CMake
    value = value[-1] if value else None
  return value


def cuda_compiler() -> str | None:
  """The CUDA compiler CMake's check_language(CUDA) would look at first, or None."""
  cudacxx = os.environ.get("CUDACXX", "").strip()
  if cudacxx:
    return shutil.which(cudacxx.split()[0]) or None
  found = shutil.which("nvcc")
  if found:
    return found
  cuda_path = os.environ.get("CUDA_PATH", "")
  candidate = os.path.join(cuda_path, "bin", "nvcc") if cuda_path else ""
  return candidate if candidate and os.access(candidate, os.X_OK) else None


def cuda_mode(config_settings=None) -> str:
  """ON or OFF when CUDA is decided, AUTO when a compiler was found and CMake's check of it decides."""
  requested = (_setting(config_settings, _DEFINE) or os.environ.get("JAXCONV_CUDA") or "AUTO").strip().upper()
  if requested not in ("ON", "OFF", "AUTO"):
    raise ValueError(f"JAXCONV_CUDA must be ON, OFF or AUTO, not {requested!r}")
  if requested == "AUTO" and cuda_compiler() is None:
    return "OFF"
  return requested


def _extra_requires(config_settings) -> list[str]:
  if cuda_mode(config_settings) == "OFF" or os.environ.get("JAXCONV_CUTLASS_DIR"):
    return []
  return [CUTLASS_REQUIREMENT]


def _settings(config_settings) -> dict:
  """The config settings with the CUDA decision made, and the parallel build level set."""
  settings = dict(config_settings or {})
  settings[_DEFINE] = cuda_mode(config_settings)
  if hasattr(os, "sched_getaffinity"):
    cores = len(os.sched_getaffinity(0))
  else:  # pragma: no cover - not Linux
    cores = os.cpu_count() or 1
  os.environ.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(max(cores, 1)))
  return settings


def _build_dir_pattern(config_settings) -> str:
  pattern = _setting(config_settings, "build-dir")
  if not pattern:
    import tomllib
    pyproject = tomllib.loads((_SOURCE_DIR / "pyproject.toml").read_text(encoding="utf-8"))
    pattern = pyproject.get("tool", {}).get("scikit-build", {}).get("build-dir", "")
  return pattern


def _records(config_settings):
  """(build directory, scikit-build-core's record of it) for every build directory the build-dir pattern names."""
  pattern = _build_dir_pattern(config_settings)
  if not pattern:
    return
  root = pattern if os.path.isabs(pattern) else str(_SOURCE_DIR / pattern)
  # The pattern's placeholders ({wheel_tag}, {cache_tag}, ...) match any one directory name.
  for info_path in glob.glob(os.path.join(re.sub(r"\{[^}]*\}", "*", glob.escape(root)), _SKBUILD_INFO)):
    try:
      with open(info_path, encoding="utf-8") as f:
        info = json.load(f)
    except (OSError, ValueError):  # an unreadable record: scikit-build-core clears that cache itself
      continue
    if isinstance(info, dict) and pathlib.Path(info.get("source_dir", "")) == _SOURCE_DIR.resolve():
      yield pathlib.Path(info_path).parent, info


def _python_identity() -> dict:
  """What the compile commands take from the interpreter: the same for every virtual environment of one Python
  (pip's and build's isolated environments are new ones each time)."""
  return {"version": sys.version, "include": sysconfig.get_paths()["include"],
          "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX")}


def _write_json(path: pathlib.Path, data: dict) -> None:
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
  os.replace(tmp, path)


def _keep_build_dirs(config_settings) -> None:
  """Records this scikit-build-core's location in the build directories this checkout made with this Python and
  this scikit-build-core version (see 3.), so that scikit-build-core keeps their cache and objects."""
  here = os.fspath(pathlib.Path(scikit_build_core.__file__).parent.resolve())  # what scikit-build-core compares
  for build_dir, info in _records(config_settings):
    try:
      python = json.loads((build_dir / _PYTHON_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
      continue
    if info.get("skbuild_version") != scikit_build_core.__version__ or python != _python_identity():
      continue
    if info.get("skbuild_path") != here:
      info["skbuild_path"] = here
      try:
        _write_json(build_dir / _SKBUILD_INFO, info)
      except OSError:
        continue


def _note_python(config_settings) -> None:
  """Notes beside scikit-build-core's record which Python the build directory this run used was made with."""
  for build_dir, info in _records(config_settings):
    if info.get("python_executable") == sys.executable:
      try:
        _write_json(build_dir / _PYTHON_INFO, _python_identity())
      except OSError:
        continue


def get_requires_for_build_wheel(config_settings=None):
  return _skbuild.get_requires_for_build_wheel(config_settings) + _extra_requires(config_settings)


def get_requires_for_build_editable(config_settings=None):
  return _skbuild.get_requires_for_build_editable(config_settings) + _extra_requires(config_settings)


def get_requires_for_build_sdist(config_settings=None):
  return _skbuild.get_requires_for_build_sdist(config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
  _keep_build_dirs(config_settings)
  try:
    return _skbuild.build_wheel(wheel_directory, _settings(config_settings), metadata_directory)
  finally:
    _note_python(config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
  _keep_build_dirs(config_settings)
  try:
    return _skbuild.build_editable(wheel_directory, _settings(config_settings), metadata_directory)
  finally:
    _note_python(config_settings)


def build_sdist(sdist_directory, config_settings=None):
  return _skbuild.build_sdist(sdist_directory, config_settings)


# scikit-build-core offers these two only where its metadata needs no build; so does this backend.
if hasattr(_skbuild, "prepare_metadata_for_build_wheel"):
  prepare_metadata_for_build_wheel = _skbuild.prepare_metadata_for_build_wheel
  prepare_metadata_for_build_editable = _skbuild.prepare_metadata_for_build_editable
else:  # pragma: no cover
  __all__ = [n for n in __all__ if not n.startswith("prepare_metadata")]
