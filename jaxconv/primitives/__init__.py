"""The three convolution primitives (rules.py: shapes, binding, differentiation, batching), their lowerings to the
FFI custom calls (lowering.py) and their sharding rules (sharding.py)."""

from jaxconv.primitives import lowering  # noqa: F401  (registers the lowerings)
from jaxconv.primitives.rules import (activation_fn, conv_dgrad, conv_dgrad_p, conv_fwd, conv_fwd_p, conv_wgrad,
                                      conv_wgrad_p, dgrad_shape, fwd_shape, wgrad_shape)

__all__ = ["activation_fn", "conv_dgrad", "conv_dgrad_p", "conv_fwd", "conv_fwd_p", "conv_wgrad", "conv_wgrad_p",
           "dgrad_shape", "fwd_shape", "wgrad_shape"]
