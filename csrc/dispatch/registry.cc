// The ordered table of variants.def and the choice among its entries. Compiled with and without CUDA: without it the
// table keeps names, families and files (for listings and documentation) and no variant applies.
#include "dispatch/registry.h"

#include <cstring>

#include "dispatch/cost_rules.h"

namespace jaxconv {

#ifdef JAXCONV_WITH_CUDA
// Each variant's three functions (variant.h), defined with its kernels.
#define JAXCONV_VARIANT(id, name, family, also, ops, dtypes, prefer, file, summary) \
  namespace variants::id {                                                        \
  std::string Applies(const Problem&);                                            \
  size_t Workspace(const Problem&);                                               \
  cudaError_t Launch(const Problem&, const Buffers&, cudaStream_t);               \
  }
#include "dispatch/variants.def"
#undef JAXCONV_VARIANT
// The sm90 implicit GEMM's own cost rule (it weighs the Hopper kernels against the mma.sync ones).
namespace variants::implicit_gemm_sm90 {
std::string Prefer(const Problem&);
}

// XLA's own convolution: the lowering emits it instead of a custom call (jaxconv/primitives/lowering.py), so the
// handler never launches it.
namespace variants::xla_conv {
std::string Applies(const Problem&) { return {}; }
size_t Workspace(const Problem&) { return 0; }
cudaError_t Launch(const Problem&, const Buffers&, cudaStream_t) { return cudaErrorNotSupported; }
}  // namespace variants::xla_conv
#endif

namespace {

// The variant takes every problem it applies to.
[[maybe_unused]] std::string NoRule(const Problem&) { return {}; }

#ifdef JAXCONV_WITH_CUDA
#define JAXCONV_FNS(id, prefer) prefer, &variants::id::Applies, &variants::id::Workspace, &variants::id::Launch
#else
#define JAXCONV_FNS(id, prefer) nullptr, nullptr, nullptr, nullptr
#endif

const Variant kTable[] = {
#define JAXCONV_VARIANT(id, name, family, also, ops, dtypes, prefer, file, summary) \
  {name, family, also, ops, dtypes, file, summary, JAXCONV_FNS(id, prefer)},
#include "dispatch/variants.def"
#undef JAXCONV_VARIANT
};
constexpr int kNumVariants = static_cast<int>(sizeof(kTable) / sizeof(kTable[0]));

// Family selectors, in the codes older programs use (1-based).
const char* const kFamilies[] = {"direct", "depthwise", "long1d", "small", "implicit_gemm", "implicit_gemm_sm80",
                                 "xla", "integer"};
constexpr int kNumFamilies = static_cast<int>(sizeof(kFamilies) / sizeof(kFamilies[0]));

bool FamilySelects(const char* family, const Variant& v) {
  return std::strcmp(v.family, family) == 0 || std::strcmp(v.also, family) == 0;
}

}  // namespace

int NumVariants() { return kNumVariants; }
const Variant& VariantAt(int i) { return kTable[i]; }
int NumFamilies() { return kNumFamilies; }
const char* FamilyName(int code) { return code >= 1 && code <= kNumFamilies ? kFamilies[code - 1] : ""; }

int FindVariant(const std::string& name) {
  for (int i = 0; i < kNumVariants; ++i) {
    if (name == kTable[i].name) return i;
  }
  return -1;
}

int64_t RequestOf(const std::string& name) {
  if (name == "auto") return kRequestAuto;
  for (int f = 1; f <= kNumFamilies; ++f) {
    if (name == kFamilies[f - 1]) return f;
  }
  const int i = FindVariant(name);
  return i < 0 ? -1 : VariantCode(kTable[i].name);
}

std::string RequestName(int64_t request) {
  if (request == kRequestAuto) return "auto";
  if (request >= 1 && request <= kNumFamilies) return kFamilies[request - 1];
  for (int i = 0; i < kNumVariants; ++i) {
    if (request == VariantCode(kTable[i].name)) return kTable[i].name;
  }
  return {};
}

bool LoweredByXla(int i) { return i >= 0 && i < kNumVariants && std::strcmp(kTable[i].family, "xla") == 0; }

bool Selects(int64_t request, int i) {
  if (i < 0 || i >= kNumVariants) return false;
  if (request == kRequestAuto) return true;
  if (request >= 1 && request <= kNumFamilies) return FamilySelects(kFamilies[request - 1], kTable[i]);
  return request == VariantCode(kTable[i].name);
}

bool HasKernels() {
#ifdef JAXCONV_WITH_CUDA
  return true;
#else
  return false;
#endif
}

std::string VariantError(int i, const Problem& pr) {
  if (i < 0 || i >= kNumVariants) return "no such variant";
  const Variant& v = kTable[i];
  if (!(v.ops & OpBit(pr.op))) return std::string("it has no ") + OpName(pr.op) + " kernel";
  if (!(v.dtypes & DTypeBit(pr.in))) return std::string("it takes no ") + DTypeName(pr.in) + " operands";
  if (!ValidDTypePair(pr.in, pr.out)) return "unsupported operand and result dtypes";
  if (v.applies == nullptr) return "jaxconv was built without CUDA";
  return v.applies(pr);
}

int Resolve(const Problem& pr, int64_t request, std::string* why, size_t max_ws, bool launchable) {
  std::string reasons;
  for (int i = 0; i < kNumVariants; ++i) {
    if (!Selects(request, i) || (launchable && LoweredByXla(i))) continue;
    const Variant& v = kTable[i];
    std::string r = VariantError(i, pr);
    if (r.empty() && request == kRequestAuto && v.prefer != nullptr) r = v.prefer(pr);
    if (r.empty() && v.workspace != nullptr && v.workspace(pr) > max_ws) r = "its workspace does not fit";
    if (r.empty()) return i;
    // The reasons name every selected variant that has a kernel for the op (a forced variant: whatever its reason).
    if (!(v.ops & OpBit(pr.op)) && request < kVariantRequestBase) continue;
    reasons += std::string(reasons.empty() ? "" : "; ") + v.name + ": " + r;
  }
  if (why != nullptr) {
    const std::string name = RequestName(request);
    *why = name.empty() ? "unknown algorithm request " + std::to_string(request)
                        : "no variant of algorithm=" + name + " runs this problem (" + reasons + ")";
  }
  return -1;
}

std::vector<int> Candidates(const Problem& pr, int64_t request) {
  std::vector<int> out;
  for (int i = 0; i < kNumVariants; ++i) {
    if (Selects(request, i) && VariantError(i, pr).empty()) out.push_back(i);
  }
  return out;
}

}  // namespace jaxconv
