// auto's cost rules: for a problem a variant applies to, why auto passes it over ("" to take it). variants.def names
// a variant's rule; the reasons are what `python -m jaxconv.algorithms --explain` prints. Each rule states the
// measurement it rests on where it is defined (cost_rules.cc).
#pragma once

#include <string>

#include "core/types.h"

namespace jaxconv {

// long1d.tiled: windows of 64 taps or more.
std::string PreferLongWindow(const Problem& pr);
// The tensor-core variants against the few-channel and depthwise families.
std::string PreferTensorCores(const Problem& pr);
// implicit_gemm.padded_k_sm90 against XLA's convolution.
std::string PreferPaddedK(const Problem& pr);
// depthwise.tiled and depthwise.gather against XLA's convolution.
std::string PreferDepthwiseVectors(const Problem& pr);

}  // namespace jaxconv
