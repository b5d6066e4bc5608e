// pybind11 module jaxconv._jaxconv_native: the FFI handler capsules per platform, the ConvParams field list
// (the single source of the packed attribute layout) and build information.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "algorithms.h"
#include "conv_params.h"
#include "ffi/stream_timer.h"
#include "xla/ffi/api/api.h"

#ifdef JAXCONV_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/kernels.h"
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

// Bytes of an element of a dtype name (the predicates' ElemBytes); unknown names throw.
int DtypeBytes(const std::string& d) {
  if (d == "float64") return 8;
  if (d == "float32") return 4;
  if (d == "bfloat16" || d == "float16") return 2;
  throw py::value_error("jaxconv: unsupported dtype " + d);
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
      "algorithm_error",
      [](const std::vector<int64_t>& params, const std::string& dtype, const std::string& out_dtype) -> std::string {
        jaxconv::ConvParams p;
        const std::string err = jaxconv::DecodeParams(params.data(), static_cast<int64_t>(params.size()), &p);
        if (!err.empty()) throw py::value_error("algorithm_error: " + err);
        std::string why;
        const jaxconv::ElemBytes eb{DtypeBytes(dtype), DtypeBytes(out_dtype)};
        return jaxconv::ResolveAlgorithm(p, eb, &why) < 0 ? why : std::string();
      },
      py::arg("params"), py::arg("dtype"), py::arg("out_dtype"),
      "Why the packed params' forced algorithm cannot run the problem on the GPU with these operand and result "
      "dtype names ('' when it can, or for auto).");

  m.def(
      "workspace_bytes",
      [](const std::string& op, const std::vector<int64_t>& params, const std::string& dtype,
         const std::string& out_dtype) -> int64_t {
        jaxconv::ConvParams p;
        const std::string err = jaxconv::DecodeParams(params.data(), static_cast<int64_t>(params.size()), &p);
        if (!err.empty()) throw py::value_error("workspace_bytes: " + err);
        if (op != "fwd" && op != "dgrad" && op != "wgrad") throw py::value_error("workspace_bytes: unknown op " + op);
#ifdef JAXCONV_WITH_CUDA
        using jaxconv::cuda::CudaOp;
        using jaxconv::cuda::DT;
        const CudaOp cop = op == "fwd" ? CudaOp::kFwd : op == "dgrad" ? CudaOp::kDgrad : CudaOp::kWgrad;
        auto to_dt = [](const std::string& d) {
          return d == "float64" ? DT::kF64 : d == "bfloat16" ? DT::kBF16 : d == "float16" ? DT::kF16 : DT::kF32;
        };
        return static_cast<int64_t>(jaxconv::cuda::WorkspaceBytes(p, cop, to_dt(dtype), to_dt(out_dtype)));
#else
        return 0;
#endif
      },
      py::arg("op"), py::arg("params"), py::arg("dtype"), py::arg("out_dtype"),
      "Bytes of device workspace the CUDA kernels of `op` ('fwd', 'dgrad', 'wgrad') need for the packed "
      "params and the operand and result dtype names; 0 without CUDA.");

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
