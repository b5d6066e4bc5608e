// pybind11 module jaxconv._jaxconv_native: the FFI handler capsules per platform, the ConvParams field list
// (the single source of the packed attribute layout) and build information.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/conv_params.h"
#include "core/types.h"
#include "dispatch/registry.h"
#include "ffi/stream_timer.h"
#include "xla/ffi/api/api.h"

#ifdef JAXCONV_WITH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/shared/kernels.h"
#endif

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxconvFwdCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxconvDgradCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxconvWgradCpu);

#ifdef JAXCONV_WITH_CUDA
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxconvFwdCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxconvDgradCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxconvWgradCuda);
#endif

#ifndef JAXCONV_CUDA_ARCHS
#define JAXCONV_CUDA_ARCHS ""
#endif

namespace py = pybind11;

namespace {

jaxconv::DType ParseDType(const std::string& d) {
  for (int t = 0; t < jaxconv::kNumDTypes; ++t) {
    const auto dt = static_cast<jaxconv::DType>(t);
    if (d == jaxconv::DTypeName(dt)) return dt;
  }
  throw py::value_error("jaxconv: unsupported dtype " + d);
}

jaxconv::Op ParseOp(const std::string& op) {
  if (op == "fwd") return jaxconv::Op::kFwd;
  if (op == "dgrad") return jaxconv::Op::kDgrad;
  if (op == "wgrad") return jaxconv::Op::kWgrad;
  throw py::value_error("jaxconv: unknown op " + op + " (expected fwd, dgrad or wgrad)");
}

// The Problem of packed params, op and dtype names, and a device (arch, sms, smem_optin) or None for a default Hopper.
jaxconv::Problem MakeProblem(const char* fn, const std::string& op, const std::vector<int64_t>& params,
                             const std::string& dtype, const std::string& out_dtype, const py::object& device) {
  jaxconv::Problem pr;
  const std::string err = jaxconv::DecodeParams(params.data(), static_cast<int64_t>(params.size()), &pr.p);
  if (!err.empty()) throw py::value_error(std::string(fn) + ": " + err);
  pr.op = ParseOp(op);
  pr.in = ParseDType(dtype);
  pr.out = ParseDType(out_dtype);
  if (device.is_none()) {
    pr.dev = jaxconv::DefaultDevice(90);
  } else {
    const auto t = device.cast<std::tuple<int, int64_t, int64_t>>();
    pr.dev.arch = std::get<0>(t);
    pr.dev.sms = std::get<1>(t);
    pr.dev.smem_optin = std::get<2>(t);
  }
  return pr;
}

py::list MaskNames(unsigned mask, int count, const char* (*name)(int)) {
  py::list out;
  for (int i = 0; i < count; ++i) {
    if (mask & (1u << i)) out.append(name(i));
  }
  return out;
}

template <typename T>
py::capsule Capsule(T* fn) {
  return py::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

PYBIND11_MODULE(_jaxconv_native, m) {
  m.doc() = "jaxconv native kernels: XLA FFI handlers for the CPU (and, when built with it, CUDA) platform";

  m.def(
      "registrations",
      [] {
        py::dict regs;
        py::dict cpu;
        cpu["jaxconv_fwd"] = Capsule(&JaxconvFwdCpu);
        cpu["jaxconv_dgrad"] = Capsule(&JaxconvDgradCpu);
        cpu["jaxconv_wgrad"] = Capsule(&JaxconvWgradCpu);
        cpu["jaxconv_timer_mark"] = Capsule(&JaxconvTimerMarkCpu);
        regs["cpu"] = cpu;
#ifdef JAXCONV_WITH_CUDA
        py::dict cuda;
        cuda["jaxconv_fwd"] = Capsule(&JaxconvFwdCuda);
        cuda["jaxconv_dgrad"] = Capsule(&JaxconvDgradCuda);
        cuda["jaxconv_wgrad"] = Capsule(&JaxconvWgradCuda);
        cuda["jaxconv_timer_mark"] = Capsule(&JaxconvTimerMarkCuda);
        regs["CUDA"] = cuda;
#endif
        return regs;
      },
      "{platform: {target name: FFI handler capsule}} for jax.ffi.register_ffi_target (api_version=1).");

  m.def(
      "param_fields",
      [] {
        py::list fields;
#define JAXCONV_LIST_FIELD(name, count) fields.append(py::make_tuple(#name, static_cast<int>(count)));
        JAXCONV_PARAM_FIELDS(JAXCONV_LIST_FIELD)
#undef JAXCONV_LIST_FIELD
        return fields;
      },
      "[(name, count)] of the packed int64 `params` attribute, in order.");

  m.def(
      "variants",
      [] {
        py::list out;
        for (int i = 0; i < jaxconv::NumVariants(); ++i) {
          const jaxconv::Variant& v = jaxconv::VariantAt(i);
          py::dict d;
          d["name"] = v.name;
          d["family"] = v.family;
          d["also"] = v.also;
          d["ops"] = MaskNames(v.ops, jaxconv::kNumOps,
                               [](int i) { return jaxconv::OpName(static_cast<jaxconv::Op>(i)); });
          d["dtypes"] = MaskNames(v.dtypes, jaxconv::kNumDTypes,
                                  [](int i) { return jaxconv::DTypeName(static_cast<jaxconv::DType>(i)); });
          d["file"] = v.file;
          d["summary"] = v.summary;
          out.append(d);
        }
        return out;
      },
      "The variant registry in auto's order: [dict(name, family, also, ops, dtypes, file, summary)].");

  m.def(
      "families",
      [] {
        py::list out;
        for (int f = 1; f <= jaxconv::NumFamilies(); ++f) out.append(jaxconv::FamilyName(f));
        return out;
      },
      "The family selector names, in the order of their request codes (1-based).");

  m.def("request_of", [](const std::string& name) { return jaxconv::RequestOf(name); }, py::arg("name"),
        "The params.algorithm code of 'auto', a family or a variant name; -1 for an unknown name.");

  m.def("has_kernels", &jaxconv::HasKernels, "Whether the build has the CUDA kernels (and their predicates).");

  m.def(
      "resolve",
      [](const std::string& op, const std::vector<int64_t>& params, const std::string& dtype,
         const std::string& out_dtype, const py::object& device) {
        const jaxconv::Problem pr = MakeProblem("resolve", op, params, dtype, out_dtype, device);
        std::string why;
        const int i = jaxconv::Resolve(pr, pr.p.algorithm[0], &why);
        const int64_t ws = i >= 0 ? static_cast<int64_t>(jaxconv::VariantAt(i).workspace(pr)) : 0;
        return py::make_tuple(i, i >= 0 ? std::string(jaxconv::VariantAt(i).name) : std::string(), ws, why);
      },
      py::arg("op"), py::arg("params"), py::arg("dtype"), py::arg("out_dtype"), py::arg("device") = py::none(),
      "(index, name, workspace bytes, why) of the variant the request in the packed params runs on the device "
      "(arch, sms, smem_optin), or a default Hopper for None; index -1 and why when none does.");

  m.def(
      "explain",
      [](const std::string& op, const std::vector<int64_t>& params, const std::string& dtype,
         const std::string& out_dtype, const py::object& device) {
        const jaxconv::Problem pr = MakeProblem("explain", op, params, dtype, out_dtype, device);
        py::list out;
        for (int i = 0; i < jaxconv::NumVariants(); ++i) {
          std::string r = jaxconv::VariantError(i, pr);
          const jaxconv::Variant& v = jaxconv::VariantAt(i);
          std::string prefer = r.empty() && v.prefer != nullptr ? v.prefer(pr) : std::string();
          out.append(py::make_tuple(v.name, r, prefer));
        }
        return out;
      },
      py::arg("op"), py::arg("params"), py::arg("dtype"), py::arg("out_dtype"), py::arg("device") = py::none(),
      "[(name, why it does not apply or '', why auto passes it over or '')] for every variant, in table order.");

  m.def(
      "device_info",
      [](int ordinal) -> py::object {
#ifdef JAXCONV_WITH_CUDA
        jaxconv::Device d;
        if (jaxconv::cuda::QueryDevice(ordinal, &d)) return py::make_tuple(d.arch, d.sms, d.smem_optin);
#endif
        return py::none();
      },
      py::arg("ordinal"), "(arch, sms, smem_optin) of CUDA device `ordinal`, or None (no CUDA build or no GPU).");

  m.def(
      "default_device", [](int arch) {
        const jaxconv::Device d = jaxconv::DefaultDevice(arch);
        return py::make_tuple(d.arch, d.sms, d.smem_optin);
      },
      py::arg("arch"), "(arch, sms, smem_optin) the registry assumes for a GPU of this compute capability.");

  // The benchmarks' in-stream timer (stream_timer.h).
  m.def("timer_create", &jaxconv::TimerCreate, "A new id for jaxconv_timer_mark's `timer` attribute.");
  m.def(
      "timer_elapsed_us",
      [](int64_t id) {
        std::string err;
        const double us = jaxconv::TimerElapsedUs(id, &err);
        if (!err.empty()) throw py::value_error("timer_elapsed_us: " + err);
        return us;
      },
      py::arg("id"),
      "Microseconds between the last start (slot 0) and end (slot 1) marks of the timer: CUDA event time on the "
      "GPU (waits for the end mark), host steady-clock time on the CPU.");
  m.def("timer_release", &jaxconv::TimerRelease, py::arg("id"), "Frees the timer's events.");

  m.def(
      "build_info",
      [] {
        py::dict info;
#ifdef JAXCONV_WITH_CUDA
        info["cuda"] = true;
        info["cuda_archs"] = std::string(JAXCONV_CUDA_ARCHS);
        int version = 0;
        // Reports the (statically linked) runtime's version; needs no driver or GPU.
        if (cudaRuntimeGetVersion(&version) != cudaSuccess) version = 0;
        info["cuda_runtime_version"] = version;
#else
        info["cuda"] = false;
        info["cuda_archs"] = std::string();
        info["cuda_runtime_version"] = 0;
#endif
        info["abi_version"] = static_cast<int64_t>(jaxconv::kParamsAbiVersion);
        return info;
      },
      "dict(cuda, cuda_archs, cuda_runtime_version, abi_version).");
}
