// The 2-D view of a channels-last depthwise problem that the register stencil (reg.cu), the tensor-core 7x7 (mma.cu)
// and the Hopper TMA kernel (tma_sm90.cu) share: a source plane stack -> a destination plane stack, D folded into the
// batch.
#pragma once

#include <cstdint>

#include "core/conv_params.h"
#include "kernels/shared/kernels.h"

namespace jaxconv {
namespace cuda {

struct DwPlane {
  int64_t n = 0, c = 0;  // images x D positions; channels
  int64_t src_rows = 0, src_cols = 0, dst_rows = 0, dst_cols = 0;
  int64_t kh = 0, kw = 0, sh = 1, sw = 1;
  int64_t ph = 0, pw = 0;  // pads on the source's low side (the flipped data gradient's: k - 1 - pad_lo)
  bool flip = false;       // the filter taps reversed
};

// The forward (and the filter gradient, which walks the forward's geometry): x -> y. The data gradient: dy -> dx;
// at unit stride it is the forward of dy with the filter flipped and pads k - 1 - pad_lo, else (flip false) the
// strides and pads stay the forward's and the caller decides whether it has a kernel for them. False unless
// channels-last, depthwise with multiplier 1, no dilation, every extent >= 1, coordinates well inside 32 bits, and a
// D window of 1 at stride 1 without padding (each D position maps onto itself: part of the batch).
inline bool DwPlaneOf(const ConvParams& p, Op op, DwPlane* out) {
  if (p.layout[0] != kChannelsLast) return false;
  const int64_t c = p.c[0];
  if (p.groups[0] != c || p.k[0] != c || p.batch_groups[0] != 1 || p.n[0] < 1 || c < 1) return false;
  for (int d = 0; d < 3; ++d) {
    if (p.rhs_dil[d] != 1 || p.lhs_dil[d] != 1 || p.in[d] < 1 || p.out[d] < 1 || p.win[d] < 1) return false;
    if (p.in[d] > (1 << 24) || p.out[d] > (1 << 24) || p.stride[d] > (1 << 20)) return false;
    if (p.pad_lo[d] < -(1 << 20) || p.pad_lo[d] > (1 << 20)) return false;
  }
  if (p.win[0] != 1 || p.stride[0] != 1 || p.pad_lo[0] != 0 || p.in[0] != p.out[0]) return false;
  DwPlane v;
  v.n = p.n[0] * p.in[0];
  v.c = c;
  v.kh = p.win[1];
  v.kw = p.win[2];
  v.sh = p.stride[1];
  v.sw = p.stride[2];
  v.ph = p.pad_lo[1];
  v.pw = p.pad_lo[2];
  if (op != Op::kDgrad) {
    v.src_rows = p.in[1], v.src_cols = p.in[2], v.dst_rows = p.out[1], v.dst_cols = p.out[2];
  } else {
    v.src_rows = p.out[1], v.src_cols = p.out[2], v.dst_rows = p.in[1], v.dst_cols = p.in[2];
    if (v.sh == 1 && v.sw == 1) {
      v.flip = true;
      v.ph = v.kh - 1 - v.ph;
      v.pw = v.kw - 1 - v.pw;
    }
  }
  *out = v;
  return true;
}

}  // namespace cuda
}  // namespace jaxconv
