// The fused forward epilogue's activations, shared by the direct kernels (conv_cpu.cc) and the GEMM path
// (conv_igemm.cc) so that both compute them identically.
#pragma once

#include <cmath>

#include "core/conv_params.h"

namespace jaxconv {
namespace cpu {

template <class Acc>
inline Acc Activate(int act, Acc z) {
  switch (act) {
    case kActRelu:
      return z < Acc(0) ? Acc(0) : z;
    case kActGelu: {
      const Acc c = static_cast<Acc>(0.79788456080286535587989211986876);  // sqrt(2/pi)
      return Acc(0.5) * z * (Acc(1) + std::tanh(c * (z + static_cast<Acc>(0.044715) * z * z * z)));
    }
    case kActSilu:
      return z / (Acc(1) + std::exp(-z));
    default:
      return z;
  }
}

}  // namespace cpu
}  // namespace jaxconv
