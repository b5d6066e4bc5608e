// ConvParams: the one parameter block shared by the Python lowering (jaxconv/spec.py packs it, reading the
// field list from the extension's param_fields()) and every CPU and CUDA handler (which decode and validate
// it). The X-macro below is the single definition of its layout.
//
// Semantics: all three ops describe the same forward relation ("fwd"), padded to 3 spatial dims (a conv with
// fewer spatial dims has leading size-1 dims: in=win=out=1, stride=dil=1, pads 0).
//   Nb = n / batch_groups, Cg = c / groups, Kg = k / groups, Kb = k / batch_groups
//   output channel kk is in feature group g = kk / Kg and batch group b = kk / Kb
//   For an output position o and window tap f (per spatial dim):
//     p = o*stride - pad_lo + f*rhs_dil        (position in the lhs-dilated, padded input)
//     valid iff p >= 0, p % lhs_dil == 0, i = p / lhs_dil < in   (then x index is i)
//   fwd:   y[nb, kk, o]  = act(bias[kk] + sum_{cg, f valid} x[b*Nb + nb, g*Cg + cg, i(o,f)] * w[kk, cg, f])
//   dgrad: dx[b*Nb+nb, g*Cg+cg, i] = sum over (kk in groups g and b, f, o) with i(o,f) == i of dy[nb,kk,o]*w[kk,cg,f]
//   wgrad: dw[kk, cg, f] = sum_{nb, o with f valid} x[b*Nb + nb, g*Cg + cg, i(o,f)] * dy[nb, kk, o]
// Tensor layouts (layout field):
//   kChannelsLast : x (N, D, H, W, C)   w (D, H, W, Cg, K)   y (N/B, OD, OH, OW, K)
//   kChannelsFirst: x (N, C, D, H, W)   w (K, Cg, D, H, W)   y (N/B, K, OD, OH, OW)
// The buffers XLA passes have rank nspatial + 2; the padded leading spatial dims are implicit.
// Inputs x and w share one dtype (f32, f64, bf16, f16); the output dtype is the input dtype or f32 (f64 for
// f64); accumulation is f32 (f64 for f64). bias (fwd only) has the output dtype and k elements, or 0
// elements when has_bias == 0.
#pragma once

#include <cstdint>
#include <string>

namespace jaxconv {

// X(name, count): count int64 values in the packed attribute array, in this order.
#define JAXCONV_PARAM_FIELDS(X)                                                                  \
  X(abi_version, 1) /* kParamsAbiVersion: Python and C++ must agree */                          \
  X(layout, 1)      /* Layout */                                                                 \
  X(nspatial, 1)    /* 1, 2 or 3: rank of the buffers minus 2 */                                 \
  X(n, 1)           /* lhs batch (x and dx); y's batch is n / batch_groups */                    \
  X(c, 1)           /* lhs features */                                                           \
  X(k, 1)           /* output features */                                                        \
  X(groups, 1)      /* feature_group_count */                                                    \
  X(batch_groups, 1) /* batch_group_count; at most one of groups, batch_groups is > 1 */         \
  X(in, 3)          /* lhs spatial sizes (D, H, W) */                                            \
  X(win, 3)         /* window spatial sizes */                                                   \
  X(out, 3)         /* output spatial sizes */                                                   \
  X(stride, 3)      /* window strides, >= 1 */                                                   \
  X(pad_lo, 3)      /* low padding, may be negative */                                           \
  X(pad_hi, 3)      /* high padding, may be negative */                                          \
  X(lhs_dil, 3)     /* lhs (input) dilation, >= 1 */                                             \
  X(rhs_dil, 3)     /* rhs (window) dilation, >= 1 */                                            \
  X(precision, 1)   /* Precision */                                                              \
  X(activation, 1)  /* Activation, fwd only */                                                   \
  X(has_bias, 1)    /* 0 or 1, fwd only */                                                       \
  X(algorithm, 1)   /* the request: 0 auto, a family code or a variant (dispatch/registry.h) */   \
  X(variant, 1)     /* the variant the lowering chose for it, or -1: the handler chooses */      \
  X(poison, 1)      /* 1: fill outputs and scratch with NaN before the kernels (debug mode) */

inline constexpr int64_t kParamsAbiVersion = 2;
// The largest spatial extent, and the largest stride, dilation and padding magnitude, the ops take (the Python layer
// rejects larger ones at trace time with the same bounds).
inline constexpr int64_t kMaxExtent = int64_t(1) << 32;
inline constexpr int64_t kMaxStep = int64_t(1) << 30;

enum Layout : int64_t { kChannelsLast = 0, kChannelsFirst = 1 };
enum Precision : int64_t { kPrecisionDefault = 0, kPrecisionHigh = 1, kPrecisionHighest = 2 };
// kGelu is the tanh approximation, as jax.nn.gelu(approximate=True).
enum Activation : int64_t { kActNone = 0, kActRelu = 1, kActGelu = 2, kActSilu = 3 };
struct ConvParams {
#define JAXCONV_DECLARE_FIELD(name, count) int64_t name[count];
  JAXCONV_PARAM_FIELDS(JAXCONV_DECLARE_FIELD)
#undef JAXCONV_DECLARE_FIELD
};

inline constexpr int64_t kNumParamValues = 0
#define JAXCONV_COUNT_FIELD(name, count) +count
    JAXCONV_PARAM_FIELDS(JAXCONV_COUNT_FIELD)
#undef JAXCONV_COUNT_FIELD
    ;

// Fills *p from the packed values and checks everything that does not depend on the buffers. Returns an empty
// string on success, else a message naming the offending field.
inline std::string DecodeParams(const int64_t* values, int64_t size, ConvParams* p) {
  if (size != kNumParamValues) {
    return "jaxconv: params has " + std::to_string(size) + " values, expected " +
           std::to_string(kNumParamValues) + " (Python and native builds out of sync)";
  }
  int64_t pos = 0;
#define JAXCONV_READ_FIELD(name, count) \
  for (int64_t j = 0; j < count; ++j) p->name[j] = values[pos++];
  JAXCONV_PARAM_FIELDS(JAXCONV_READ_FIELD)
#undef JAXCONV_READ_FIELD
  auto bad = [](const char* what, int64_t v) {
    return std::string("jaxconv: invalid params.") + what + " = " + std::to_string(v);
  };
  if (p->abi_version[0] != kParamsAbiVersion) return bad("abi_version", p->abi_version[0]);
  if (p->layout[0] != kChannelsLast && p->layout[0] != kChannelsFirst) return bad("layout", p->layout[0]);
  if (p->nspatial[0] < 1 || p->nspatial[0] > 3) return bad("nspatial", p->nspatial[0]);
  if (p->n[0] < 0) return bad("n", p->n[0]);
  if (p->c[0] < 0) return bad("c", p->c[0]);
  if (p->k[0] < 0) return bad("k", p->k[0]);
  if (p->groups[0] < 1) return bad("groups", p->groups[0]);
  if (p->batch_groups[0] < 1) return bad("batch_groups", p->batch_groups[0]);
  if (p->groups[0] > 1 && p->batch_groups[0] > 1) return bad("batch_groups (with groups > 1)", p->batch_groups[0]);
  if (p->c[0] % p->groups[0] != 0) return bad("c (not divisible by groups)", p->c[0]);
  if (p->k[0] % p->groups[0] != 0) return bad("k (not divisible by groups)", p->k[0]);
  if (p->k[0] % p->batch_groups[0] != 0) return bad("k (not divisible by batch_groups)", p->k[0]);
  if (p->n[0] % p->batch_groups[0] != 0) return bad("n (not divisible by batch_groups)", p->n[0]);
  for (int d = 0; d < 3; ++d) {
    if (p->in[d] < 0) return bad("in", p->in[d]);
    if (p->win[d] < 0) return bad("win", p->win[d]);
    if (p->out[d] < 0) return bad("out", p->out[d]);
    if (p->stride[d] < 1) return bad("stride", p->stride[d]);
    if (p->lhs_dil[d] < 1) return bad("lhs_dil", p->lhs_dil[d]);
    if (p->rhs_dil[d] < 1) return bad("rhs_dil", p->rhs_dil[d]);
    // Magnitudes first, so that the products below (and the kernels' index arithmetic) cannot overflow int64.
    if (p->in[d] > kMaxExtent) return bad("in (above 2^32)", p->in[d]);
    if (p->win[d] > kMaxExtent) return bad("win (above 2^32)", p->win[d]);
    if (p->out[d] > kMaxExtent) return bad("out (above 2^32)", p->out[d]);
    if (p->stride[d] > kMaxStep) return bad("stride (above 2^30)", p->stride[d]);
    if (p->lhs_dil[d] > kMaxStep) return bad("lhs_dil (above 2^30)", p->lhs_dil[d]);
    if (p->rhs_dil[d] > kMaxStep) return bad("rhs_dil (above 2^30)", p->rhs_dil[d]);
    if (p->pad_lo[d] > kMaxStep || p->pad_lo[d] < -kMaxStep) return bad("pad_lo (magnitude above 2^30)", p->pad_lo[d]);
    if (p->pad_hi[d] > kMaxStep || p->pad_hi[d] < -kMaxStep) return bad("pad_hi (magnitude above 2^30)", p->pad_hi[d]);
    // The output size must follow from the other values (as lax computes it), so that no kernel can read or
    // write past a buffer because of an inconsistent attribute.
    const int64_t in_dil = p->in[d] == 0 ? 0 : (p->in[d] - 1) * p->lhs_dil[d] + 1;
    const int64_t win_dil = p->win[d] == 0 ? 0 : (p->win[d] - 1) * p->rhs_dil[d] + 1;
    const int64_t span = in_dil + p->pad_lo[d] + p->pad_hi[d] - win_dil;
    const int64_t expect = span < 0 ? 0 : span / p->stride[d] + 1;
    if (p->out[d] != expect) return bad("out (inconsistent with in/win/stride/pads/dilations)", p->out[d]);
    if (d < 3 - p->nspatial[0] &&
        (p->in[d] != 1 || p->win[d] != 1 || p->out[d] != 1 || p->pad_lo[d] != 0 || p->pad_hi[d] != 0)) {
      return bad("padded spatial dim (must be size 1, no padding)", d);
    }
  }
  if (p->precision[0] < kPrecisionDefault || p->precision[0] > kPrecisionHighest) return bad("precision", p->precision[0]);
  if (p->activation[0] < kActNone || p->activation[0] > kActSilu) return bad("activation", p->activation[0]);
  if (p->has_bias[0] != 0 && p->has_bias[0] != 1) return bad("has_bias", p->has_bias[0]);
  if (p->algorithm[0] < 0) return bad("algorithm", p->algorithm[0]);  // the registry checks the rest
  if (p->variant[0] < -1) return bad("variant", p->variant[0]);
  if (p->poison[0] != 0 && p->poison[0] != 1) return bad("poison", p->poison[0]);
  return {};
}

// Element counts of the three tensors (64-bit throughout: tensors may exceed 2^31 elements).
inline int64_t SpatialCount(const int64_t s[3]) { return s[0] * s[1] * s[2]; }
inline int64_t XElements(const ConvParams& p) { return p.n[0] * p.c[0] * SpatialCount(p.in); }
inline int64_t WElements(const ConvParams& p) { return p.k[0] * (p.c[0] / p.groups[0]) * SpatialCount(p.win); }
inline int64_t YElements(const ConvParams& p) { return (p.n[0] / p.batch_groups[0]) * p.k[0] * SpatialCount(p.out); }

// Expected buffer dims (rank nspatial + 2) for x, w and y in the params' layout; used to validate buffers.
enum class Tensor { kX, kW, kY };
inline int ExpectedDims(const ConvParams& p, Tensor t, int64_t dims[5]) {
  const int ns = static_cast<int>(p.nspatial[0]);
  const int64_t* sp = t == Tensor::kX ? p.in : t == Tensor::kW ? p.win : p.out;
  int64_t a, b;  // the two non-spatial dims, outer first in channels-first order
  switch (t) {
    case Tensor::kX: a = p.n[0]; b = p.c[0]; break;
    case Tensor::kW: a = p.k[0]; b = p.c[0] / p.groups[0]; break;
    default: a = p.n[0] / p.batch_groups[0]; b = p.k[0]; break;
  }
  int r = 0;
  if (p.layout[0] == kChannelsFirst) {
    dims[r++] = a;
    dims[r++] = b;
    for (int d = 3 - ns; d < 3; ++d) dims[r++] = sp[d];
  } else if (t == Tensor::kW) {  // (D, H, W, Cg, K)
    for (int d = 3 - ns; d < 3; ++d) dims[r++] = sp[d];
    dims[r++] = b;
    dims[r++] = a;
  } else {  // (N, D, H, W, C)
    dims[r++] = a;
    for (int d = 3 - ns; d < 3; ++d) dims[r++] = sp[d];
    dims[r++] = b;
  }
  return r;
}

}  // namespace jaxconv
