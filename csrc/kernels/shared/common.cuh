// Shared by the CUDA kernel families: dtype conversions, the fwd epilogue (identical to the CPU one), tensor
// strides derived from ConvParams, and the small host API (kernels.h) types. Accumulation is f32 (f64 for f64)
// everywhere; float32 data reaches tensor cores only in the implicit_gemm family (TF32 at DEFAULT, 3xTF32 at
// HIGH / HIGHEST), so elsewhere HIGHEST is true FP32. 16-bit data also uses them in the small family's 4 -> 4
// pixel kernel (products of 16-bit values are exact in f32).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/conv_params.h"
#include "kernels/shared/kernels.h"

namespace jaxconv {
namespace cuda {

template <class T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };

__device__ __forceinline__ float ToAcc(float v) { return v; }
__device__ __forceinline__ double ToAcc(double v) { return v; }
__device__ __forceinline__ float ToAcc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToAcc(__half v) { return __half2float(v); }

template <class TO> __device__ __forceinline__ TO FromAcc(float v);
template <> __device__ __forceinline__ float FromAcc<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 FromAcc<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half FromAcc<__half>(float v) { return __float2half_rn(v); }
template <class TO> __device__ __forceinline__ TO FromAcc(double v);
template <> __device__ __forceinline__ double FromAcc<double>(double v) { return v; }

// Element i of N T's packed little-endian in 32-bit words, converted to Acc (bit operations: no local copies).
template <class T, class Acc, int N> __device__ __forceinline__ void UnpackWords(const unsigned* wd, Acc (&o)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if constexpr (std::is_same<T, float>::value) {
      o[i] = __uint_as_float(wd[i]);
    } else if constexpr (std::is_same<T, double>::value) {
      o[i] = __hiloint2double(static_cast<int>(wd[2 * i + 1]), static_cast<int>(wd[2 * i]));
    } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      o[i] = __uint_as_float(i % 2 == 0 ? wd[i / 2] << 16 : wd[i / 2] & 0xffff0000u);
    } else {
      static_assert(std::is_same<T, __half>::value, "dtype");
      const unsigned bits = i % 2 == 0 ? wd[i / 2] & 0xffffu : wd[i / 2] >> 16;
      o[i] = __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
    }
  }
}

// L raw 8- or 16-byte vectors of N T each (loaded as words, all ahead of their first use) converted to Acc.
template <class T, class Acc, int N, class Raw, int L>
__device__ __forceinline__ void UnpackVectors(const Raw (&raw)[L], Acc (&o)[L][N]) {
  static_assert(sizeof(Raw) == N * sizeof(T), "vector size");
#pragma unroll
  for (int l = 0; l < L; ++l) {
    unsigned wd[sizeof(Raw) / 4];
    memcpy(wd, &raw[l], sizeof(Raw));
    UnpackWords<T, Acc, N>(wd, o[l]);
  }
}

// Loads N consecutive T (8 or 16 bytes, aligned) through the read-only path and converts them to Acc.
template <class T, class Acc, int N> __device__ __forceinline__ void LdGlobalAcc(const T* p, Acc (&o)[N]) {
  static_assert(N * sizeof(T) == 16 || N * sizeof(T) == 8, "vector size");
  if constexpr (N * sizeof(T) == 16) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
    const unsigned wd[4] = {u.x, u.y, u.z, u.w};
    UnpackWords<T, Acc, N>(wd, o);
  } else {
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
    const unsigned wd[2] = {u.x, u.y};
    UnpackWords<T, Acc, N>(wd, o);
  }
}

template <class TO> __device__ __forceinline__ unsigned short Bits16(float v) {
  if constexpr (std::is_same<TO, __nv_bfloat16>::value) return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  else return __half_as_ushort(__float2half_rn(v));
}

// v as TO, packed into the 32-bit words of one 8- or 16-byte vector.
template <class TO, class Acc, int N, int NW>
__device__ __forceinline__ void PackWords(const Acc (&v)[N], unsigned (&wd)[NW]) {
  static_assert(NW * 4 == N * sizeof(TO) && (NW == 2 || NW == 4), "vector size");
#pragma unroll
  for (int i = 0; i < NW; ++i) {
    if constexpr (std::is_same<TO, float>::value) {
      wd[i] = __float_as_uint(v[i]);
    } else if constexpr (std::is_same<TO, double>::value) {
      const double d = v[i / 2];
      wd[i] = static_cast<unsigned>(i % 2 == 0 ? __double2loint(d) : __double2hiint(d));
    } else {
      wd[i] = static_cast<unsigned>(Bits16<TO>(v[2 * i])) | (static_cast<unsigned>(Bits16<TO>(v[2 * i + 1])) << 16);
    }
  }
}

// Stores N TO converted from Acc (8 or 16 bytes, aligned) to global memory.
template <class TO, class Acc, int N> __device__ __forceinline__ void StGlobal(TO* p, const Acc (&v)[N]) {
  constexpr int NW = N * sizeof(TO) / 4;
  unsigned wd[NW];
  PackWords<TO>(v, wd);
  // __stwb (a plain write-back store): nvcc split plain uint2/float4 stores of make_* values into scalar ones.
  if constexpr (NW == 4) __stwb(reinterpret_cast<uint4*>(p), make_uint4(wd[0], wd[1], wd[2], wd[3]));
  else __stwb(reinterpret_cast<uint2*>(p), make_uint2(wd[0], wd[1]));
}

// The sum of v over the 32 lanes of a full warp, every lane getting it (a fixed xor butterfly: deterministic).
template <class A> __device__ __forceinline__ A WarpSum(A v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// a / b for a >= 0, b > 0 without the 64-bit division subroutine call (whose ABI register saves show up as a
// stack frame): a 32-bit division when both fit, else an inline shift-subtract loop (rare: huge tensors).
__device__ __forceinline__ int64_t DivNN(int64_t a, int64_t b) {
  if (((a | b) >> 31) == 0) return static_cast<int64_t>(static_cast<uint32_t>(a) / static_cast<uint32_t>(b));
  const uint64_t ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
  uint64_t q = 0, r = 0;
#pragma unroll 1
  for (int i = 63; i >= 0; --i) {
    r = (r << 1) | ((ua >> i) & 1u);
    if (r >= ub) { r -= ub; q |= uint64_t(1) << i; }
  }
  return static_cast<int64_t>(q);
}

// y = act(v): relu propagates NaN (as jnp.maximum), gelu is the tanh approximation (jax.nn.gelu default),
// silu = x * sigmoid(x).
__device__ __forceinline__ float Activate(float v, int act) {
  switch (act) {
    case kActRelu: return v != v ? v : (v > 0.f ? v : 0.f);
    case kActGelu: {
      const float kS = 0.7978845608028654f;  // sqrt(2/pi)
      return 0.5f * v * (1.f + tanhf(kS * (v + 0.044715f * v * v * v)));
    }
    case kActSilu: return v * (1.f / (1.f + expf(-v)));
    default: return v;
  }
}
__device__ __forceinline__ double Activate(double v, int act) {
  switch (act) {
    case kActRelu: return v != v ? v : (v > 0.0 ? v : 0.0);
    case kActGelu: {
      const double kS = 0.79788456080286535588;
      return 0.5 * v * (1.0 + tanh(kS * (v + 0.044715 * v * v * v)));
    }
    case kActSilu: return v * (1.0 / (1.0 + exp(-v)));
    default: return v;
  }
}

// Element strides of the logical 5-d views x (N, C, D, H, W), w (K, Cg, D, H, W), y (Nb, K, OD, OH, OW) in the
// params' layout: s[0] batch-or-K, s[1] channel, s[2..4] spatial.
struct Strides5 { int64_t s[5]; };

inline Strides5 ActStrides(int64_t n_unused, int64_t ch, const int64_t sp[3], bool channels_last) {
  Strides5 r;
  if (channels_last) {  // (N, D, H, W, C)
    r.s[1] = 1;
    r.s[4] = ch;
    r.s[3] = sp[2] * ch;
    r.s[2] = sp[1] * sp[2] * ch;
    r.s[0] = sp[0] * sp[1] * sp[2] * ch;
  } else {  // (N, C, D, H, W)
    r.s[4] = 1;
    r.s[3] = sp[2];
    r.s[2] = sp[1] * sp[2];
    r.s[1] = sp[0] * sp[1] * sp[2];
    r.s[0] = ch * r.s[1];
  }
  return r;
}
inline Strides5 XStrides(const ConvParams& p) { return ActStrides(p.n[0], p.c[0], p.in, p.layout[0] == kChannelsLast); }
inline Strides5 YStrides(const ConvParams& p) { return ActStrides(p.n[0] / p.batch_groups[0], p.k[0], p.out, p.layout[0] == kChannelsLast); }
inline Strides5 WStrides(const ConvParams& p) {
  const int64_t k = p.k[0], cg = p.c[0] / p.groups[0];
  Strides5 r;
  if (p.layout[0] == kChannelsLast) {  // (D, H, W, Cg, K)
    r.s[0] = 1;
    r.s[1] = k;
    r.s[4] = cg * k;
    r.s[3] = p.win[2] * cg * k;
    r.s[2] = p.win[1] * p.win[2] * cg * k;
  } else {  // (K, Cg, D, H, W)
    r.s[4] = 1;
    r.s[3] = p.win[2];
    r.s[2] = p.win[1] * p.win[2];
    r.s[1] = p.win[0] * p.win[1] * p.win[2];
    r.s[0] = cg * r.s[1];
  }
  return r;
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
// 16-byte vector and TMA accesses need 16-byte aligned bases (XLA's buffers are; the kernels check anyway).
inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
// A compile-time int as a value: dispatch lambdas take it and read decltype(v)::value.
template <int V> using IntC = std::integral_constant<int, V>;
// f(IntC<act>{}) for the run-time activation code: epilogues unrolled over many outputs take the activation as a
// template argument: a run-time switch per element costs a large share of an unrolled epilogue's instructions and
// of its instruction fetches.
template <class F>
__device__ __forceinline__ void WithActivation(int act, F&& f) {
  switch (act) {
    case kActRelu: f(IntC<kActRelu>{}); break;
    case kActGelu: f(IntC<kActGelu>{}); break;
    case kActSilu: f(IntC<kActSilu>{}); break;
    default: f(IntC<kActNone>{});
  }
}
// WithActivation where a kernel instance can have an activation; f(IntC<kActNone>{}) alone in instances that run only
// data gradients (the handlers refuse an activation on them), so those carry one copy of their body, not four.
template <bool kCanActivate, class F>
__device__ __forceinline__ void WithActivationIf(int act, F&& f) {
  if constexpr (kCanActivate) {
    WithActivation(act, static_cast<F&&>(f));
  } else {
    (void)act;
    f(IntC<kActNone>{});
  }
}
inline unsigned GridX(int64_t tiles) {  // grid-stride loops cover the rest
  const int64_t cap = 1 << 30;
  return static_cast<unsigned>(tiles < 1 ? 1 : (tiles > cap ? cap : tiles));
}
// Lets `kernel` take `smem` bytes of dynamic shared memory: above the default 48 KiB a launch needs the opt-in.
template <class Kernel>
cudaError_t AllowDynamicSmem(Kernel kernel, size_t smem) {
  if (smem <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
}
// Persistent grids: *out = the blocks of `kernel` (threads and dynamic shared memory each) resident on the whole GPU
// at once, shared among `share` grid columns, at least 1; cudaErrorNotSupported when not even one block fits an SM.
template <class Kernel>
cudaError_t ResidentBlocks(Kernel kernel, int threads, size_t smem, int64_t share, int64_t* out) {
  int per_sm = 0;
  if (const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
      e != cudaSuccess) {
    return e;
  }
  if (per_sm < 1) return cudaErrorNotSupported;
  const int64_t r = per_sm * MultiprocessorCount() / share;
  *out = r < 1 ? 1 : r;
  return cudaSuccess;
}

// For predicates that depend on residency (plans that only pay off in one wave): the blocks of `kernel` resident on
// the whole of `dev` at once, shared among `share` grid columns; the current device's occupancy where there is one
// (the lowering's and the handler's), one block per SM where the runtime has no device to ask. 0 when not even one
// block fits. Raises the kernel's dynamic shared memory limit first, as its launch will.
template <class Kernel>
int64_t ResidentBlocksOn(const Device& dev, Kernel kernel, int threads, size_t smem, int64_t share) {
  int per_sm = 1;
  if (AllowDynamicSmem(kernel, smem) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess) {
    cudaGetLastError();  // no device (or no such kernel image): leave no sticky error, assume one block per SM
    per_sm = 1;
  }
  if (per_sm < 1) return 0;
  const int64_t r = per_sm * dev.sms / share;
  return r < 1 ? 1 : r;
}

// Expands BODY(T, TO) for the six supported (input, output) dtype pairs; returns cudaErrorInvalidValue for
// any other pair (the handlers validated the pair before, so this is only a guard).
#define JAXCONV_DTYPE_SWITCH(in_dt, out_dt, BODY)                                              \
  do {                                                                                         \
    using ::jaxconv::DType;                                                                 \
    if ((in_dt) == DType::kF32 && (out_dt) == DType::kF32) { BODY(float, float); }                   \
    else if ((in_dt) == DType::kF64 && (out_dt) == DType::kF64) { BODY(double, double); }            \
    else if ((in_dt) == DType::kBF16 && (out_dt) == DType::kBF16) { BODY(__nv_bfloat16, __nv_bfloat16); } \
    else if ((in_dt) == DType::kBF16 && (out_dt) == DType::kF32) { BODY(__nv_bfloat16, float); }     \
    else if ((in_dt) == DType::kF16 && (out_dt) == DType::kF16) { BODY(__half, __half); }            \
    else if ((in_dt) == DType::kF16 && (out_dt) == DType::kF32) { BODY(__half, float); }             \
    else { return cudaErrorInvalidValue; }                                                     \
  } while (0)

// f(T{}, TO{}) for the (input, output) dtype pairs of JAXCONV_DTYPE_SWITCH but (f64, f64), for kernels that only
// accumulate in f32; cudaErrorInvalidValue for any other pair.
template <class F>
cudaError_t WithF32AccTypes(DType in, DType out, F&& f) {
  if (in == DType::kF32 && out == DType::kF32) return f(float{}, float{});
  if (in == DType::kBF16 && out == DType::kBF16) return f(__nv_bfloat16{}, __nv_bfloat16{});
  if (in == DType::kBF16 && out == DType::kF32) return f(__nv_bfloat16{}, float{});
  if (in == DType::kF16 && out == DType::kF16) return f(__half{}, __half{});
  if (in == DType::kF16 && out == DType::kF32) return f(__half{}, float{});
  return cudaErrorInvalidValue;
}
// Whether WithF32AccTypes takes (in, out): kernels that decide before launching whether they run a call.
inline bool IsF32AccPair(DType in, DType out) {
  return WithF32AccTypes(in, out, [](auto, auto) { return cudaSuccess; }) == cudaSuccess;
}

inline size_t AccBytes(DType in) { return in == DType::kF64 ? 8 : 4; }

// The workspace of a filter gradient split `splits` ways: one partial filter per split in the accumulator type (none
// for one split).
inline size_t SplitPartialBytes(const ConvParams& p, DType in, int64_t splits) {
  return splits > 1 ? static_cast<size_t>(splits) * static_cast<size_t>(WElements(p)) * AccBytes(in) : 0;
}
// The splits a launch may use: the planned ones where the workspace holds their partials, else one (unsplit: a caller's
// short buffer gives a correct, less parallel gradient).
inline int64_t SplitsThatFit(const ConvParams& p, DType in, int64_t planned, const void* ws, size_t ws_bytes) {
  const size_t need = SplitPartialBytes(p, in, planned);
  return need > 0 && ws != nullptr && ws_bytes >= need ? planned : 1;
}

// Split-K plans (how many partial sums a filter gradient computes) target this many multiprocessors, an H100's
// count, whatever GPU runs them: the plan fixes the workspace size, which XLA must know at compile time
// (WorkspaceBytes), so it may depend on the problem alone.
inline constexpr int64_t kPlanSms = 132;
// The register-stencil kernels (plane_stencil.cu, depthwise_reg.cu, small_channel.cu's row-segment kernel) give
// a thread more outputs only while that leaves at least this many warps, 16 per SM: below it the small grids are
// latency bound.
inline constexpr int64_t kBusyWarps = 16 * kPlanSms;

}  // namespace cuda
}  // namespace jaxconv
