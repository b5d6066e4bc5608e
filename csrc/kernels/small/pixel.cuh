// The pixel kernels of the few-channel family's 4 -> 4 forward and data gradient (small.pixel, small.pixel_mma):
// what both share, the gate of their plan and the choice between them.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/small/small.cuh"

namespace jaxconv {
namespace cuda {
namespace small_channel {

inline constexpr int64_t kPxSmemMax = 48 * 1024;
// Shared memory of the FMA pixel kernel: the filter as f32, 4 x 4 per tap.
inline int64_t PixelSmem(const ScArgs& g) { return static_cast<int64_t>(g.ntaps) * 16 * sizeof(float); }

// The pixel kernels' plan ("" where it takes the gather g): 4 -> 4 channels, channels-last pixels, delta = 1, float
// accumulation, the filter in 48 KiB, a grid within CUDA's y and z limits.
inline std::string PixelError(const ScArgs& g, DType in, DType out) {
  if (g.cin != 4 || g.cout != 4) return "it takes 4 -> 4 channels";
  if (!IsF32AccPair(in, out)) return "it takes 16-bit or float32 operands";
  for (int d = 0; d < 3; ++d) {
    if (g.delta[d] != 1) return "it takes no lhs dilation (fwd) or unit strides (dgrad)";
  }
  if (g.sS[2] != 4 || g.dS[2] != 4 || PixelSmem(g) > kPxSmemMax) return "it takes channels-last pixels, <= 768 taps";
  if (CeilDiv(g.tsp[1], kPxRows) > 65535 || g.n * g.tsp[0] > 65535) return "rows or planes past its grid's y and z";
  return {};
}

// The unrolled 3x3: unit column stride and column dilation +-1 (the forward and the data gradient of an undilated
// 3x3). 16-bit data takes it on tensor cores (small.pixel_mma), float32 on FMAs (small.pixel).
inline bool PixelK3(const ScArgs& g) {
  return g.taps[1] == 3 && g.taps[2] == 3 && g.alpha[2] == 1 && (g.gamma[2] == 1 || g.gamma[2] == -1);
}

// f(r, off) for each window row r = 3 f0 + f1 of a window 3 rows tall (any taps along dim 0) whose source row lies
// inside the source; off = the row's element offset in the image. The skip is uniform over a warp (one row t1).
template <class F>
__device__ __forceinline__ void ForEachWindowRow3(const ScArgs& g, int t0, int t1, F&& f) {
  for (int f0 = 0; f0 < g.taps[0]; ++f0) {
    const int q0 = TapIndex(t0 * g.alpha[0] + g.beta[0] + f0 * g.gamma[0], 1, g.lim[0]);
    if (q0 < 0) continue;
#pragma unroll
    for (int f1 = 0; f1 < 3; ++f1) {
      const int q1 = t1 * g.alpha[1] + g.beta[1] + f1 * g.gamma[1];
      if (static_cast<unsigned>(q1) >= static_cast<unsigned>(g.lim[1])) continue;
      f(f0 * 3 + f1, q0 * g.sS[0] + q1 * g.sS[1]);
    }
  }
}

}  // namespace small_channel
}  // namespace cuda
}  // namespace jaxconv
