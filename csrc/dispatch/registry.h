// The variant registry (variants.def) as the rest of the code sees it: the ordered table, the requests that
// `algorithm=` encodes, and the one function that picks a variant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/types.h"
#include "dispatch/variant.h"

namespace jaxconv {

// A request (ConvParams.algorithm): 0 auto; 1..NumFamilies() a family selector (its code is its position in
// FamilyName, 1-based); VariantCode(name) forces that variant.
inline constexpr int64_t kRequestAuto = 0;
inline constexpr int64_t kVariantRequestBase = int64_t(1) << 16;

// A variant's request code: kVariantRequestBase plus the 32-bit FNV-1a hash of its name folded to 20 bits. It depends
// on the name alone, so that exported programs that force a variant keep forcing it when the table is reordered or
// grows (the tests check that no two names share a code).
constexpr int64_t VariantCode(const char* name) {
  uint32_t h = 2166136261u;
  for (; *name != '\0'; ++name) h = (h ^ static_cast<uint8_t>(*name)) * 16777619u;
  return kVariantRequestBase + static_cast<int64_t>(((h >> 20) ^ h) & 0xFFFFFu);
}

int NumVariants();
const Variant& VariantAt(int i);
// The index of the variant called `name`, or -1.
int FindVariant(const std::string& name);
int NumFamilies();
const char* FamilyName(int code);  // code in 1..NumFamilies()
// The request for "auto", a family name or a variant name; -1 for an unknown name.
int64_t RequestOf(const std::string& name);
// Its name: "auto", the family's or the variant's; "" for a code that names nothing.
std::string RequestName(int64_t request);
// Whether the request selects variant i (auto selects every variant).
bool Selects(int64_t request, int i);
// Whether the build has the kernels (and so the predicates); builds without CUDA keep only the metadata.
bool HasKernels();
// Whether variant i is XLA's own convolution, which the lowering emits in place of a custom call.
bool LoweredByXla(int i);

// Why variant i cannot run the problem: the op or dtype it does not implement, or its predicate's reason; "" when
// it can.
std::string VariantError(int i, const Problem& pr);

// The variant that runs the problem for `request`: the first selected variant (in table order) that applies, that
// auto does not pass over (its cost rule; auto only), and whose workspace is at most max_ws bytes; with launchable,
// one the handler can launch (not XLA's convolution). -1 when none, with *why saying why each selected variant was
// passed over.
int Resolve(const Problem& pr, int64_t request, std::string* why, size_t max_ws = SIZE_MAX, bool launchable = false);

// The selected variants that apply, in table order, ignoring cost rules: autotune's candidates.
std::vector<int> Candidates(const Problem& pr, int64_t request);

}  // namespace jaxconv
