// Element-type and layout conversions of the CPU kernels: the bf16/f16 <-> f32 bit manipulations (inline, so
// that the conversion loops do not call per element), the typed load/store adaptors, and the layout passes
// (channels-first <-> channels-last with conversion, and plain conversion), run on the thread pool when large.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/thread_pool.h"
#include "cpu/transpose.h"

namespace jaxconv {
namespace cpu {
namespace cvt {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline float BF16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToBF16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even; overflows into inf correctly
  return static_cast<uint16_t>(u >> 16);
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return BitsFloat(sign);
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24, exact
    return BitsFloat(FloatBits(v) | sign);
  }
  if (exp == 31) return BitsFloat(sign | 0x7f800000u | (mant << 13));
  return BitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t FloatToHalf(float f) {
  uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | (u > 0x7f800000u ? 0x7e00u | ((u >> 13) & 0x3ffu) : 0x7c00u));
  }
  if (u >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (u < 0x38800000u) {  // below the smallest normal half: subnormal or zero, let the FPU round (RNE)
    const float s = BitsFloat(u) + 0.5f;
    return static_cast<uint16_t>(sign | (FloatBits(s) - 0x3f000000u));
  }
  const uint32_t odd = (u >> 13) & 1u;
  u += 0xc8000fffu + odd;  // rebias exponent (-112 << 23) and add the rounding bias
  return static_cast<uint16_t>(sign | (u >> 13));
}

}  // namespace cvt

struct bf16_t {
  uint16_t v;
};
struct f16_t {
  uint16_t v;
};

template <class T>
struct Cvt;
template <>
struct Cvt<float> {
  static float Load(float v) { return v; }
  static float Store(float a) { return a; }
};
template <>
struct Cvt<double> {
  static double Load(double v) { return v; }
  static double Store(double a) { return a; }
};
template <>
struct Cvt<bf16_t> {
  static float Load(bf16_t v) { return cvt::BF16ToFloat(v.v); }
  static bf16_t Store(float a) { return bf16_t{cvt::FloatToBF16(a)}; }
};
template <>
struct Cvt<f16_t> {
  static float Load(f16_t v) { return cvt::HalfToFloat(v.v); }
  static f16_t Store(float a) { return f16_t{cvt::FloatToHalf(a)}; }
};

template <class Acc, class In>
inline Acc ToAcc(In v) {
  return static_cast<Acc>(Cvt<In>::Load(v));
}
template <class Out, class Acc>
inline Out FromAcc(Acc a) {
  return Cvt<Out>::Store(a);
}

// An allocator that leaves trivial elements uninitialized on resize: scratch buffers that are entirely
// written before they are read need no zeroing pass (and no first touch outside the threads that fill them).
template <class T>
struct NoInitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = NoInitAllocator<U>;
  };
  NoInitAllocator() = default;
  template <class U>
  NoInitAllocator(const NoInitAllocator<U>&) noexcept {}
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    if constexpr (sizeof...(Args) == 0) {
      ::new (static_cast<void*>(p)) U;
    } else {
      ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
  }
};
template <class T>
using ScratchVec = std::vector<T, NoInitAllocator<T>>;

// Elements a layout pass moves per thread at least: below this, waking a worker costs more than it saves.
inline constexpr int64_t kMinCopyPerThread = 1 << 16;

// Runs fn(i) for i in [0, items) on the pool, with threads only when `elements` is large; a failed worker
// becomes an exception for the caller's error path.
template <class Fn>
void PoolCopyLoop(int64_t items, int64_t elements, Fn&& fn) {
  const int threads = static_cast<int>(std::min<int64_t>(PoolThreads(), std::max<int64_t>(1, elements / kMinCopyPerThread)));
  if (!PoolFor(items, threads, [&](int64_t i, int) { fn(i); })) throw std::runtime_error("layout pass failed");
}

// src (B, R, Cc) -> dst (B, Cc, R), converting element types, in square tiles (register transposes for a
// plain f32 or f64 copy).
template <class Src, class Dst, class Fn>
void TransposeConvert(int64_t B, int64_t R, int64_t Cc, const Src* src, Dst* dst, Fn cvt) {
  constexpr int64_t kT = 64;
  constexpr bool kPlain = std::is_same_v<Src, Dst> && (std::is_same_v<Src, float> || std::is_same_v<Src, double>);
  const int64_t rblocks = (R + kT - 1) / kT;
  PoolCopyLoop(B * rblocks, B * R * Cc, [&](int64_t item) {
    const int64_t b = item / rblocks, r0 = (item % rblocks) * kT, r1 = std::min(R, r0 + kT);
    const Src* s = src + b * R * Cc;
    Dst* d = dst + b * R * Cc;
    for (int64_t c0 = 0; c0 < Cc; c0 += kT) {
      const int64_t c1 = std::min(Cc, c0 + kT);
      if constexpr (kPlain) {
        TransposeBlock(s + r0 * Cc + c0, Cc, d + c0 * R + r0, R, r1 - r0, c1 - c0);
      } else {
        for (int64_t c = c0; c < c1; ++c)
          for (int64_t r = r0; r < r1; ++r) d[c * R + r] = cvt(s[r * Cc + c]);
      }
    }
  });
}

// dst[e] = cvt(src[e]) for e < n.
template <class Src, class Dst, class Fn>
void ConvertCopy(int64_t n, const Src* src, Dst* dst, Fn cvt) {
  constexpr int64_t kBlock = 1 << 14;
  PoolCopyLoop((n + kBlock - 1) / kBlock, n, [&](int64_t item) {
    const int64_t e1 = std::min(n, (item + 1) * kBlock);
    for (int64_t e = item * kBlock; e < e1; ++e) dst[e] = cvt(src[e]);
  });
}

}  // namespace cpu
}  // namespace jaxconv
