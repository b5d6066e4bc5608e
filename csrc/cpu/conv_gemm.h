// The GEMM paths of the CPU kernels, for dense convolutions (many channels per group): fwd and dgrad as
// indirect GEMMs (conv_igemm.cc), wgrad as a GEMM over output positions (conv_wgrad_gemm.cc), both on the
// micro-kernels of microkernel.h and the pool of thread_pool.h. conv_cpu.cc runs them where they apply and
// its direct kernels elsewhere.
//
// Inputs are the channels-last accumulation-type tensors conv_cpu.cc prepares: x (N, IS, C), w (F, Cg, K),
// dy (N / batch_groups, OS, K). fwd and dgrad write the output buffer itself (y, dx), in the params' layout and
// the output type Out (Acc, or f32 / bf16 / f16 for a float Acc); wgrad writes dw (F, Cg, K) in Acc. Every
// output element is written. Each
// output element is summed by one micro-kernel call in an order fixed by the problem's shape alone (wgrad:
// when the output is too small to share out, its reduction is split into a number of parts that depends on
// the shape only, added in a fixed order), so results do not depend on the thread count or on scheduling.
// The functions return false when a worker failed (out of memory).
#pragma once

#include <cstdint>

#include "core/conv_params.h"

namespace jaxconv {
namespace cpu {

bool IgemmFwdApplies(const ConvParams& p);
bool IgemmDgradApplies(const ConvParams& p);
bool WgradGemmApplies(const ConvParams& p);

// y = act(bias + conv(x, w)); bias is null or has k values.
template <class Acc, class Out>
bool IgemmFwd(const ConvParams& p, const Acc* x, const Acc* w, const Acc* bias, Out* y);
template <class Acc, class Out>
bool IgemmDgrad(const ConvParams& p, const Acc* dy, const Acc* w, Out* dx);
template <class Acc>
bool WgradGemm(const ConvParams& p, const Acc* x, const Acc* dy, Acc* dw);

// Multiply-adds below which one more thread costs more than it saves.
inline constexpr double kGemmMinWorkPerThread = 1 << 18;

}  // namespace cpu
}  // namespace jaxconv
