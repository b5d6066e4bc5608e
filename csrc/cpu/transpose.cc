// The transposes of transpose.h. Blocks are walked column-block outer, row-block inner, so that each run of
// destination rows is written whole while the few source lines it reads stay in L1.
#include "cpu/transpose.h"

#include "cpu/microkernel.h"

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#include <immintrin.h>
#define JAXCONV_HAVE_AVX2_TRANSPOSE 1
#endif

namespace jaxconv {
namespace cpu {
namespace {

template <class T>
void TransposeScalar(const T* src, int64_t lds, T* dst, int64_t ldd, int64_t r0, int64_t r1, int64_t c0,
                     int64_t c1) {
  for (int64_t c = c0; c < c1; ++c) {
    for (int64_t r = r0; r < r1; ++r) dst[c * ldd + r] = src[r * lds + c];
  }
}

#ifdef JAXCONV_HAVE_AVX2_TRANSPOSE
__attribute__((target("avx2"))) void Transpose8x8(const float* s, int64_t lds, float* d, int64_t ldd) {
  __m256 r0 = _mm256_loadu_ps(s + 0 * lds), r1 = _mm256_loadu_ps(s + 1 * lds);
  __m256 r2 = _mm256_loadu_ps(s + 2 * lds), r3 = _mm256_loadu_ps(s + 3 * lds);
  __m256 r4 = _mm256_loadu_ps(s + 4 * lds), r5 = _mm256_loadu_ps(s + 5 * lds);
  __m256 r6 = _mm256_loadu_ps(s + 6 * lds), r7 = _mm256_loadu_ps(s + 7 * lds);
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  _mm256_storeu_ps(d + 0 * ldd, _mm256_permute2f128_ps(u0, u4, 0x20));
  _mm256_storeu_ps(d + 1 * ldd, _mm256_permute2f128_ps(u1, u5, 0x20));
  _mm256_storeu_ps(d + 2 * ldd, _mm256_permute2f128_ps(u2, u6, 0x20));
  _mm256_storeu_ps(d + 3 * ldd, _mm256_permute2f128_ps(u3, u7, 0x20));
  _mm256_storeu_ps(d + 4 * ldd, _mm256_permute2f128_ps(u0, u4, 0x31));
  _mm256_storeu_ps(d + 5 * ldd, _mm256_permute2f128_ps(u1, u5, 0x31));
  _mm256_storeu_ps(d + 6 * ldd, _mm256_permute2f128_ps(u2, u6, 0x31));
  _mm256_storeu_ps(d + 7 * ldd, _mm256_permute2f128_ps(u3, u7, 0x31));
}

__attribute__((target("avx2"))) void Transpose4x4(const double* s, int64_t lds, double* d, int64_t ldd) {
  const __m256d r0 = _mm256_loadu_pd(s + 0 * lds), r1 = _mm256_loadu_pd(s + 1 * lds);
  const __m256d r2 = _mm256_loadu_pd(s + 2 * lds), r3 = _mm256_loadu_pd(s + 3 * lds);
  const __m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1);
  const __m256d t2 = _mm256_unpacklo_pd(r2, r3), t3 = _mm256_unpackhi_pd(r2, r3);
  _mm256_storeu_pd(d + 0 * ldd, _mm256_permute2f128_pd(t0, t2, 0x20));
  _mm256_storeu_pd(d + 1 * ldd, _mm256_permute2f128_pd(t1, t3, 0x20));
  _mm256_storeu_pd(d + 2 * ldd, _mm256_permute2f128_pd(t0, t2, 0x31));
  _mm256_storeu_pd(d + 3 * ldd, _mm256_permute2f128_pd(t1, t3, 0x31));
}

template <class T, int B, void (*Kernel)(const T*, int64_t, T*, int64_t)>
void TransposeAvx2(const T* src, int64_t lds, T* dst, int64_t ldd, int64_t rows, int64_t cols) {
  const int64_t rb = rows / B * B, cb = cols / B * B;
  for (int64_t c = 0; c < cb; c += B) {
    for (int64_t r = 0; r < rb; r += B) Kernel(src + r * lds + c, lds, dst + c * ldd + r, ldd);
  }
  TransposeScalar(src, lds, dst, ldd, rb, rows, 0, cols);
  TransposeScalar(src, lds, dst, ldd, 0, rb, cb, cols);
}
#endif

}  // namespace

void TransposeBlock(const float* src, int64_t lds, float* dst, int64_t ldd, int64_t rows, int64_t cols) {
#ifdef JAXCONV_HAVE_AVX2_TRANSPOSE
  if (UseAvx2()) return TransposeAvx2<float, 8, &Transpose8x8>(src, lds, dst, ldd, rows, cols);
#endif
  TransposeScalar(src, lds, dst, ldd, 0, rows, 0, cols);
}

void TransposeBlock(const double* src, int64_t lds, double* dst, int64_t ldd, int64_t rows, int64_t cols) {
#ifdef JAXCONV_HAVE_AVX2_TRANSPOSE
  if (UseAvx2()) return TransposeAvx2<double, 4, &Transpose4x4>(src, lds, dst, ldd, rows, cols);
#endif
  TransposeScalar(src, lds, dst, ldd, 0, rows, 0, cols);
}

}  // namespace cpu
}  // namespace jaxconv
