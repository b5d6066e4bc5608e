// implicit_gemm.im2col_frag: the forward of first layers (im2col.cuh) in one wave of independent warps, no shared
// memory.
// A warp computes 16 consecutive output pixels (flattened over n, z, p, q) x 8 * NI channels: it gathers each
// MMA fragment element of x straight from global memory (the column table below maps a fragment column
// j = (t, r, s, ci) to its offset and tap), so nothing waits on a barrier or a staging copy. On grids of about one
// wave (batch-1 first layers) the fused forward's chain of row table, staged patch and filter, barriers and unroll
// was most of the time; here a warp's gathers are a few round trips, each a 32-column chunk ahead of its MMAs.
// A warp whose 16 pixels all have their whole window inside x (most tiles of a large image) gathers without the
// bounds tests, which were about 40 % of its instructions per chunk (SASS).
// The MMA's column g of n tile ni is output channel n0 + NI * g + ni: a lane's filter values of one row are then
// NI consecutive channels (one vector load), and its results 2 * NI consecutive channels of a pixel.
// It runs where it beat the fused forward: grids of one wave with one chunk of columns, or 3xTF32 (the batch-1 stem
// in bf16 was too close to switch; the stem at batch 32, many waves, stays with the fused forward).
#include <cstring>
#include <string>
#include <type_traits>

#include "dispatch/variant.h"
#include "kernels/implicit_gemm/im2col.cuh"

namespace jaxconv {
namespace cuda {
namespace {

constexpr int kFgWarps = 4;        // warps per block, each with its own tiles
constexpr int kFgMaxRows = kFfMaxRows;  // taps * c: the column table covers every window the fused forward takes
constexpr int kFgChunk = 32;       // columns gathered per step: the next chunk's loads go out before these MMAs

struct FgArgs {
  int in[3], out[3], stride[3], pad[3];
  int c, rows, k_total, act, nblocks, tiles, x_image;  // nblocks of 8 * NI channels; tiles: 16-pixel tiles x nblocks
  int reach[3];                   // (win - 1) * dilation: a pixel is interior when base..base + reach lies in x
  int64_t pixels;                 // output pixels (n * out spatial)
  // Column j < rows: {element offset of (tap, ci) from the pixel's base, the tap's offsets along d0, d1, d2};
  // columns past rows carry an offset along d0 that no pixel reaches, so the bounds-tested gathers read zeros there
  // (the interior loop tests j < rows instead; their offset 0 stays inside x for an interior pixel).
  int4 col[kFgMaxRows];
};
constexpr int kFgFar = -(1 << 30);

template <class R, int N>
struct alignas(sizeof(R) * N) FgVec {
  R v[N];
};

// *p when ok, else zeros, as a load that stays where it is written (asm volatile): ptxas otherwise sank read-only
// loads next to their use, or issued them again there, to save registers, so the gathers meant to run a chunk ahead
// became round trips right before the MMAs (SASS: a quarter of the batch-1 stem's time).
template <class V>
__device__ __forceinline__ V LdgPinned(const V* p, bool ok) {
  V r;
  const int on = ok;
  if constexpr (sizeof(V) == 2) {
    asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n mov.b16 %0, 0;\n @q ld.global.nc.b16 %0, [%1];\n}\n"
                 : "=h"(*reinterpret_cast<uint16_t*>(&r)) : "l"(p), "r"(on));
  } else if constexpr (sizeof(V) == 4) {
    asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n mov.b32 %0, 0;\n @q ld.global.nc.b32 %0, [%1];\n}\n"
                 : "=r"(*reinterpret_cast<uint32_t*>(&r)) : "l"(p), "r"(on));
  } else if constexpr (sizeof(V) == 8) {
    uint32_t* u = reinterpret_cast<uint32_t*>(&r);
    asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %3, 0;\n mov.b32 %0, 0;\n mov.b32 %1, 0;\n"
                 " @q ld.global.nc.v2.b32 {%0, %1}, [%2];\n}\n"
                 : "=r"(u[0]), "=r"(u[1]) : "l"(p), "r"(on));
  } else {
    static_assert(sizeof(V) == 16, "2, 4, 8 or 16 bytes");
    uint32_t* u = reinterpret_cast<uint32_t*>(&r);
    asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n"
                 " mov.b32 %3, 0;\n @q ld.global.nc.v4.b32 {%0, %1, %2, %3}, [%4];\n}\n"
                 : "=r"(u[0]), "=r"(u[1]), "=r"(u[2]), "=r"(u[3]) : "l"(p), "r"(on));
  }
  return r;
}

// kMath as the fused forward's (FfMath): 16-bit operands as they are (kFfTf32), f32 rounded to TF32 (kFfTf32) or
// split for 3xTF32 in registers (kFfSplitRegs).
template <class T, int kMath, int NI>
__global__ void __launch_bounds__(32 * kFgWarps) FragFwdKernel(const __grid_constant__ FgArgs g,
                                                               const T* __restrict__ x, const T* __restrict__ w,
                                                               const T* __restrict__ bias, T* __restrict__ y) {
  constexpr bool k16 = sizeof(T) == 2;
  constexpr int kKs = k16 ? 16 : 8;         // MMA k
  constexpr int kJq = k16 ? 4 : 2;          // fragment columns per lane and k step
  constexpr int kSteps = kFgChunk / kKs;    // k steps per chunk
  using Raw = std::conditional_t<k16, uint16_t, float>;
  using Vec = FgVec<Raw, NI>;
  const Raw* xr = reinterpret_cast<const Raw*>(x);
  const Raw* wr = reinterpret_cast<const Raw*>(w);
  const int lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  // Lane's columns within a k step: 16-bit 2t, 2t + 1, 2t + 8, 2t + 9; f32 t, t + 4 (the PTX fragment layouts).
  int jo[kJq];
#pragma unroll
  for (int q = 0; q < kJq; ++q) jo[q] = k16 ? 2 * tq + (q & 1) + (q >> 1) * 8 : tq + 4 * q;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kFgWarps;
  for (int64_t wt = static_cast<int64_t>(blockIdx.x) * kFgWarps + (threadIdx.x >> 5); wt < g.tiles; wt += warps) {
    const int64_t ptile = wt / g.nblocks;
    const int n0 = static_cast<int>(wt - ptile * g.nblocks) * 8 * NI;
    // B: channels n0 + NI * gq + [0, NI) of each row (k_total % NI == 0: all valid or none).
    const bool b_ok = n0 + NI * gq < g.k_total;
    const Raw* wq[kJq];  // the lane's filter row q of k step 0: one wide multiply-add per vector load
#pragma unroll
    for (int q = 0; q < kJq; ++q) wq[q] = wr + (n0 + NI * gq + static_cast<int64_t>(jo[q]) * g.k_total);
    // Results: channels c0 + [0, 2 NI) of each of the lane's pixels, and their bias, loaded after the first gathers
    // and kept as loaded until the epilogue (converting them at once waited a round trip before any gather: SASS).
    const int c0 = n0 + 2 * NI * tq;
    Raw bias_r[2 * NI];
    // This lane's pixels (h = 0: row gq of the tile, h = 1: row gq + 8): base coordinates and element offset.
    // Offsets are 32-bit (x and the pixel count are below 2^31: ImplicitGemmApplies) and unsigned: a pixel's base
    // may lie before x, and only the sums of valid columns are read.
    int bc[2][3];
    uint32_t xb[2];
    bool pix_ok[2], inner = true;  // inner: both pixels' windows lie in x
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t pix = ptile * 16 + gq + 8 * h;
      pix_ok[h] = pix < g.pixels;
      uint32_t r = pix_ok[h] ? static_cast<uint32_t>(pix) : 0u;
      int o[3];
#pragma unroll
      for (int d = 2; d >= 0; --d) {
        const uint32_t q = r / static_cast<uint32_t>(g.out[d]);
        o[d] = static_cast<int>(r - q * static_cast<uint32_t>(g.out[d]));
        r = q;
      }
      uint32_t off = 0;
#pragma unroll
      for (int d = 0; d < 3; ++d) {
        bc[h][d] = o[d] * g.stride[d] - g.pad[d];
        off = off * static_cast<uint32_t>(g.in[d]) + static_cast<uint32_t>(bc[h][d]);
        inner = inner && bc[h][d] >= 0 && static_cast<int64_t>(bc[h][d]) + g.reach[d] < g.in[d];
      }
      xb[h] = r * static_cast<uint32_t>(g.x_image) + off * static_cast<uint32_t>(g.c);
      inner = inner && pix_ok[h];
    }
    // Tiles whose 16 pixels all have their whole window in x (most of a large image) gather without bounds tests.
    const bool interior = __all_sync(0xffffffffu, inner);
    Raw av[2][kSteps][2][kJq];  // [buffer][step][pixel h][column q]
    Vec bv[2][kSteps][kJq];     // [buffer][step][row q]
    const auto gather = [&](auto inner_c, int buf, int j0) {
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
#pragma unroll
        for (int q = 0; q < kJq; ++q) {
          const int j = j0 + st * kKs + jo[q];
          const int4 e = g.col[j];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if constexpr (decltype(inner_c)::value) {  // columns past rows: offset 0, in x for an interior pixel
              av[buf][st][h][q] = LdgPinned(xr + (xb[h] + static_cast<uint32_t>(e.x)), j < g.rows);
            } else {
              const auto in_dim = [&](int d, int ed) {  // unsigned sums: no overflow, and below 0 is past in
                return static_cast<unsigned>(bc[h][d]) + static_cast<unsigned>(ed) < static_cast<unsigned>(g.in[d]);
              };
              const bool ok = pix_ok[h] && in_dim(0, e.y) && in_dim(1, e.z) && in_dim(2, e.w);
              av[buf][st][h][q] = LdgPinned(xr + (xb[h] + static_cast<uint32_t>(e.x)), ok);
            }
          }
          const uint32_t row0 = static_cast<uint32_t>(j0 + st * kKs) * static_cast<uint32_t>(g.k_total);  // uniform
          bv[buf][st][q] = LdgPinned(reinterpret_cast<const Vec*>(wq[q] + row0), b_ok && j < g.rows);
        }
      }
    };
    float acc[NI][4];
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) {
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[ni][r] = 0.f;
    }
    const auto mma = [&](int buf) {
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        const Raw(&a)[2][kJq] = av[buf][st];
        const Vec(&b)[kJq] = bv[buf][st];
        if constexpr (k16) {
          const auto pack = [](uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); };
          const uint32_t af[4] = {pack(a[0][0], a[0][1]), pack(a[1][0], a[1][1]), pack(a[0][2], a[0][3]),
                                  pack(a[1][2], a[1][3])};
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
            Mma16816<std::is_same_v<T, __nv_bfloat16>>(acc[ni], af, pack(b[0].v[ni], b[1].v[ni]),
                                                       pack(b[2].v[ni], b[3].v[ni]));
          }
        } else {
          const float av4[4] = {a[0][0], a[1][0], a[0][1], a[1][1]};  // (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)
          uint32_t ab[4], as[4];
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            if constexpr (kMath == kFfSplitRegs) {
              const float2 v = SplitTf32(av4[r]);
              ab[r] = __float_as_uint(v.x);
              as[r] = __float_as_uint(v.y);
            } else {
              ab[r] = Tf32Bits(av4[r]);
            }
          }
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
            if constexpr (kMath == kFfSplitRegs) {
              const float2 b0 = SplitTf32(b[0].v[ni]), b1 = SplitTf32(b[1].v[ni]);
              const uint32_t bb0 = __float_as_uint(b0.x), bb1 = __float_as_uint(b1.x);
              MmaTf32(acc[ni], as, bb0, bb1);
              MmaTf32(acc[ni], ab, __float_as_uint(b0.y), __float_as_uint(b1.y));
              MmaTf32(acc[ni], ab, bb0, bb1);
            } else {
              MmaTf32(acc[ni], ab, Tf32Bits(b[0].v[ni]), Tf32Bits(b[1].v[ni]));
            }
          }
        }
      }
    };
    // Chunks of kFgChunk columns, double-buffered: chunk i + 1's gathers are issued before chunk i's MMAs.
    const int chunks = (g.rows + kFgChunk - 1) / kFgChunk;
    const auto run = [&](auto inner_c) {
      gather(inner_c, 0, 0);
#pragma unroll
      for (int i = 0; i < 2 * NI; ++i) {
        bias_r[i] = LdgPinned(reinterpret_cast<const Raw*>(bias) + c0 + i, bias != nullptr && c0 + i < g.k_total);
      }
#pragma unroll 1
      for (int i = 0; i < chunks; i += 2) {
        if (i + 1 < chunks) gather(inner_c, 1, (i + 1) * kFgChunk);
        mma(0);
        if (i + 1 >= chunks) break;
        if (i + 2 < chunks) gather(inner_c, 0, (i + 2) * kFgChunk);
        mma(1);
      }
    };
    if (interior) {
      run(std::true_type{});
    } else {
      run(std::false_type{});
    }
    // Accumulator r of n tile ni: pixel row gq (+ 8 for r >= 2), column 2 tq + (r & 1), i.e. channel
    // c0 + NI * (r & 1) + ni: each pixel's 2 NI channels as two vectors of NI.
    const auto epilogue = [&](auto act_c) {
      constexpr int kAct = decltype(act_c)::value;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (!pix_ok[h]) continue;
        T* yp = y + (ptile * 16 + gq + 8 * h) * g.k_total + c0;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          if (c0 + NI * half >= g.k_total) continue;
          FgVec<T, NI> o;
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
            T b;  // the loaded bits as T, converted like every other operand
            memcpy(&b, &bias_r[NI * half + ni], sizeof(T));
            o.v[ni] = FromAcc<T>(Activate(acc[ni][2 * h + half] + ToAcc(b), kAct));
          }
          *reinterpret_cast<FgVec<T, NI>*>(yp + NI * half) = o;
        }
      }
    };
    WithActivation(g.act, epilogue);
  }
}

// The register-gathered forward's arguments (NI n8 tiles per warp); false where it does not apply: more than
// kFgMaxRows columns, or offsets past 32 bits.
bool MakeFgArgs(const ConvParams& p, int ni, FgArgs* out) {
  const int64_t rows = SpatialCount(p.win) * p.c[0];
  if (rows > kFgMaxRows) return false;
  FgArgs g{};
  for (int d = 0; d < 3; ++d) {
    g.in[d] = static_cast<int>(p.in[d]);
    g.out[d] = static_cast<int>(p.out[d]);
    g.stride[d] = static_cast<int>(p.stride[d]);
    g.pad[d] = static_cast<int>(p.pad_lo[d]);
    const int64_t reach = (p.win[d] - 1) * p.rhs_dil[d];
    if (reach > kMaxIndex) return false;
    g.reach[d] = static_cast<int>(reach);
  }
  g.c = static_cast<int>(p.c[0]);
  g.rows = static_cast<int>(rows);
  g.k_total = static_cast<int>(p.k[0]);
  g.act = static_cast<int>(p.activation[0]);
  g.pixels = p.n[0] * SpatialCount(p.out);
  g.x_image = static_cast<int>(SpatialCount(p.in) * p.c[0]);  // < 2^31: ImplicitGemmApplies
  g.nblocks = static_cast<int>(CeilDiv(p.k[0], 8 * ni));
  const int64_t tiles = CeilDiv(g.pixels, 16) * g.nblocks;
  if (tiles > kMaxIndex) return false;
  g.tiles = static_cast<int>(tiles);
  for (int j = 0; j < kFgMaxRows; ++j) {
    if (j >= rows) {
      g.col[j] = make_int4(0, kFgFar, 0, 0);
      continue;
    }
    const int64_t ci = j % p.c[0], tap = j / p.c[0];
    const int64_t f[3] = {tap / (p.win[1] * p.win[2]), tap / p.win[2] % p.win[1], tap % p.win[2]};
    int64_t e[3], delta = 0;
    for (int d = 0; d < 3; ++d) {
      e[d] = f[d] * p.rhs_dil[d];
      delta = delta * p.in[d] + e[d];
    }
    delta = delta * p.c[0] + ci;
    if (delta > kMaxIndex || e[0] > kMaxIndex || e[1] > kMaxIndex || e[2] > kMaxIndex) return false;
    g.col[j] = make_int4(static_cast<int>(delta), static_cast<int>(e[0]), static_cast<int>(e[1]),
                         static_cast<int>(e[2]));
  }
  *out = g;
  return true;
}

template <class T>
struct Tag {
  using type = T;
};

// f(Tag<T>{}, IntC<kMath>{}, IntC<NI>{}): the operand type, how float32 enters the MMAs (kFfTf32, or 3xTF32 split in
// registers) and the n8 tiles per warp (4 for k >= 32, else 2).
template <class F>
auto WithFragKernel(const ConvParams& p, DType in, F&& f) {
  const auto by_ni = [&](auto t, auto m) { return p.k[0] >= 32 ? f(t, m, IntC<4>{}) : f(t, m, IntC<2>{}); };
  switch (in) {
    case DType::kBF16: return by_ni(Tag<__nv_bfloat16>{}, IntC<kFfTf32>{});
    case DType::kF16: return by_ni(Tag<__half>{}, IntC<kFfTf32>{});
    default:
      return MathFor(p, in) == IgemmMath::k3xTF32 ? by_ni(Tag<float>{}, IntC<kFfSplitRegs>{})
                                                  : by_ni(Tag<float>{}, IntC<kFfTf32>{});
  }
}

// The blocks of FragFwdKernel<T, kMath, NI> for the problem (its arguments in *g) when every warp tile gets a warp of
// its own at once; 0 when it does not apply.
template <class T, int kMath, int NI>
int64_t FragBlocks(const Problem& pr, FgArgs* g) {
  if (!MakeFgArgs(pr.p, NI, g)) return 0;
  const int64_t blocks = CeilDiv(g->tiles, kFgWarps);
  const int64_t resident = ResidentBlocksOn(pr.dev, FragFwdKernel<T, kMath, NI>, 32 * kFgWarps, 0, 1);
  return blocks <= resident ? blocks : 0;
}

}  // namespace
}  // namespace cuda

namespace variants::implicit_gemm_im2col_frag {

std::string Applies(const Problem& pr) {
  if (std::string why = cuda::Im2colError(pr); !why.empty()) return why;
  if (pr.dev.arch < 80) return "the mma.sync kernels need sm_80 or newer";
  const bool split = pr.in == DType::kF32 && cuda::MathFor(pr.p, pr.in) == cuda::IgemmMath::k3xTF32;
  if (!split && SpatialCount(pr.p.win) * pr.p.c[0] > cuda::kFgChunk) {
    return "it takes one chunk of 32 columns (taps * c), or float32 at HIGH or HIGHEST precision";
  }
  const int64_t blocks = cuda::WithFragKernel(pr.p, pr.in, [&](auto t, auto m, auto ni) {
    cuda::FgArgs g;
    return cuda::FragBlocks<typename decltype(t)::type, decltype(m)::value, decltype(ni)::value>(pr, &g);
  });
  if (blocks == 0) return "its warp tiles take more than one wave (or its offsets pass 32 bits)";
  return {};
}

size_t Workspace(const Problem&) { return 0; }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  // Filter loads and result stores are vectors of NI channels.
  if (!cuda::Aligned16(b.b) || !cuda::Aligned16(b.out)) return cudaErrorMisalignedAddress;
  return cuda::WithFragKernel(pr.p, pr.in, [&](auto t, auto m, auto ni) {
    using T = typename decltype(t)::type;
    constexpr int kMath = decltype(m)::value, NI = decltype(ni)::value;
    cuda::FgArgs g;
    const int64_t blocks = cuda::FragBlocks<T, kMath, NI>(pr, &g);
    if (blocks == 0) return cudaErrorNotSupported;
    cuda::FragFwdKernel<T, kMath, NI><<<cuda::GridX(blocks), 32 * cuda::kFgWarps, 0, s>>>(
        g, static_cast<const T*>(b.a), static_cast<const T*>(b.b), static_cast<const T*>(b.bias),
        static_cast<T*>(b.out));
    return cudaGetLastError();
  });
}

}  // namespace variants::implicit_gemm_im2col_frag
}  // namespace jaxconv
