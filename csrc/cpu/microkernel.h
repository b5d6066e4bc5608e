// Register-blocked GEMM micro-kernels for the CPU convolution paths (conv_igemm.cc, conv_wgrad_gemm.cc): one
// kMR x NR tile of a product per call, summed entirely in registers in a fixed order (so results never depend
// on how the callers split the work). Each has an AVX2+FMA version and a portable one; GetMicroKernels picks
// once per process (UseAvx2).
//
// No BLAS is linked: none can be installed portably from PyPI for every platform the wheel builds for, and
// these convolutions need indirect (pointer-per-tap) operands that a plain GEMM interface cannot take anyway.
#pragma once

#include <cstdint>

namespace jaxconv {
namespace cpu {

// Tile rows, and tile columns (two 256-bit vectors) per accumulation type.
inline constexpr int kMR = 6;
template <class Acc>
inline constexpr int kNR = static_cast<int>(64 / sizeof(Acc));

// A run of a position-list product: count steps, step e reading the x values at x + e*xstep (plus the
// caller's offset) and the packed B row at boff + e*bstep.
template <class Acc>
struct RunSpec {
  const Acc* x;
  int64_t xstep;
  int64_t boff;
  int64_t bstep;
  int64_t count;
};

// Indirect GEMM tile (fwd, dgrad):
//   tile[r*NR + j] = sum_{t < taps} sum_{c < cin} a[t*kMR + r][c] * b[(t*cin + c)*NR + j]
// in the order t, then c. a holds kMR row pointers per tap (each readable for cin values); b is packed,
// NR values per (t, c); tile (kMR*NR values) is overwritten.
template <class Acc>
using IgemmTileFn = void (*)(int64_t taps, int64_t cin, const Acc* const* a, const Acc* b, Acc* tile);

// Position-list tile (wgrad), rows r < rows (1..kMR):
//   tile[r*NR + j] += sum over runs u, steps e < u.count of u.x[e*u.xstep + xoff + r] * b[u.boff + e*u.bstep + j]
// in the order of the runs, then of e, starting from the values in tile.
template <class Acc>
using RunTileFn = void (*)(int rows, int64_t nruns, const RunSpec<Acc>* runs, int64_t xoff, const Acc* b,
                           Acc* tile);

template <class Acc>
struct MicroKernels {
  IgemmTileFn<Acc> igemm;
  RunTileFn<Acc> runs;
};

// Defined for float and double.
template <class Acc>
MicroKernels<Acc> GetMicroKernels();

// AVX2+FMA when the CPU has it, unless the environment sets JAXCONV_CPU_ISA=baseline. Fixed per process, so
// results are reproducible on one machine (FMA rounds differently from a separate multiply and add).
bool UseAvx2();

}  // namespace cpu
}  // namespace jaxconv
