// integer.direct: the integer family's floor. The forward of every configuration of conv_params.h (both layouts,
// strides, negative and large padding, lhs and rhs dilation, feature and batch groups, 1-3 spatial dims) for integer
// and bool operands, with the semantics of the CPU kernel (csrc/cpu/conv_int.h) and XLA: operands widened to the
// accumulator (sign extension for signed types, zero extension for unsigned ones, bool as 0/1), products and sums
// modulo 2^32 when the result has at most 32 bits and modulo 2^64 otherwise (and for bool results, whose count of true
// products must not wrap to zero), then truncated to the result type; a bool result is the count's being nonzero.
//
// One thread per output element (grid-stride), output channel fastest in channels-last so that neighbouring threads
// read one input pixel's channels; the tap loop skips the taps whose source is padding or a dilation hole in O(1) per
// dim. Every output element is written (0 for an empty sum). lax has no gradients of integer convolutions: fwd only.
#include <cstdint>

#include "dispatch/variant.h"
#include "kernels/shared/common.cuh"

namespace jaxconv {
namespace cuda {
namespace {

constexpr int kThreads = 256;

struct IntArgs {
  int64_t total;                              // output elements
  int64_t nb, k, ku, cu, units;               // y batch, outputs; per unit: outputs ku, input channels cu
  int batch_units, channels_last;
  int64_t in[3], win[3], out[3], stride[3], pad_lo[3], lhs_dil[3], rhs_dil[3];
  Strides5 xs, ws, ys;
};

template <class T, class Acc>
__device__ __forceinline__ Acc Widen(T v) {
  if constexpr (std::is_same<T, bool>::value) {
    return static_cast<Acc>(v ? 1 : 0);
  } else if constexpr (std::is_signed<T>::value) {
    return static_cast<Acc>(static_cast<int64_t>(v));  // sign extension, then modulo 2^bits(Acc)
  } else {
    return static_cast<Acc>(v);
  }
}

template <class Acc>
__device__ __forceinline__ void Store(DType t, void* y, int64_t i, Acc acc) {
  switch (t) {
    case DType::kI8: case DType::kU8: static_cast<uint8_t*>(y)[i] = static_cast<uint8_t>(acc); break;
    case DType::kI16: case DType::kU16: static_cast<uint16_t*>(y)[i] = static_cast<uint16_t>(acc); break;
    case DType::kI32: case DType::kU32: static_cast<uint32_t*>(y)[i] = static_cast<uint32_t>(acc); break;
    case DType::kI64: case DType::kU64: static_cast<uint64_t*>(y)[i] = static_cast<uint64_t>(acc); break;
    default: static_cast<uint8_t*>(y)[i] = acc != 0 ? 1 : 0; break;  // kPred
  }
}

// The first tap f >= 0 with o*stride - pad_lo + f*rhs_dil >= 0 and on the lhs-dilation grid, and the step between
// valid taps, for one dim; *count = how many valid taps (0 when none).
__device__ __forceinline__ void TapRange(int64_t base, int64_t win, int64_t rhs_dil, int64_t lhs_dil, int64_t in,
                                         int64_t* first, int64_t* step, int64_t* count) {
  // q(f) = base + f * rhs_dil must satisfy q >= 0, q % lhs_dil == 0, q / lhs_dil < in. Scanning taps costs at most
  // lhs_dil probes to find the grid phase; larger dilations with few taps simply probe each tap.
  int64_t f0 = base >= 0 ? 0 : DivNN(-base + rhs_dil - 1, rhs_dil);
  *count = 0;
  *first = f0;
  *step = 1;
  if (f0 >= win) return;
  if (lhs_dil == 1) {
    // q < in  <=>  f < (in - base) / rhs_dil (ceil)
    const int64_t lim = in - base;  // may be <= 0
    const int64_t f_end = lim <= 0 ? 0 : DivNN(lim + rhs_dil - 1, rhs_dil);
    const int64_t end = f_end < win ? f_end : win;
    *count = end > f0 ? end - f0 : 0;
    return;
  }
  // General lhs dilation: valid taps form an arithmetic progression of step lhs_dil / gcd(rhs_dil, lhs_dil).
  int64_t a = rhs_dil % lhs_dil, b = lhs_dil;
  while (a != 0) { const int64_t t = b % a; b = a; a = t; }
  const int64_t g = b;  // gcd(rhs_dil, lhs_dil)
  const int64_t stp = lhs_dil / g;
  int64_t f = f0;
  for (int64_t j = 0; j < stp && f < win; ++j, ++f) {
    const int64_t q = base + f * rhs_dil;
    if (q % lhs_dil == 0) break;
  }
  if (f >= win || (base + f * rhs_dil) % lhs_dil != 0) return;
  // q / lhs_dil < in  <=>  q <= (in - 1) * lhs_dil
  const int64_t qmax = (in - 1) * lhs_dil;
  const int64_t q = base + f * rhs_dil;
  if (q > qmax) return;
  const int64_t n_fit = DivNN(qmax - q, rhs_dil * stp) + 1;
  const int64_t n_win = DivNN(win - 1 - f, stp) + 1;
  *first = f;
  *step = stp;
  *count = n_fit < n_win ? n_fit : n_win;
}

template <class T, class Acc>
__global__ void __launch_bounds__(kThreads) IntFwdKernel(const IntArgs a, const T* __restrict__ x,
                                                         const T* __restrict__ w, DType out_t, void* __restrict__ y) {
  for (int64_t e = blockIdx.x * int64_t(kThreads) + threadIdx.x; e < a.total; e += int64_t(gridDim.x) * kThreads) {
    // Decompose e: channels-last (nb, od, oh, ow, kk), channels-first (nb, kk, od, oh, ow).
    int64_t rem = e, kk, o[3], nb;
    if (a.channels_last) {
      kk = rem % a.k; rem /= a.k;
      o[2] = rem % a.out[2]; rem /= a.out[2];
      o[1] = rem % a.out[1]; rem /= a.out[1];
      o[0] = rem % a.out[0]; nb = rem / a.out[0];
    } else {
      o[2] = rem % a.out[2]; rem /= a.out[2];
      o[1] = rem % a.out[1]; rem /= a.out[1];
      o[0] = rem % a.out[0]; rem /= a.out[0];
      kk = rem % a.k; nb = rem / a.k;
    }
    const int64_t u = kk / a.ku;
    const int64_t n = a.batch_units ? u * a.nb + nb : nb;
    const int64_t c_base = a.batch_units ? 0 : u * a.cu;
    int64_t first[3], step[3], count[3];
#pragma unroll
    for (int d = 0; d < 3; ++d) {
      TapRange(o[d] * a.stride[d] - a.pad_lo[d], a.win[d], a.rhs_dil[d], a.lhs_dil[d], a.in[d], &first[d], &step[d],
               &count[d]);
    }
    Acc acc = 0;
    const T* xn = x + n * a.xs.s[0] + c_base * a.xs.s[1];
    const T* wk = w + kk * a.ws.s[0];
    for (int64_t j0 = 0; j0 < count[0]; ++j0) {
      const int64_t f0 = first[0] + j0 * step[0];
      const int64_t i0 = (o[0] * a.stride[0] - a.pad_lo[0] + f0 * a.rhs_dil[0]) / a.lhs_dil[0];
      for (int64_t j1 = 0; j1 < count[1]; ++j1) {
        const int64_t f1 = first[1] + j1 * step[1];
        const int64_t i1 = (o[1] * a.stride[1] - a.pad_lo[1] + f1 * a.rhs_dil[1]) / a.lhs_dil[1];
        for (int64_t j2 = 0; j2 < count[2]; ++j2) {
          const int64_t f2 = first[2] + j2 * step[2];
          const int64_t i2 = (o[2] * a.stride[2] - a.pad_lo[2] + f2 * a.rhs_dil[2]) / a.lhs_dil[2];
          const T* xp = xn + i0 * a.xs.s[2] + i1 * a.xs.s[3] + i2 * a.xs.s[4];
          const T* wp = wk + f0 * a.ws.s[2] + f1 * a.ws.s[3] + f2 * a.ws.s[4];
          for (int64_t cg = 0; cg < a.cu; ++cg) {
            acc += Widen<T, Acc>(xp[cg * a.xs.s[1]]) * Widen<T, Acc>(wp[cg * a.ws.s[1]]);
          }
        }
      }
    }
    const int64_t dst = nb * a.ys.s[0] + kk * a.ys.s[1] + o[0] * a.ys.s[2] + o[1] * a.ys.s[3] + o[2] * a.ys.s[4];
    Store<Acc>(out_t, y, dst, acc);
  }
}

IntArgs MakeArgs(const ConvParams& p) {
  IntArgs a;
  a.nb = p.n[0] / p.batch_groups[0];
  a.k = p.k[0];
  a.batch_units = p.batch_groups[0] > 1;
  a.units = a.batch_units ? p.batch_groups[0] : p.groups[0];
  a.ku = p.k[0] / a.units;
  a.cu = p.c[0] / p.groups[0];
  a.channels_last = p.layout[0] == kChannelsLast;
  for (int d = 0; d < 3; ++d) {
    a.in[d] = p.in[d];
    a.win[d] = p.win[d];
    a.out[d] = p.out[d];
    a.stride[d] = p.stride[d];
    a.pad_lo[d] = p.pad_lo[d];
    a.lhs_dil[d] = p.lhs_dil[d];
    a.rhs_dil[d] = p.rhs_dil[d];
  }
  a.total = YElements(p);
  a.xs = XStrides(p);
  a.ws = WStrides(p);
  a.ys = YStrides(p);
  return a;
}

template <class T>
cudaError_t LaunchTyped(const IntArgs& a, const void* x, const void* w, DType out_t, void* y, cudaStream_t s) {
  const unsigned grid = GridX(CeilDiv(a.total, kThreads));
  const bool wide = DTypeBytes(out_t) > 4 || out_t == DType::kPred;
  if (wide) {
    IntFwdKernel<T, uint64_t><<<grid, kThreads, 0, s>>>(a, static_cast<const T*>(x), static_cast<const T*>(w), out_t, y);
  } else {
    IntFwdKernel<T, uint32_t><<<grid, kThreads, 0, s>>>(a, static_cast<const T*>(x), static_cast<const T*>(w), out_t, y);
  }
  return cudaGetLastError();
}

}  // namespace
}  // namespace cuda

namespace variants::integer_direct {

std::string Applies(const Problem& pr) {
  if (pr.op != Op::kFwd) return "integer convolutions have a forward op only (lax has no integer gradients)";
  if (!IsInteger(pr.in) || !IsInteger(pr.out)) return "it takes integer and bool operands and results";
  if (pr.p.has_bias[0] != 0 || pr.p.activation[0] != kActNone) return "it fuses no bias or activation";
  return {};
}

size_t Workspace(const Problem&) { return 0; }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  const cuda::IntArgs a = cuda::MakeArgs(pr.p);
  if (a.total == 0) return cudaSuccess;
  switch (pr.in) {
    case DType::kI8: return cuda::LaunchTyped<int8_t>(a, b.a, b.b, pr.out, b.out, s);
    case DType::kI16: return cuda::LaunchTyped<int16_t>(a, b.a, b.b, pr.out, b.out, s);
    case DType::kI32: return cuda::LaunchTyped<int32_t>(a, b.a, b.b, pr.out, b.out, s);
    case DType::kI64: return cuda::LaunchTyped<int64_t>(a, b.a, b.b, pr.out, b.out, s);
    case DType::kU8: return cuda::LaunchTyped<uint8_t>(a, b.a, b.b, pr.out, b.out, s);
    case DType::kU16: return cuda::LaunchTyped<uint16_t>(a, b.a, b.b, pr.out, b.out, s);
    case DType::kU32: return cuda::LaunchTyped<uint32_t>(a, b.a, b.b, pr.out, b.out, s);
    case DType::kU64: return cuda::LaunchTyped<uint64_t>(a, b.a, b.b, pr.out, b.out, s);
    case DType::kPred: return cuda::LaunchTyped<bool>(a, b.a, b.b, pr.out, b.out, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace variants::integer_direct
}  // namespace jaxconv
