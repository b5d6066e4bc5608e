// Warp-level tensor-core helpers shared by the mma.sync kernels (sm_80+; every architecture jaxconv builds for).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace jaxconv {
namespace cuda {

// d += a * b, m16n8k16, 16-bit operands (bf16 when kBF16, else f16), f32 accumulators. Fragments as in the PTX ISA:
// lane = 4 * group + t; a[0] (row group, cols 2t, 2t+1), a[1] (row group + 8), a[2] / a[3] the same at cols + 8;
// b0 (rows 2t, 2t+1 of column group), b1 (rows + 8); d[0..1] (row group, cols 2t, 2t+1), d[2..3] (row group + 8).
template <bool kBF16>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kBF16) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#endif
}

// ldmatrix .x2 / .x4 (.trans with kTrans): lanes 8i..8i+7 give the rows of matrix i (16 bytes each, 16-byte
// aligned, shared memory); r[i] receives matrix i in the A-fragment order above (row lane / 4, cols 2 (lane % 4),
// + 1), or transposed with kTrans (rows 2 (lane % 4), + 1 of col lane / 4).
template <int N, bool kTrans = false>
__device__ __forceinline__ void LdMatrix(uint32_t (&r)[N], const void* row) {
  static_assert(N == 2 || N == 4, "x2 or x4");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (N == 2 && !kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a)
                 : "memory");
  } else if constexpr (N == 4 && !kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
  } else {
    static_assert(N == 4, "x4 only transposed");
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
  }
#endif
}

// Two consecutive outputs as one 4- (16-bit) or 8-byte (f32) store.
template <class T>
__device__ __forceinline__ void StorePair(T* dst, float v0, float v1) {
  if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v0, v1);
  } else {
    *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(v0, v1);
  }
}

}  // namespace cuda
}  // namespace jaxconv
