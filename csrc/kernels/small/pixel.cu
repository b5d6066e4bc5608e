// small.pixel: the 4 -> 4 forward and data gradient (msd's 4 -> 4 layer) on FMAs: float32 data, and 16-bit data but
// for the unrolled 3x3 (small.pixel_mma takes that).
// Forward and data gradient (ScPixelKernel, delta = 1 along every dim): a thread owns P pixels of one row, 32 apart
// (lane + 32 j), and their 4 destination channels; a block's 8 warps own 8 consecutive rows of one 32P-pixel column
// segment (grid: segments x row tiles x images * tsp0, one division per block), so the rows of the window they share
// are read through L1 once. Per tap a pixel's 4 source channels are one 8- or 16-byte load straight from global memory
// (the lanes read consecutive pixels) and the tap's 4 x 4 filter block is a warp-uniform shared-memory read. Nothing is
// staged per tile and no barrier follows the filter's: the stencil kernel's staged tile (two barriers per tile,
// scattered shared stores) kept its 2 warps per scheduler waiting. 3x3 windows at unit column stride and column
// dilation +-1 (the forward and the data gradient of an undilated 3x3) are unrolled with the column offsets as
// constants, and a segment whose window columns all lie inside the source row loads without checks.
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/small/pixel.cuh"

namespace jaxconv {
namespace cuda {
namespace small_channel {
namespace {

// K = 3, G2 = +-1: the 3x3 window with alpha2 = 1, gamma2 = G2; K = 0: any window (G2 unused).
template <class T, class TO, int P, int K, int G2>
__global__ void __launch_bounds__(kPxThreads, 4) ScPixelKernel(const ScArgs g, const T* __restrict__ src,
                                                               const T* __restrict__ w, const TO* __restrict__ bias,
                                                               TO* __restrict__ dst) {
  extern __shared__ __align__(16) float pwt[];  // [ntaps][ci][co], 4 x 4 per tap
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int e = tid; e < g.ntaps * 16; e += kPxThreads) {
    const int co = e & 3, ci = (e >> 2) & 3, f = e >> 4;
    pwt[e] = ToAcc(w[static_cast<int64_t>(f) * g.wF + ci * g.wCi + co * g.wCo]);
  }
  __syncthreads();
  const int t1 = static_cast<int>(blockIdx.y) * kPxRows + warp;
  if (t1 >= g.tsp[1]) return;  // no barrier follows
  const int64_t n = blockIdx.z / g.tsp[0];
  const int t0 = static_cast<int>(blockIdx.z - n * g.tsp[0]);
  const int s0 = static_cast<int>(blockIdx.x) * 32 * P;  // the segment's first destination pixel
  const int c0 = s0 + lane;
  float acc[P][4];
#pragma unroll
  for (int j = 0; j < P; ++j)
#pragma unroll
    for (int co = 0; co < 4; ++co) acc[j][co] = 0.f;
  auto fma16 = [&](const float (&xv)[4], const float* wq, float (&a)[4]) {
    float wv[16];
    LdN<16>(wq, wv);
#pragma unroll
    for (int ci = 0; ci < 4; ++ci)
#pragma unroll
      for (int co = 0; co < 4; ++co) a[co] = fmaf(xv[ci], wv[4 * ci + co], a[co]);
  };
  const T* sb = src + n * g.sN;
  if constexpr (K == 3) {
    const int qb = c0 + g.beta[2];  // source column of tap 0, pixel 0
    const int lo = s0 + g.beta[2] + (G2 < 0 ? -2 : 0), hi = s0 + 32 * P - 1 + g.beta[2] + (G2 > 0 ? 2 : 0);
    auto body = [&](auto inner_c) {
      constexpr bool kInner = decltype(inner_c)::value;
      unsigned cv = 0;  // bit 3j + f2: column of (pixel j, tap f2) inside the row
#pragma unroll
      for (int j = 0; j < P; ++j)
#pragma unroll
        for (int f2 = 0; f2 < 3; ++f2)
          cv |= static_cast<unsigned>(static_cast<unsigned>(qb + 32 * j + f2 * G2) < static_cast<unsigned>(g.lim[2]))
                << (3 * j + f2);
      ForEachWindowRow3(g, t0, t1, [&](int r, int off) {
        const T* rp = sb + off + 4 * static_cast<int64_t>(qb);
        const float* wf = pwt + r * 48;
#pragma unroll
        for (int f2 = 0; f2 < 3; ++f2) {
#pragma unroll
          for (int j = 0; j < P; ++j) {
            float xv[4] = {0.f, 0.f, 0.f, 0.f};
            if (kInner || ((cv >> (3 * j + f2)) & 1u)) LdGlobalAcc<T, float, 4>(rp + 4 * (32 * j + f2 * G2), xv);
            fma16(xv, wf + 16 * f2, acc[j]);
          }
        }
      });
    };
    if (lo >= 0 && hi < g.lim[2]) body(std::true_type{});
    else body(std::false_type{});
  } else {
    for (int f0 = 0; f0 < g.taps[0]; ++f0) {
      const int q0 = TapIndex(t0 * g.alpha[0] + g.beta[0] + f0 * g.gamma[0], 1, g.lim[0]);
      if (q0 < 0) continue;
      for (int f1 = 0; f1 < g.taps[1]; ++f1) {
        const int q1 = t1 * g.alpha[1] + g.beta[1] + f1 * g.gamma[1];
        if (static_cast<unsigned>(q1) >= static_cast<unsigned>(g.lim[1])) continue;  // uniform over the warp
        const T* rowp = sb + (q0 * g.sS[0] + q1 * g.sS[1]);
        const float* wf = pwt + (f0 * g.taps[1] + f1) * g.taps[2] * 16;
        for (int f2 = 0; f2 < g.taps[2]; ++f2) {
          const int qb = c0 * g.alpha[2] + g.beta[2] + f2 * g.gamma[2];
#pragma unroll
          for (int j = 0; j < P; ++j) {
            const int q2 = qb + 32 * j * g.alpha[2];
            float xv[4] = {0.f, 0.f, 0.f, 0.f};
            if (static_cast<unsigned>(q2) < static_cast<unsigned>(g.lim[2])) {
              LdGlobalAcc<T, float, 4>(rowp + 4 * q2, xv);
            }
            fma16(xv, wf + 16 * f2, acc[j]);
          }
        }
      }
    }
  }
  TO* drow = dst + n * g.dN + (t0 * g.dS[0] + t1 * g.dS[1]);
  WithActivation(g.act, [&](auto act_c) {
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int t2 = c0 + 32 * j;
      if (t2 >= g.tsp[2]) break;
      float v[4];
#pragma unroll
      for (int co = 0; co < 4; ++co) {
        v[co] = acc[j][co] + (g.has_bias ? ToAcc(bias[co]) : 0.f);
        v[co] = Activate(v[co], decltype(act_c)::value);
      }
      StGlobal<TO, float, 4>(drow + 4 * t2, v);
    }
  });
}

template <class T, class TO, int P, int K, int G2>
cudaError_t LaunchPixel(const ScArgs& g, const void* src, const void* w, const void* bias, void* dst, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(CeilDiv(g.tsp[2], 32 * P)), static_cast<unsigned>(CeilDiv(g.tsp[1], kPxRows)),
                  static_cast<unsigned>(g.n * g.tsp[0]));
  const size_t smem = static_cast<size_t>(PixelSmem(g));
  ScPixelKernel<T, TO, P, K, G2><<<grid, kPxThreads, smem, s>>>(g, static_cast<const T*>(src),
                                                                static_cast<const T*>(w),
                                                                static_cast<const TO*>(bias), static_cast<TO*>(dst));
  return cudaGetLastError();
}

}  // namespace
}  // namespace small_channel
}  // namespace cuda

namespace variants::small_pixel {

std::string Applies(const Problem& pr) {
  using namespace cuda::small_channel;
  if (std::string e = FamilyError(pr); !e.empty()) return e;
  const ScArgs g = MakeScArgs(pr);
  if (std::string e = PixelError(g, pr.in, pr.out); !e.empty()) return e;
  if (Is16Bit(pr.in) && PixelK3(g)) return "16-bit 3x3 windows take its tensor-core kernel (small.pixel_mma)";
  return {};
}

size_t Workspace(const Problem&) { return 0; }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  using namespace cuda::small_channel;
  const GatherBuffers o = GatherBuffersOf(pr, b);
  // Pixels of 4 channels: one 8- or 16-byte vector each.
  if (!cuda::Aligned16(o.src) || !cuda::Aligned16(o.dst)) return cudaErrorMisalignedAddress;
  const ScArgs g = MakeScArgs(pr);
  if (g.n * g.tsp[0] * g.tsp[1] * g.tsp[2] <= 0) return cudaSuccess;
  // The unrolled 3x3 at 2 pixels per thread (faster than 4 pixels or the general loop on msd's 512^2 layer); other
  // windows 2 pixels per thread while that leaves the busy-warp count, else 1.
  const bool k3 = PixelK3(g);
  const bool two = g.n * g.tsp[0] * g.tsp[1] * cuda::CeilDiv(g.tsp[2], 64) >= cuda::kBusyWarps;
  return cuda::WithF32AccTypes(pr.in, pr.out, [&](auto t, auto to) {
    using T = decltype(t);
    using TO = decltype(to);
    if constexpr (sizeof(T) != 2) {
      if (k3) {
        return g.gamma[2] > 0 ? LaunchPixel<T, TO, 2, 3, 1>(g, o.src, o.w, o.bias, o.dst, s)
                              : LaunchPixel<T, TO, 2, 3, -1>(g, o.src, o.w, o.bias, o.dst, s);
      }
    }
    return two ? LaunchPixel<T, TO, 2, 0, 0>(g, o.src, o.w, o.bias, o.dst, s)
               : LaunchPixel<T, TO, 1, 0, 0>(g, o.src, o.w, o.bias, o.dst, s);
  });
}

}  // namespace variants::small_pixel
}  // namespace jaxconv
