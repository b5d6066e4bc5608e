"""The suite's float64 numpy reference (conv_utils.ref_conv / ref_conv_vjp) agrees with lax in float64.

Every other test trusts that reference, so it is checked here against lax.conv_general_dilated itself on
named and random configurations (kept few: XLA:CPU compiles a float64 convolution in seconds)."""

from __future__ import annotations

import numpy as np
import pytest

import conv_utils as cu
from test_conv_vs_lax import CASES

REF_CASES = ["perm_HWNC", "cdn_perm_3d", "negative_pad", "lhs_dilation", "all_dilations_1d",
             "depthwise_mult2_nchw", "batch_groups2", "zero_in_channels", "same_even_window_stride"]


def _check(cfg):
  lhs, rhs, kw = cu.materialize(cfg)
  want = cu.lax_ref_conv(lhs, rhs, **kw)
  got = cu.ref_conv(lhs, rhs, **kw)
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=repr(cfg))
  ct = cu.randn(np.random.default_rng(1), want.shape, np.float64)
  for a, b in zip(cu.ref_conv_vjp(lhs, rhs, ct, **kw), cu.lax_ref_conv_vjp(lhs, rhs, ct, **kw)):
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=repr(cfg))


@pytest.mark.parametrize("name", REF_CASES)
def test_reference_matches_lax_named(name):
  _check(CASES[name](dtype="float64", seed=cu.seed_of("ref", name)))


@pytest.mark.parametrize("i", range(6))
def test_reference_matches_lax_random(i):
  _check(cu.fuzz_cfgs("float64", 6, salt="reference")[i])
