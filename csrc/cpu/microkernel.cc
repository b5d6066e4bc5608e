// The micro-kernels of microkernel.h. The portable versions are plain loops over fixed tile sizes (the
// compiler vectorizes them for the baseline ISA); the AVX2 versions keep the kMR x NR accumulators in twelve
// ymm registers and broadcast one A value per row per step, as in the usual 6x16 GEMM kernels.
#include "cpu/microkernel.h"

#include <cstdlib>
#include <cstring>

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#include <immintrin.h>
#define JAXCONV_HAVE_AVX2_KERNELS 1
#endif

namespace jaxconv {
namespace cpu {
namespace {

// ---------------------------------------------------------------------------------------------------------
// Portable kernels
// ---------------------------------------------------------------------------------------------------------

template <class Acc>
void IgemmTilePortable(int64_t taps, int64_t cin, const Acc* const* a, const Acc* b, Acc* tile) {
  constexpr int NR = kNR<Acc>;
  Acc acc[kMR][NR] = {};
  for (int64_t t = 0; t < taps; ++t) {
    const Acc* const* at = a + t * kMR;
    for (int64_t c = 0; c < cin; ++c, b += NR) {
      for (int r = 0; r < kMR; ++r) {
        const Acc av = at[r][c];
        for (int j = 0; j < NR; ++j) acc[r][j] += av * b[j];
      }
    }
  }
  std::memcpy(tile, acc, sizeof(acc));
}

template <class Acc>
void RunTilePortable(int rows, int64_t nruns, const RunSpec<Acc>* runs, int64_t xoff, const Acc* b, Acc* tile) {
  constexpr int NR = kNR<Acc>;
  Acc acc[kMR][NR];
  std::memcpy(acc, tile, sizeof(acc));
  for (int64_t u = 0; u < nruns; ++u) {
    const RunSpec<Acc>& run = runs[u];
    const Acc* x = run.x + xoff;
    const Acc* bb = b + run.boff;
    for (int64_t e = 0; e < run.count; ++e, x += run.xstep, bb += run.bstep) {
      for (int r = 0; r < rows; ++r) {
        const Acc av = x[r];
        for (int j = 0; j < NR; ++j) acc[r][j] += av * bb[j];
      }
    }
  }
  std::memcpy(tile, acc, sizeof(acc));
}

// ---------------------------------------------------------------------------------------------------------
// AVX2 + FMA kernels
// ---------------------------------------------------------------------------------------------------------

#ifdef JAXCONV_HAVE_AVX2_KERNELS
#define JAXCONV_AVX2 __attribute__((target("avx2,fma")))
#define JAXCONV_AVX2_INLINE inline __attribute__((target("avx2,fma"), always_inline))

// The vector operations, overloaded on the element type (8 floats or 4 doubles per vector).
JAXCONV_AVX2_INLINE __m256 VZero(const float*) { return _mm256_setzero_ps(); }
JAXCONV_AVX2_INLINE __m256d VZero(const double*) { return _mm256_setzero_pd(); }
JAXCONV_AVX2_INLINE __m256 VLoad(const float* p) { return _mm256_loadu_ps(p); }
JAXCONV_AVX2_INLINE __m256d VLoad(const double* p) { return _mm256_loadu_pd(p); }
JAXCONV_AVX2_INLINE __m256 VBcast(const float* p) { return _mm256_broadcast_ss(p); }
JAXCONV_AVX2_INLINE __m256d VBcast(const double* p) { return _mm256_broadcast_sd(p); }
JAXCONV_AVX2_INLINE __m256 VFma(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
JAXCONV_AVX2_INLINE __m256d VFma(__m256d a, __m256d b, __m256d c) { return _mm256_fmadd_pd(a, b, c); }
JAXCONV_AVX2_INLINE void VStore(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
JAXCONV_AVX2_INLINE void VStore(double* p, __m256d v) { _mm256_storeu_pd(p, v); }

template <class Acc>
JAXCONV_AVX2 void IgemmTileAvx2(int64_t taps, int64_t cin, const Acc* const* a, const Acc* b, Acc* tile) {
  using V = decltype(VLoad(b));
  constexpr int L = 32 / static_cast<int>(sizeof(Acc));
  V c00 = VZero(b), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  V c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t t = 0; t < taps; ++t) {
    const Acc* a0 = a[t * kMR + 0];
    const Acc* a1 = a[t * kMR + 1];
    const Acc* a2 = a[t * kMR + 2];
    const Acc* a3 = a[t * kMR + 3];
    const Acc* a4 = a[t * kMR + 4];
    const Acc* a5 = a[t * kMR + 5];
    for (int64_t c = 0; c < cin; ++c, b += 2 * L) {
      const V b0 = VLoad(b), b1 = VLoad(b + L);
      V v = VBcast(a0 + c);
      c00 = VFma(v, b0, c00);
      c01 = VFma(v, b1, c01);
      v = VBcast(a1 + c);
      c10 = VFma(v, b0, c10);
      c11 = VFma(v, b1, c11);
      v = VBcast(a2 + c);
      c20 = VFma(v, b0, c20);
      c21 = VFma(v, b1, c21);
      v = VBcast(a3 + c);
      c30 = VFma(v, b0, c30);
      c31 = VFma(v, b1, c31);
      v = VBcast(a4 + c);
      c40 = VFma(v, b0, c40);
      c41 = VFma(v, b1, c41);
      v = VBcast(a5 + c);
      c50 = VFma(v, b0, c50);
      c51 = VFma(v, b1, c51);
    }
  }
  VStore(tile + 0 * L, c00);
  VStore(tile + 1 * L, c01);
  VStore(tile + 2 * L, c10);
  VStore(tile + 3 * L, c11);
  VStore(tile + 4 * L, c20);
  VStore(tile + 5 * L, c21);
  VStore(tile + 6 * L, c30);
  VStore(tile + 7 * L, c31);
  VStore(tile + 8 * L, c40);
  VStore(tile + 9 * L, c41);
  VStore(tile + 10 * L, c50);
  VStore(tile + 11 * L, c51);
}

template <class Acc, int R>
JAXCONV_AVX2 void RunTileAvx2Rows(int64_t nruns, const RunSpec<Acc>* runs, int64_t xoff, const Acc* b,
                                  Acc* tile) {
  using V = decltype(VLoad(b));
  constexpr int L = 32 / static_cast<int>(sizeof(Acc));
  V c0[R], c1[R];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    c0[r] = VLoad(tile + (2 * r) * L);
    c1[r] = VLoad(tile + (2 * r + 1) * L);
  }
  for (int64_t u = 0; u < nruns; ++u) {
    const Acc* x = runs[u].x + xoff;
    const Acc* bb = b + runs[u].boff;
    const int64_t xstep = runs[u].xstep, bstep = runs[u].bstep;
    for (int64_t e = runs[u].count; e > 0; --e, x += xstep, bb += bstep) {
      const V b0 = VLoad(bb), b1 = VLoad(bb + L);
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        const V v = VBcast(x + r);
        c0[r] = VFma(v, b0, c0[r]);
        c1[r] = VFma(v, b1, c1[r]);
      }
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    VStore(tile + (2 * r) * L, c0[r]);
    VStore(tile + (2 * r + 1) * L, c1[r]);
  }
}

template <class Acc>
void RunTileAvx2(int rows, int64_t nruns, const RunSpec<Acc>* runs, int64_t xoff, const Acc* b, Acc* tile) {
  switch (rows) {
    case 1: return RunTileAvx2Rows<Acc, 1>(nruns, runs, xoff, b, tile);
    case 2: return RunTileAvx2Rows<Acc, 2>(nruns, runs, xoff, b, tile);
    case 3: return RunTileAvx2Rows<Acc, 3>(nruns, runs, xoff, b, tile);
    case 4: return RunTileAvx2Rows<Acc, 4>(nruns, runs, xoff, b, tile);
    case 5: return RunTileAvx2Rows<Acc, 5>(nruns, runs, xoff, b, tile);
    default: return RunTileAvx2Rows<Acc, 6>(nruns, runs, xoff, b, tile);
  }
}
#endif  // JAXCONV_HAVE_AVX2_KERNELS

}  // namespace

bool UseAvx2() {
#ifdef JAXCONV_HAVE_AVX2_KERNELS
  static const bool use = [] {
    const char* s = std::getenv("JAXCONV_CPU_ISA");
    if (s != nullptr && std::strcmp(s, "baseline") == 0) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return use;
#else
  return false;
#endif
}

template <class Acc>
MicroKernels<Acc> GetMicroKernels() {
#ifdef JAXCONV_HAVE_AVX2_KERNELS
  if (UseAvx2()) return {&IgemmTileAvx2<Acc>, &RunTileAvx2<Acc>};
#endif
  return {&IgemmTilePortable<Acc>, &RunTilePortable<Acc>};
}

template MicroKernels<float> GetMicroKernels<float>();
template MicroKernels<double> GetMicroKernels<double>();

}  // namespace cpu
}  // namespace jaxconv
