"""jaxconv._jax_compat: the private jax APIs resolve on the installed jax, and a missing one fails by name."""

from __future__ import annotations

import pathlib
import re
import tomllib

import jax
import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from jaxconv import _jax_compat as compat

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _pyproject():
  return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_private_api_resolves_on_the_installed_jax():
  assert compat.missing() == [], f"jax {jax.__version__} lacks {compat.missing()}"
  compat.check()
  from jax._src import sharding_impls
  assert compat.get("ShardingContext") is sharding_impls.ShardingContext


def test_the_installed_jax_is_in_the_supported_range():
  assert Version(jax.__version__) in SpecifierSet(compat.SUPPORTED_JAX), jax.__version__
  import jaxlib
  assert Version(jaxlib.__version__) in SpecifierSet(compat.SUPPORTED_JAX), jaxlib.__version__


def test_the_range_is_the_one_pyproject_states():
  deps = {re.split(r"[<>=!~ ;]", d, maxsplit=1)[0]: d for d in _pyproject()["project"]["dependencies"]}
  for name in ("jax", "jaxlib"):
    assert name in deps, deps
    assert SpecifierSet(deps[name][len(name):]) == SpecifierSet(compat.SUPPORTED_JAX), deps[name]


def test_a_missing_api_raises_an_import_error_that_names_it(monkeypatch):
  monkeypatch.setitem(compat.PRIVATE_APIS, "gone", ("jax._src.core.no_such_api", "jax._src.no_such_module.thing"))
  with pytest.raises(compat.JaxAPIError) as err:
    compat.get("gone")
  msg = str(err.value)
  assert "jax._src.core.no_such_api" in msg and "jax._src.no_such_module.thing" in msg
  assert jax.__version__ in msg and compat.SUPPORTED_JAX in msg
  assert isinstance(err.value, ImportError) and not isinstance(err.value, AttributeError)
  assert compat.missing() == ["gone"]
  with pytest.raises(compat.JaxAPIError, match="no_such_api"):
    compat.check()


def test_the_first_path_the_jax_has_wins(monkeypatch):
  monkeypatch.setitem(compat.PRIVATE_APIS, "fallback", ("jax._src.core.no_such_api", "jax._src.core.ManualAxisType"))
  from jax._src import core
  assert compat.get("fallback") is core.ManualAxisType


def test_no_other_module_imports_jax_private_apis():
  offenders = []
  for path in sorted((ROOT / "jaxconv").rglob("*.py")):
    if path.name == "_jax_compat.py":
      continue
    for n, line in enumerate(path.read_text().splitlines(), 1):
      if re.search(r"\bjax\._src\b", line):
        offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
  assert not offenders, "\n".join(offenders)
