// small.stencil: the forward and data gradient with alpha == delta == 1 along dims 1 and 2 (unit stride, no lhs
// dilation; the data gradient of such a convolution is the same gather with gamma = -rhs_dil; small.cuh).
// A block computes a tile of TH = 8R rows x TW = 32P columns of one (n, t0) plane, all cout channels. For each
// valid tap f0 of dim 0 (general, TapIndex) it stages the source tile plus halo (sr = TH + span1 rows,
// sc = TW + span2 cols, span = (taps - 1) * |gamma|) in shared memory as Acc, zeros outside the source, so the
// compute loop has no bounds checks. Lane l owns columns l + 32j (j < P): consecutive lanes read consecutive
// shared words (no bank conflicts). Warp ty owns R output rows spaced g1 = |gamma1| apart, so staged row ii of
// the warp feeds its output row r through tap u = ii - r: each staged value is read once per thread per
// column tap and reused by up to taps1 output rows (R + taps1 - 1 row reads for R rows, not R * taps1).
// Filter in shared memory, broadcast reads, CO outputs per read input value.
// Staging reads aligned 16-byte chunks (kStageB in flight per thread; element-wise only at row ends); cin == 1
// stores them as is into rows shifted by the row's misalignment (shs[row]), cin > 1 scatters the elements to
// their padded (column, channel) slots.
// Taken when H-dilation is 1/2/4/8, there are >= 8 destination rows and columns, (cin, cout) fits a channel bucket
// (PickStencilCfg) and the staged tile fits kStencilSmemMax and the device (StencilGeom).
#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/small/small.cuh"

namespace jaxconv {
namespace cuda {
namespace small_channel {
namespace {

constexpr int64_t kStencilSmemMax = 110 * 1024;  // 2 blocks per SM on sm_90; larger tiles use the gather kernel
// Staging: 16-byte chunks in flight per thread; 6 x 256 covers a 1->1 bf16 tile (64 + 16 rows x 18 chunks) in
// one round trip within the 80-register budget of 3 blocks per SM (sm_80 spills at 6 and 4: 3 there).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr int kStageB = 3;
#else
constexpr int kStageB = 6;
#endif

struct StArgs {
  int64_t n, sN, dN, tiles;  // tiles = n * tsp0 * th * tw
  int tsp[3], taps[3];
  int alpha0, beta0, gamma0, delta0, lim0;  // dim 0, general
  int m1, m2;       // source row / col of staged row / col 0, relative to the tile's first output row / col
  int g1, gamma1, g2, gamma2;  // g1 = |gamma1| in {1, 2, 4, 8}; g2 = |gamma2|
  int lim1, lim2;
  int sS0, sS1, dS0, dS1;  // channels-last: the pixel stride along dim 2 is the channel count
  int sr, sc, pitch;       // staged rows, cols; Acc elements per staged row
  int th, tw;              // tiles along dims 1 and 2
  int wF, wCi, wCo;
  int cin, cout, ntaps, act, has_bias;
};

// Acc elements per staged pixel: 16 channels padded to 80 bytes so that 16-byte reads of 8 consecutive lanes
// fall in distinct bank groups.
constexpr int StPitchOf(int ci) { return ci == 16 ? 20 : ci; }
template <int CI> constexpr int StPitch() { return StPitchOf(CI); }

template <int N> __device__ __forceinline__ void StN(float* p, const float* v) {
  static_assert(N % 4 == 0, "16-byte stores");
#pragma unroll
  for (int i = 0; i < N / 4; ++i) reinterpret_cast<float4*>(p)[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
}
template <int N> __device__ __forceinline__ void StN(double* p, const double* v) {
  static_assert(N % 2 == 0, "16-byte stores");
#pragma unroll
  for (int i = 0; i < N / 2; ++i) reinterpret_cast<double2*>(p)[i] = make_double2(v[2 * i], v[2 * i + 1]);
}

// The 16 bytes of u as 16 / sizeof(T) values of T, converted (element 0 in the low bytes of u.x).
__device__ __forceinline__ void Unpack16(uint4 u, float* o, float) {
  o[0] = __uint_as_float(u.x); o[1] = __uint_as_float(u.y); o[2] = __uint_as_float(u.z); o[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ void Unpack16(uint4 u, double* o, double) {
  o[0] = __hiloint2double(static_cast<int>(u.y), static_cast<int>(u.x));
  o[1] = __hiloint2double(static_cast<int>(u.w), static_cast<int>(u.z));
}
__device__ __forceinline__ void Unpack16(uint4 u, float* o, __nv_bfloat16) {
  const unsigned wd[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) { o[2 * i] = __uint_as_float(wd[i] << 16); o[2 * i + 1] = __uint_as_float(wd[i] & 0xffff0000u); }
}
__device__ __forceinline__ void Unpack16(uint4 u, float* o, __half) {
  const unsigned wd[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(wd[i] & 0xffffu)));
    o[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(wd[i] >> 16)));
  }
}

__device__ __forceinline__ unsigned long long Bits(double v) { return static_cast<unsigned long long>(__double_as_longlong(v)); }
__device__ __forceinline__ unsigned Bits(float v) { return __float_as_uint(v); }
__device__ __forceinline__ unsigned Bits(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
__device__ __forceinline__ unsigned Bits(__half v) { return __half_as_ushort(v); }

// The 16-byte chunk rowp[eb, eb + 16 / sizeof(T)) element by element, zero bits (+0) where !rv or the element is
// outside [0, rowlen): a row's edges, where the vector load would leave the row or the buffer.
template <class T>
__device__ __forceinline__ uint4 LoadEdge16(const T* rowp, int eb, int rowlen, bool rv) {
  unsigned wd[4];
  if constexpr (sizeof(T) == 2) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = eb + 2 * i;
      const unsigned lo = (rv && e >= 0 && e < rowlen) ? Bits(rowp[e]) : 0u;
      const unsigned hi = (rv && e + 1 >= 0 && e + 1 < rowlen) ? Bits(rowp[e + 1]) : 0u;
      wd[i] = lo | (hi << 16);
    }
  } else if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = eb + i;
      wd[i] = (rv && e >= 0 && e < rowlen) ? Bits(rowp[e]) : 0u;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int e = eb + i;
      const unsigned long long b = (rv && e >= 0 && e < rowlen) ? Bits(rowp[e]) : 0ull;
      wd[2 * i] = static_cast<unsigned>(b);
      wd[2 * i + 1] = static_cast<unsigned>(b >> 32);
    }
  }
  return make_uint4(wd[0], wd[1], wd[2], wd[3]);
}

template <class T, class TO, int CI, int CO, int R, int P>
__global__ void __launch_bounds__(kThreads, sizeof(T) == 8 ? 1 : 3) ScStencilKernel(const StArgs g, const T* __restrict__ src,
                                                              const T* __restrict__ w, const TO* __restrict__ bias,
                                                              TO* __restrict__ dst) {
  using Acc = typename AccOf<T>::type;
  constexpr int CP = StPitch<CI>(), TH = 8 * R, TW = 32 * P, CC = CI * CO;
  constexpr int V = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte global load
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Acc* wt = reinterpret_cast<Acc*>(smem_raw);  // [ntaps][CI][CO], zero-padded
  const int wn = g.ntaps * CC;
  Acc* tile = wt + ((wn + 3) & ~3);  // 16-byte aligned
  int* shs = reinterpret_cast<int*>(tile + g.sr * g.pitch);  // cin == 1: per staged row, column 0's position
  const int tid = threadIdx.x, lane = tid & 31, ty = tid >> 5;
  const int cin = g.cin;
  for (int e = tid; e < wn; e += kThreads) {
    const int co = e % CO, r = e / CO;
    const int ci = r % CI, f = r / CI;
    wt[e] = (co < g.cout && ci < cin) ? ToAcc(w[static_cast<int64_t>(f) * g.wF + ci * g.wCi + co * g.wCo]) : Acc(0);
  }
  if (CI > 1 && cin < CI) {  // padded channels: zero once, staging never writes them
    for (int pix = tid; pix < g.sr * g.sc; pix += kThreads)
      for (int ch = cin; ch < CI; ++ch) tile[(pix / g.sc) * g.pitch + (pix % g.sc) * CP + ch] = Acc(0);
  }
  const int g1 = g.g1, taps1 = g.taps[1], taps2 = g.taps[2];
  const int base_s = (ty / g1) * (R * g1) + (ty % g1);  // g1 divides 8: 8/g1 groups of g1 warps cover R*g1 rows
  const int rowlen = g.lim2 * cin;  // valid source elements per row
  for (int64_t tidx = blockIdx.x; tidx < g.tiles; tidx += gridDim.x) {
    int64_t rem = tidx;
    int tx, tyt, t0;
    { const int64_t q_ = DivNN(rem, g.tw); tx = static_cast<int>(rem - q_ * g.tw); rem = q_; }
    { const int64_t q_ = DivNN(rem, g.th); tyt = static_cast<int>(rem - q_ * g.th); rem = q_; }
    { const int64_t q_ = DivNN(rem, g.tsp[0]); t0 = static_cast<int>(rem - q_ * g.tsp[0]); rem = q_; }
    const int64_t n = rem;
    const int r0 = tyt * TH, c0 = tx * TW;
    const int a = (c0 + g.m2) * cin;  // source element (relative to a row's start) of staged column 0
    Acc acc[R][P][CO];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < P; ++j)
#pragma unroll
        for (int co = 0; co < CO; ++co) acc[r][j][co] = Acc(0);
    for (int f0 = 0; f0 < g.taps[0]; ++f0) {
      const int q0 = TapIndex(t0 * g.alpha0 + g.beta0 + f0 * g.gamma0, g.delta0, g.lim0);
      if (q0 < 0) continue;  // uniform over the block
      const T* plane = src + n * g.sN + q0 * g.sS0;
      __syncthreads();  // the previous stage's reads are done (and the filter is visible)
      {
        // Staged row s holds source elements [a, a + seg) of source row r0 + m1 + s (zero outside the source),
        // read as aligned 16-byte chunks: chunk k of the row covers [a - sh + kV, a - sh + (k + 1)V), sh = the
        // row's misalignment. cin == 1: the chunk goes to the row as is, shifted by sh (shs[s]); cin > 1: each
        // element to its (column, channel) slot.
        const int seg = g.sc * cin;
        const int nchm = (seg + 2 * V - 2) / V;  // chunks per row covering seg elements at any alignment
        const int tot = g.sr * nchm;
        // rowp = the source row (row 0 of the plane when invalid); eb = the chunk's first element relative to it
        auto locate = [&](int idx, int& s, int& k, bool& rv, const T*& rowp, int& sh, int& eb) {
          s = idx / nchm;
          k = idx - s * nchm;
          const int q1 = r0 + g.m1 + s;
          rv = static_cast<unsigned>(q1) < static_cast<unsigned>(g.lim1);
          rowp = plane + (rv ? q1 : 0) * g.sS1;
          const int mis = static_cast<int>((reinterpret_cast<uintptr_t>(rowp) / sizeof(T)) & (V - 1));
          sh = (a + mis) & (V - 1);
          eb = a - sh + k * V;
        };
        for (int base = tid; base < tot; base += kStageB * kThreads) {
          uint4 raw[kStageB];  // packed source bits: 4 registers per chunk whatever T
          unsigned edge = 0;   // chunks that straddle a row end: loaded element-wise after the batch
#pragma unroll
          for (int b = 0; b < kStageB; ++b) {
            const int idx = base + b * kThreads;
            raw[b] = make_uint4(0u, 0u, 0u, 0u);
            if (idx < tot) {
              int s, k, sh, eb;
              bool rv;
              const T* rowp;
              locate(idx, s, k, rv, rowp, sh, eb);
              if (rv && eb >= 0 && eb + V <= rowlen) {
                raw[b] = __ldg(reinterpret_cast<const uint4*>(rowp + eb));
              } else if (rv) {
                edge |= 1u << b;
              }
            }
          }
#pragma unroll
          for (int b = 0; b < kStageB; ++b) {
            const int idx = base + b * kThreads;
            if (idx < tot) {
              int s, k, sh, eb;
              bool rv;
              const T* rowp;
              locate(idx, s, k, rv, rowp, sh, eb);
              if (edge & (1u << b)) raw[b] = LoadEdge16(rowp, eb, rowlen, rv);
              Acc v[V];
              Unpack16(raw[b], v, T());
              if constexpr (CI == 1) {
                if (k == 0) shs[s] = sh;
                StN<V>(tile + s * g.pitch + k * V, v);
              } else {
                Acc* srow = tile + s * g.pitch;
#pragma unroll
                for (int i = 0; i < V; ++i) {
                  const int rel = eb - a + i;  // element offset from staged column 0
                  if (rel >= 0 && rel < seg) {
                    const int col = cin == CI ? rel / CI : rel / cin;
                    srow[col * CP + (rel - col * cin)] = v[i];
                  }
                }
              }
            }
          }
        }
      }
      __syncthreads();
      const Acc* wf0 = wt + f0 * taps1 * taps2 * CC;
      for (int ii = 0; ii < R + taps1 - 1; ++ii) {
        const int srow = base_s + ii * g1;
        const Acc* xrow = tile + srow * g.pitch + lane * CP + (CI == 1 ? shs[srow] : 0);
        for (int f2 = 0; f2 < taps2; ++f2) {
          const int cofs = (g.gamma2 > 0 ? f2 : taps2 - 1 - f2) * g.g2;
          Acc xv[P][CI];
#pragma unroll
          for (int j = 0; j < P; ++j) LdN<CI>(xrow + (32 * j + cofs) * CP, xv[j]);
          const Acc* wrow = wf0 + f2 * CC;
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const int u = ii - r;
            if (static_cast<unsigned>(u) < static_cast<unsigned>(taps1)) {  // uniform over the warp
              const int f1 = g.gamma1 > 0 ? u : taps1 - 1 - u;
              Acc wv[CC];
              LdN<CC>(wrow + f1 * taps2 * CC, wv);
#pragma unroll
              for (int j = 0; j < P; ++j)
#pragma unroll
                for (int ci = 0; ci < CI; ++ci)
#pragma unroll
                  for (int co = 0; co < CO; ++co) acc[r][j][co] = fma(xv[j][ci], wv[ci * CO + co], acc[r][j][co]);
            }
          }
        }
      }
    }
    TO* dplane = dst + n * g.dN + t0 * g.dS0;
    WithActivation(g.act, [&](auto act_c) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int t1 = r0 + base_s + r * g1;
        if (t1 >= g.tsp[1]) continue;
#pragma unroll
        for (int j = 0; j < P; ++j) {
          const int t2 = c0 + lane + 32 * j;
          if (t2 >= g.tsp[2]) continue;
          TO* dp = dplane + (t1 * g.dS1 + t2 * g.cout);
#pragma unroll
          for (int co = 0; co < CO; ++co) {
            if (co < g.cout) {
              Acc v = acc[r][j][co];
              if (g.has_bias) v += ToAcc(bias[co]);
              dp[co] = FromAcc<TO>(Activate(v, decltype(act_c)::value));
            }
          }
        }
      }
    });
  }
}

// A kernel configuration: channel buckets (CI, CO) and per-thread work R rows x P columns x CO channels.
struct StCfg { int ci, co, r, p; };

// The staged tile of a configuration for Acc of acc_bytes and T of t_bytes (16 / t_bytes elements per 16-byte
// load): staged rows sr, columns sc, Acc elements per staged row, shared memory bytes.
struct StGeom { int64_t sr, sc, pitch, bytes; };

// False where the tile exceeds kStencilSmemMax or the kernel's 32-bit staging arithmetic.
bool StencilGeom(const StArgs& g, const StCfg& c, int64_t acc_bytes, int64_t t_bytes, StGeom* out) {
  const int64_t CP = StPitchOf(c.ci), TH = 8 * c.r, TW = 32 * c.p, V = 16 / t_bytes;
  const int64_t sr = TH + static_cast<int64_t>(g.taps[1] - 1) * g.g1;
  const int64_t sc = TW + static_cast<int64_t>(g.taps[2] - 1) * g.g2;
  const int64_t pitch = c.ci == 1 ? ((sc + 2 * V - 2) / V * V + 3) / 4 * 4 : sc * CP;
  const int64_t wn = (static_cast<int64_t>(g.ntaps) * c.ci * c.co + 3) / 4 * 4;
  const int64_t bytes = (wn + sr * pitch) * acc_bytes + (c.ci == 1 ? sr * 4 : 0);
  if (bytes > kStencilSmemMax) return false;  // the gather kernel takes it
  // the kernel's 32-bit staging arithmetic: staged source columns times channels, rows
  const int64_t kLim = int64_t(1) << 30;
  const int64_t m2a = g.m2 < 0 ? -static_cast<int64_t>(g.m2) : g.m2, m1a = g.m1 < 0 ? -static_cast<int64_t>(g.m1) : g.m1;
  if ((m2a + g.tsp[2] + TW + sc + 2 * V) * g.cin >= kLim || m1a + g.tsp[1] + TH + sr >= kLim) return false;
  *out = StGeom{sr, sc, pitch, bytes};
  return true;
}

template <class T, class TO, int CI, int CO, int R, int P>
cudaError_t LaunchStencil(const StArgs& g0, const void* src, const void* w, const void* bias, void* dst,
                          cudaStream_t s) {
  using Acc = typename AccOf<T>::type;
  constexpr int64_t TH = 8 * R, TW = 32 * P;
  StArgs g = g0;
  StGeom geo{};
  if (!StencilGeom(g, StCfg{CI, CO, R, P}, sizeof(Acc), sizeof(T), &geo)) return cudaErrorInvalidValue;
  const int64_t bytes = geo.bytes;
  auto kern = ScStencilKernel<T, TO, CI, CO, R, P>;
  if (const cudaError_t e = AllowDynamicSmem(kern, static_cast<size_t>(bytes)); e != cudaSuccess) return e;
  g.sr = static_cast<int>(geo.sr);
  g.sc = static_cast<int>(geo.sc);
  g.pitch = static_cast<int>(geo.pitch);
  g.th = static_cast<int>(CeilDiv(g.tsp[1], TH));
  g.tw = static_cast<int>(CeilDiv(g.tsp[2], TW));
  g.tiles = g.n * g.tsp[0] * g.th * g.tw;
  if (g.tiles <= 0) return cudaSuccess;
  kern<<<GridX(g.tiles), kThreads, bytes, s>>>(g, static_cast<const T*>(src), static_cast<const T*>(w),
                                               static_cast<const TO*>(bias), static_cast<TO*>(dst));
  return cudaGetLastError();
}

// Fewer than two of the stencil's 8R x 32P pixel tiles per SM: small grids take a smaller tile, twice the blocks.
inline bool FewStencilTiles(const StArgs& g, int r, int p) {
  return g.n * g.tsp[0] * CeilDiv(g.tsp[1], 8 * r) * CeilDiv(g.tsp[2], 32 * p) < 2 * kPlanSms;
}

// The channel bucket (CI, CO) and per-thread work R rows x P columns (R * P * CO <= 32 accumulators) for the
// problem's channels; false where no bucket fits.
bool PickStencilCfg(const StArgs& g, StCfg* c) {
  if (g.cin == 1) {
    if (g.cout == 1) {
      // fewer than 2 tiles of 64 x 128 per SM (1024 x 1024 is 128): 64 x 64 tiles, twice the blocks in flight
      *c = FewStencilTiles(g, 8, 4) ? StCfg{1, 1, 8, 2} : StCfg{1, 1, 8, 4};
      return true;
    }
    if (g.cout <= 4) {
      *c = StCfg{1, 4, 4, 2};
      return true;
    }
    if (g.cout <= 16) {
      *c = StCfg{1, 16, 2, 1};
      return true;
    }
  } else if (g.cin <= 4) {
    if (g.cout == 1) {
      *c = StCfg{4, 1, 4, 2};
      return true;
    }
    if (g.cout <= 4) {
      // fewer than 2 tiles of 32 x 64 per SM: 16 x 64 tiles, twice the blocks in flight (faster on msd's 4 -> 4 at
      // 512^2, 128 tiles, than 32 x 64, 8 x 64 or 16 x 32 tiles)
      *c = FewStencilTiles(g, 4, 2) ? StCfg{4, 4, 2, 2} : StCfg{4, 4, 4, 2};
      return true;
    }
  } else if (g.cin <= 16 && g.cout == 1) {
    *c = StCfg{16, 1, 4, 1};
    return true;
  }
  return false;
}

template <class T, class TO>
cudaError_t StencilByCfg(const StArgs& g, const StCfg& c, const void* src, const void* w, const void* bias, void* dst,
                         cudaStream_t s) {
  if (c.ci == 1 && c.co == 1) {
    return c.p == 2 ? LaunchStencil<T, TO, 1, 1, 8, 2>(g, src, w, bias, dst, s)
                    : LaunchStencil<T, TO, 1, 1, 8, 4>(g, src, w, bias, dst, s);
  }
  if (c.ci == 1 && c.co == 4) return LaunchStencil<T, TO, 1, 4, 4, 2>(g, src, w, bias, dst, s);
  if (c.ci == 1) return LaunchStencil<T, TO, 1, 16, 2, 1>(g, src, w, bias, dst, s);
  if (c.ci == 4 && c.co == 1) return LaunchStencil<T, TO, 4, 1, 4, 2>(g, src, w, bias, dst, s);
  if (c.ci == 4) {
    return c.r == 2 ? LaunchStencil<T, TO, 4, 4, 2, 2>(g, src, w, bias, dst, s)
                    : LaunchStencil<T, TO, 4, 4, 4, 2>(g, src, w, bias, dst, s);
  }
  return LaunchStencil<T, TO, 16, 1, 4, 1>(g, src, w, bias, dst, s);
}

// The stencil's arguments for the gather a ("" when the stencil takes its geometry).
std::string MakeStArgs(const ScArgs& a, StArgs* out) {
  if (a.alpha[1] != 1 || a.alpha[2] != 1 || a.delta[1] != 1 || a.delta[2] != 1) {
    return "it takes unit stride and no lhs dilation along H and W";
  }
  const int g1 = a.gamma[1] < 0 ? -a.gamma[1] : a.gamma[1];
  if (g1 != 1 && g1 != 2 && g1 != 4 && g1 != 8) return "it takes H dilation 1, 2, 4 or 8";
  // 1-D, short or narrow images: tiles would idle most threads
  if (a.tsp[1] < 8 || a.tsp[2] < 8) return "it takes at least 8 destination rows and columns";
  if (a.sS[2] != a.cin || a.dS[2] != a.cout) return "it takes channels-last pixels";  // (always)
  StArgs g{};
  g.n = a.n;
  g.sN = a.sN;
  g.dN = a.dN;
  for (int d = 0; d < 3; ++d) {
    g.tsp[d] = a.tsp[d];
    g.taps[d] = a.taps[d];
  }
  g.alpha0 = a.alpha[0];
  g.beta0 = a.beta[0];
  g.gamma0 = a.gamma[0];
  g.delta0 = a.delta[0];
  g.lim0 = a.lim[0];
  g.m1 = a.beta[1] + std::min(0, (a.taps[1] - 1) * a.gamma[1]);
  g.m2 = a.beta[2] + std::min(0, (a.taps[2] - 1) * a.gamma[2]);
  g.g1 = g1;
  g.gamma1 = a.gamma[1];
  g.g2 = a.gamma[2] < 0 ? -a.gamma[2] : a.gamma[2];
  g.gamma2 = a.gamma[2];
  g.lim1 = a.lim[1];
  g.lim2 = a.lim[2];
  g.sS0 = a.sS[0];
  g.sS1 = a.sS[1];
  g.dS0 = a.dS[0];
  g.dS1 = a.dS[1];
  g.wF = a.wF;
  g.wCi = a.wCi;
  g.wCo = a.wCo;
  g.cin = a.cin;
  g.cout = a.cout;
  g.ntaps = a.ntaps;
  g.act = a.act;
  g.has_bias = a.has_bias;
  *out = g;
  return {};
}

// The whole plan's conditions: geometry, channel bucket, staged tile ("" when the stencil takes the problem).
std::string StencilError(const Problem& pr, StArgs* g, StCfg* c) {
  if (std::string e = MakeStArgs(MakeScArgs(pr), g); !e.empty()) return e;
  if (!PickStencilCfg(*g, c)) {
    return "its channel buckets take (source, destination) channels (1, <= 16), (<= 4, <= 4) or (<= 16, 1)";
  }
  StGeom geo{};
  if (!StencilGeom(*g, *c, static_cast<int64_t>(AccBytes(pr.in)), DTypeBytes(pr.in), &geo)) {
    return "its staged tile takes more than 110 KiB of shared memory or past its 32-bit staging offsets";
  }
  if (geo.bytes > 48 * 1024 && geo.bytes > pr.dev.smem_optin) {
    return "its staged tile takes more shared memory than a block has";
  }
  return {};
}

}  // namespace
}  // namespace small_channel
}  // namespace cuda

namespace variants::small_stencil {

std::string Applies(const Problem& pr) {
  if (std::string e = cuda::small_channel::FamilyError(pr); !e.empty()) return e;
  cuda::small_channel::StArgs g{};
  cuda::small_channel::StCfg c{};
  return cuda::small_channel::StencilError(pr, &g, &c);
}

size_t Workspace(const Problem&) { return 0; }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  using namespace cuda::small_channel;
  StArgs g{};
  StCfg c{};
  if (!StencilError(pr, &g, &c).empty()) return cudaErrorInvalidValue;
  const GatherBuffers o = GatherBuffersOf(pr, b);
#define JAXCONV_BODY(T, TO) return StencilByCfg<T, TO>(g, c, o.src, o.w, o.bias, o.dst, s)
  JAXCONV_DTYPE_SWITCH(pr.in, pr.out, JAXCONV_BODY);
#undef JAXCONV_BODY
}

}  // namespace variants::small_stencil
}  // namespace jaxconv
