"""Inputs no well-behaved caller sends: the native handlers and the autotuning cache reader must refuse or ignore them,
never crash, hang or loop over a declared geometry that the buffers do not hold.

- Empty operands with a huge declared geometry, through a direct jax.ffi.ffi_call (no Python checks in the way):
  an empty result or an empty reduction runs no kernel (csrc/ffi/ffi_common.h EmptyOpOf).
- Magnitudes past the kernels' bounds in the params (csrc/core/conv_params.h DecodeParams): refused before any
  product of them is formed, through the extension and through a direct FFI call.
- The autotuning cache file (jaxconv/tuning/cache.py): any content, any kind of file, warns and is ignored.

The calls that would run for minutes (or block, for a FIFO) without the code under test run in a child process or
thread with a generous limit, so that a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxconv
from jaxconv import _native
from jaxconv.spec import ConvSpec
from jaxconv.tuning import cache as cache_mod

# The largest spatial extent the kernels take: a window of this many taps per output would take hours to loop over.
HUGE = 2 ** 32


def _params(spec, n, c, k, **override):
  """Packed params with some fields overwritten (bypassing ConvSpec's own consistency)."""
  p = spec.ffi_params(n, c, k)
  for field, values in override.items():
    off = _native.param_offset(field)
    values = values if isinstance(values, (list, tuple)) else [values]
    p[off:off + len(values)] = values
  return p


def _ffi(target, out_shape, out_dtype, params, *operands):
  """The target called directly with the results its handler declares: on the GPU the result and an empty
  workspace, as the lowering emits them."""
  out = jax.ShapeDtypeStruct(out_shape, out_dtype)
  if jax.default_backend() == "cpu":
    call = jax.ffi.ffi_call(target, out)
    return jax.jit(lambda *a: call(*a, params=params))(*operands)
  call = jax.ffi.ffi_call(target, (out, jax.ShapeDtypeStruct((0,), jnp.uint8)))
  return jax.jit(lambda *a: call(*a, params=params)[0])(*operands)


# ---- empty operands, huge declared geometry -----------------------------------------------------------------

def _empty_reduction_case(dtype, op):
  """A 1-D channels-first problem with no input channels (every operand but the result empty) and a window of HUGE
  taps: the result must be zeros without any loop over the window (128 outputs of 2^32 taps each)."""
  spec = ConvSpec(layout="channels_first", in_spatial=(HUGE,), window=(HUGE,), strides=(1,), padding=((0, 0),),
                  lhs_dilation=(1,), rhs_dilation=(1,))
  n, c, k = 8, 0, 16
  params = spec.ffi_params(n, c, k)
  x = jnp.zeros((n, c, HUGE), dtype)
  w = jnp.zeros((k, c, HUGE), dtype)
  dy = jnp.ones((n, k, 1), dtype)
  if op == "fwd":
    return _ffi("jaxconv_fwd", (n, k, 1), dtype, params, x, w, jnp.zeros((0,), dtype))
  if op == "dgrad":  # dx is empty too (no channels): nothing to write
    return _ffi("jaxconv_dgrad", (n, c, HUGE), dtype, params, dy, w)
  return _ffi("jaxconv_wgrad", (k, c, HUGE), dtype, params, x, dy)


def _run_empty_cases():
  jaxconv.set_debug_poison(True)  # outputs start as NaN (or 0xFF): a result of zeros was written
  for dtype, op in [(jnp.float32, "fwd"), (jnp.bfloat16, "fwd"), (jnp.int8, "fwd"), (jnp.float32, "dgrad"),
                    (jnp.float32, "wgrad")]:
    y = np.asarray(_empty_reduction_case(dtype, op).astype(jnp.float32))
    assert y.size == 0 or (np.all(y == 0) and y.shape == (8, 16, 1)), (dtype, op, y)
    print(f"ok {jnp.dtype(dtype).name} {op} {y.shape}", flush=True)
  # An empty result (no batch) with the same geometry: nothing to compute at all.
  spec = ConvSpec(layout="channels_last", in_spatial=(HUGE,), window=(3,), strides=(1,), padding=((0, 0),),
                  lhs_dilation=(1,), rhs_dilation=(1,))
  y = _ffi("jaxconv_fwd", (0, HUGE - 2, 4), jnp.float32, spec.ffi_params(0, 5, 4), jnp.zeros((0, HUGE, 5)),
           jnp.ones((3, 5, 4)), jnp.zeros((0,)))
  assert y.shape == (0, HUGE - 2, 4)
  print("ok empty result", flush=True)


def test_empty_operands_with_huge_geometry_run_no_kernel():
  code = (f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import test_robustness as t; "
          "t._run_empty_cases()")
  # The limit only keeps a regression from hanging the suite: the calls take milliseconds, a kernel looping over the
  # declared window hours.
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  assert proc.stdout.count("ok ") == 6, proc.stdout


# ---- DecodeParams: magnitudes refused before any arithmetic on them --------------------------------------------

_SPEC = ConvSpec(layout="channels_last", in_spatial=(5, 7), window=(3, 3), strides=(1, 1), padding=((1, 1), (1, 1)),
                 lhs_dilation=(1, 1), rhs_dilation=(1, 1))

BAD_PARAMS = [  # (field overrides, the words DecodeParams' message carries)
    (dict(**{"in": [1, 2 ** 40, 7]}), "in (above 2^32)"),
    (dict(win=[1, 3, 2 ** 33]), "win (above 2^32)"),
    (dict(stride=[1, 2 ** 31, 1]), "stride (above 2^30)"),
    (dict(lhs_dil=[1, 1, 2 ** 62]), "lhs_dil (above 2^30)"),
    (dict(rhs_dil=[1, 2 ** 40, 1]), "rhs_dil (above 2^30)"),
    (dict(pad_lo=[0, -(2 ** 50), 1]), "pad_lo (magnitude above 2^30)"),
    (dict(pad_hi=[0, 1, 2 ** 62]), "pad_hi (magnitude above 2^30)"),
    (dict(out=[1, 5, 8]), "out (inconsistent"),
]


@pytest.mark.parametrize("override,words", BAD_PARAMS)
def test_decode_params_refuses_huge_attributes_through_the_extension(override, words):
  params = _params(_SPEC, 2, 3, 4, **override)
  with pytest.raises(ValueError, match=re.escape(words)):
    _native.ext().resolve("fwd", [int(v) for v in params], "float32", "float32", None)


@pytest.mark.parametrize("override,words", BAD_PARAMS[:4])
def test_decode_params_refuses_huge_attributes_in_the_handler(override, words):
  params = _params(_SPEC, 2, 3, 4, **override)
  x, w = jnp.ones((2, 5, 7, 3)), jnp.ones((3, 3, 3, 4))
  with pytest.raises(Exception, match=re.escape(words)) as info:
    np.asarray(_ffi("jaxconv_fwd", (2, 5, 7, 4), jnp.float32, params, x, w, jnp.zeros((0,))))
  assert "jaxconv_fwd" in str(info.value)


# ---- the autotuning cache reader ---------------------------------------------------------------------------

@pytest.fixture
def cache_file(tmp_path, monkeypatch):
  monkeypatch.setenv("JAXCONV_CACHE_DIR", str(tmp_path))
  return tmp_path / cache_mod.CACHE_FILE


def _nested(depth):
  return "[" * depth + "]" * depth


CONTENTS = {
    "algorithm_is_a_list": {"format": 1, "entries": {"k": {"algorithm": ["direct"]}}},
    "algorithm_is_a_dict": {"format": 1, "entries": {"k": {"algorithm": {"name": "direct"}}}},
    "entry_is_a_number": {"format": 1, "entries": {"k": 7}},
    "entries_is_a_list": {"format": 1, "entries": [["k", {"algorithm": "direct"}]]},
    "unknown_algorithm": {"format": 1, "entries": {"k": {"algorithm": "winograd_fft_9000"}}},
    "top_level_string": "direct",
}


@pytest.mark.parametrize("name", sorted(CONTENTS))
def test_cache_contents_of_any_type_warn_and_are_ignored(name, cache_file):
  cache_file.write_text(json.dumps(CONTENTS[name]))
  with pytest.warns(UserWarning, match="autotuning cache"):
    assert cache_mod.lookup("k") is None
  assert cache_mod.load_cache() == {}


def test_deeply_nested_json_warns_and_is_ignored(cache_file):
  cache_file.write_text('{"format": 1, "entries": {"k": ' + _nested(200_000) + "}}")
  with pytest.warns(UserWarning, match="autotuning cache"):
    assert cache_mod.lookup("k") is None


def test_a_valid_entry_next_to_bad_ones_is_kept(cache_file):
  cache_file.write_text(json.dumps({"format": 1, "entries": {"good": {"algorithm": "direct"},
                                                             "bad": {"algorithm": ["direct"]}}}))
  with pytest.warns(UserWarning, match="algorithms this jaxconv does not have"):
    assert cache_mod.lookup("good") == "direct"
  assert cache_mod.lookup("bad") is None


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
def test_a_fifo_as_the_cache_file_warns_and_never_blocks(cache_file):
  os.mkfifo(cache_file)
  result, caught = {}, []

  def read():
    with warnings.catch_warnings(record=True) as w:
      warnings.simplefilter("always")
      result["value"] = cache_mod.lookup("k")
    caught.extend(w)

  t = threading.Thread(target=read, daemon=True)
  t.start()
  t.join(timeout=120)
  if t.is_alive():  # unblock the reader (a writer opening the FIFO) before failing
    with open(cache_file, "w"):
      pass
    pytest.fail("reading a FIFO as the autotuning cache blocked")
  assert result == {"value": None}
  assert any("not a regular file" in str(w.message) for w in caught), [str(w.message) for w in caught]


def test_a_directory_as_the_cache_file_warns(cache_file):
  cache_file.mkdir()
  with pytest.warns(UserWarning, match="not a regular file"):
    assert cache_mod.load_cache() == {}
