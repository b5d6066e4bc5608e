// The stencil view of a depthwise forward or data gradient (groups == c == k, batch_groups == 1; w is (K, 1, taps):
// w[c, 0, f]) that the vector (vec.cu), tiled (tiled.cu) and gather (gather.cu) kernels share:
//   fwd:   y[n, c, o]  = act(bias[c] + sum_f x[n, c, i(o, f)] * w[c, f])
//   dgrad: dx[n, c, i] = sum_{f, o: i(o, f) == i} dy[n, c, o] * w[c, f]
// are both "dst[t] = sum_f src[q(t, f)] * w[f]" with q = t*alpha + beta + f*gamma per dim, valid iff q >= 0,
// q % delta == 0, q / delta < lim.
#pragma once

#include <cstdint>

#include "core/conv_params.h"
#include "core/types.h"
#include "kernels/shared/common.cuh"

namespace jaxconv {
namespace cuda {

struct DwArgs {
  int64_t n, c, tsp[3], taps[3];
  int64_t alpha[3], beta[3], gamma[3], delta[3], lim[3];
  int64_t sN, sC, sS[3];  // source
  int64_t dN, dC, dS[3];  // destination
  int64_t wC, wF[3];
  int64_t ext[3], off[3];  // tiled kernel: staged extent and tap offset per dim
  int64_t tl[3], ntl[3], ctiles, tiles;
  int act, has_bias, cl;
};

// The view of op (kFwd: x -> y with the forward's activation and bias; kDgrad: dy -> dx, the taps walked backwards).
inline DwArgs MakeDwArgs(const ConvParams& p, Op op) {
  const Strides5 xs = XStrides(p), ys = YStrides(p), ws = WStrides(p);
  const bool fwd = op == Op::kFwd;
  const Strides5& src = fwd ? xs : ys;
  const Strides5& dst = fwd ? ys : xs;
  DwArgs g{};
  g.n = p.n[0];
  g.c = p.c[0];
  g.cl = p.layout[0] == kChannelsLast;
  for (int d = 0; d < 3; ++d) {
    g.tsp[d] = fwd ? p.out[d] : p.in[d];
    g.taps[d] = p.win[d];
    g.alpha[d] = fwd ? p.stride[d] : p.lhs_dil[d];
    g.beta[d] = fwd ? -p.pad_lo[d] : p.pad_lo[d];
    g.gamma[d] = fwd ? p.rhs_dil[d] : -p.rhs_dil[d];
    g.delta[d] = fwd ? p.lhs_dil[d] : p.stride[d];
    g.lim[d] = fwd ? p.in[d] : p.out[d];
    g.sS[d] = src.s[2 + d];
    g.dS[d] = dst.s[2 + d];
    g.wF[d] = ws.s[2 + d];
  }
  g.sN = src.s[0];
  g.sC = src.s[1];
  g.dN = dst.s[0];
  g.dC = dst.s[1];
  g.wC = ws.s[0];
  g.act = fwd ? static_cast<int>(p.activation[0]) : static_cast<int>(kActNone);
  g.has_bias = fwd ? static_cast<int>(p.has_bias[0]) : 0;
  return g;
}

// Destination elements of the view (the kernels' outputs).
inline int64_t DwDstElements(const DwArgs& g) { return g.n * g.c * g.tsp[0] * g.tsp[1] * g.tsp[2]; }

}  // namespace cuda
}  // namespace jaxconv
