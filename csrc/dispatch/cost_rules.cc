// auto's cost rules (cost_rules.h): the measured reasons auto passes over a variant that applies. In their own file so
// that a rule changed after a measurement rebuilds this file and the registry, not the kernels.
#include "dispatch/cost_rules.h"

#include "dispatch/rules.h"

namespace jaxconv {

// Long 1-D windows keep the tiled long1d kernel; shorter ones go to the families after it.
std::string PreferLongWindow(const Problem& pr) {
  return pr.p.win[2] >= 64 ? std::string() : "auto takes long1d for windows of 64 taps or more";
}

// Tensor cores beat the few-channel kernels once there are 32+ outputs per pixel (or 16 -> 16 and wider), except on
// tiny first layers (<= 2^21 multiply-adds) whose channels the tensor-core route pads: its staging launches cost more
// than the few-channel family's one kernel. Where neither the few-channel nor the depthwise family is written for the
// problem, the tensor cores are preferred at any width.
std::string PreferTensorCores(const Problem& pr) {
  const ConvParams& p = pr.p;
  if (!SmallChannelApplies(p) && !DepthwiseApplies(p)) return {};
  const bool unrolled = p.c[0] * DTypeBytes(pr.in) < 16 && SpatialCount(p.win) >= 2;
  const bool tiny_first_layer = SmallChannelApplies(p) && ConvMacs(p) <= (int64_t(1) << 21) && !unrolled;
  const bool wide = p.k[0] >= 32 || (p.k[0] >= 16 && p.c[0] >= 16);
  if (!wide) return "auto takes the few-channel or depthwise kernels below 32 output channels";
  if (tiny_first_layer) return "auto takes the few-channel kernels for tiny first layers";
  return {};
}

// The padded-k Hopper kernels against XLA's convolution, where k is off the alignment: measured on random problems,
// they win on windows over 32+ input channels up to 2^31 multiply-adds (the staging's pad and crop are small beside
// the GEMM there) and on 16-bit filter gradients of dilated filters, where XLA's convolution is slow at any size.
// On 1x1 windows, fewer input channels and larger problems XLA matches or beats them, and under 8 output channels
// (none measured) most of each padded tile would be empty.
std::string PreferPaddedK(const Problem& pr) {
  const ConvParams& p = pr.p;
  if (p.k[0] < 8) return "auto leaves fewer than 8 output channels to XLA";
  const bool dilated = p.rhs_dil[0] > 1 || p.rhs_dil[1] > 1 || p.rhs_dil[2] > 1;
  if (pr.op == Op::kWgrad && DTypeBytes(pr.in) == 2 && dilated) return {};
  if (p.c[0] >= 32 && SpatialCount(p.win) > 1 && ConvMacs(p) <= (int64_t(1) << 31)) return {};
  return "auto leaves odd k to XLA on 1x1 windows, under 32 input channels and past 2^31 multiply-adds";
}

// The general depthwise kernels (shared-memory tiles, per-element gathers) against XLA's convolution: measured on
// random problems, with channels off the 16-byte vector they access channels one element at a time and ran several
// times slower than XLA in every op, while with aligned channels (dilated or strided windows the vector kernels do
// not take) they beat it.
std::string PreferDepthwiseVectors(const Problem& pr) {
  if (pr.p.c[0] * DTypeBytes(pr.in) % 16 == 0) return {};
  return "auto leaves depthwise channels off the 16-byte vector to XLA";
}

}  // namespace jaxconv
