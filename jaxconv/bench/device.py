"""Device description, peak rates for the roofline floor, and run metadata."""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
import time

import numpy as np

# Per-GPU constants (FLOP/s, bytes/s). "measured" = measured on the project's H100 (bf16 GEMM, device copy);
# the rest are NVIDIA datasheet numbers (dense, no sparsity). H200 = H100 compute with HBM3e bandwidth.
_H100 = dict(bf16_tc=798e12, fp16_tc=798e12, tf32_tc=495e12, fp32_fma=67e12, fp64_tc=67e12, fp64_fma=34e12,
             copy_bw=3.0e12, launch_us=2.0,
             notes="H100 SXM: bf16/fp16 tensor-core 798 TFLOP/s (measured GEMM; datasheet 989), TF32 495, "
                   "FP32 FMA 67, FP64 67 (tensor core) / 34 (FMA) TFLOP/s (datasheet); copy 3.0 TB/s measured; "
                   "+2 us per kernel launch")
_H200 = dict(_H100, copy_bw=4.3e12,
             notes="H200: H100 compute (bf16 798 measured-on-H100, TF32 495, FP32 FMA 67 TFLOP/s); copy ~4.3 TB/s; "
                   "+2 us per kernel launch")
GPU_PEAKS = {"H100": _H100, "H200": _H200}


def _gpu_peaks(kind: str):
    for key, v in GPU_PEAKS.items():
        if key.lower() in kind.lower():
            return dict(v, table=key)
    return dict(_H100, table="H100 (fallback: unknown GPU '%s')" % kind)


def _best_gemm_rate(dt, sizes, reps):
    """Best-of GEMM rate over numpy (BLAS) and jax (XLA:CPU): a rough peak that survives a noisy machine."""
    import jax
    import jax.numpy as jnp
    rng = np.random.default_rng(0)
    best_rate, who = 0.0, "?"
    mm = jax.jit(lambda x, y: x @ y)
    for n in sizes:
        a = rng.standard_normal((n, n)).astype(dt)
        b = rng.standard_normal((n, n)).astype(dt)
        ja, jb = jnp.asarray(a), jnp.asarray(b)
        for name, fn in (("numpy", lambda: a @ b), ("xla", lambda: mm(ja, jb).block_until_ready())):
            try:
                fn()
                for _ in range(reps):
                    t0 = time.perf_counter()
                    fn()
                    r = 2.0 * n ** 3 / (time.perf_counter() - t0)
                    if r > best_rate:
                        best_rate, who = r, f"{name} {n}^3"
            except Exception:
                pass
    return best_rate, who


def measure_cpu_peaks(quick: bool = False) -> dict:
    """Rough CPU rates: best-of GEMM (numpy BLAS and XLA, f32 and f64, all threads) and a large-array copy."""
    import jax
    sizes = (512,) if quick else (512, 1024)
    reps = 5 if quick else 7
    f32, w32 = _best_gemm_rate(np.float32, sizes, reps)
    if jax.config.jax_enable_x64:
        f64, w64 = _best_gemm_rate(np.float64, sizes, reps)
    else:  # without x64, jnp would silently compute in f32; numpy only
        f64, w64 = 0.0, "numpy"
        a = np.random.default_rng(0).standard_normal((sizes[-1],) * 2)
        a @ a
        for _ in range(reps):
            t0 = time.perf_counter()
            a @ a
            f64 = max(f64, 2.0 * sizes[-1] ** 3 / (time.perf_counter() - t0))
    m = (16 if quick else 64) << 20
    src = np.random.default_rng(0).standard_normal(m // 8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    bw = 2.0 * src.nbytes / best  # read + write
    return dict(bf16_tc=f32, fp16_tc=f32, tf32_tc=f32, fp32_fma=f32, fp64_tc=f64, fp64_fma=f64, copy_bw=bw,
                launch_us=0.0, table="CPU (measured at start-up)",
                notes=f"CPU (measured at start-up, best-of; rough, load-sensitive): GEMM f32 {f32 / 1e9:.1f} GFLOP/s "
                      f"({w32}), f64 {f64 / 1e9:.1f} GFLOP/s ({w64}); copy {bw / 1e9:.1f} GB/s (read+write, "
                      f"{m >> 20} MiB); bf16/f16 use the f32 rate; no launch term")


def peaks_for(platform_name: str, device_kind: str, quick: bool = False) -> dict:
    if platform_name == "cpu":
        return measure_cpu_peaks(quick)
    return _gpu_peaks(device_kind)


# Which peak a path runs at.
#  best path: what the best available implementation (cuDNN) can use for that dtype / precision.
#  jaxconv path: FP32 FMA unless jaxconv is known to use tensor cores.
def best_path_peak(dtype: str, peaks: dict):
    return {"bfloat16": ("bf16_tc", "bf16 tensor core"), "float16": ("fp16_tc", "fp16 tensor core"),
            "float32": ("tf32_tc", "TF32 tensor core (lax DEFAULT precision)"),
            "float32-high": ("tf32_tc", "TF32 tensor core"),
            "float32-highest": ("fp32_fma", "FP32 FMA (HIGHEST: no TF32)"),
            "float64": ("fp64_tc", "FP64 tensor core")}[dtype]


def jaxconv_path_peak(dtype: str, peaks: dict, tensor_cores: bool):
    if tensor_cores:
        return best_path_peak(dtype, peaks)
    if dtype == "float64":
        return ("fp64_fma", "FP64 FMA (jaxconv: no tensor cores)")
    return ("fp32_fma", "FP32 FMA (jaxconv: no tensor cores; f32 accumulate for all dtypes)")


def _git(args, cwd):
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:
        return ""


def display_path(path):
    """`path` as reports record it: relative to the working directory when inside it, else its file name, so
    results files name no machine's directories."""
    if not path:
        return path
    rel = os.path.relpath(os.path.abspath(path))
    return rel if not rel.startswith("..") else os.path.basename(path)


def run_metadata(argv) -> dict:
    """The run's environment; `argv`'s paths as display_path gives them (argv[0]: the program)."""
    import jax
    import jaxlib
    dev = jax.devices()[0]
    here = os.path.dirname(os.path.abspath(__file__))
    # A copied tree (as on a lent GPU machine, whose .git may be absent or stale) names its commit in
    # JAXCONV_COMMIT; the caller's word wins over git's.
    commit = os.environ.get("JAXCONV_COMMIT")
    dirty = None
    if not commit:
        commit = _git(["rev-parse", "HEAD"], here)
        dirty = bool(_git(["status", "--porcelain", "--untracked-files=no"], here)) if commit else None
    meta = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        host=platform.node(), python=platform.python_version(), jax=jax.__version__,
        jaxlib=getattr(jaxlib, "__version__", "?"), numpy=np.__version__,
        backend=jax.default_backend(), platform=dev.platform,
        device=str(dev), device_kind=getattr(dev, "device_kind", "?"), device_count=jax.device_count(),
        git_commit=commit or None, git_dirty=dirty,
        argv=[display_path(a) if os.path.isabs(a) else a for a in argv],
        cpu_count=os.cpu_count(),
    )
    try:
        import jaxconv
        meta["jaxconv_build_info"] = {k: v for k, v in dict(jaxconv.build_info()).items()}
    except Exception as e:  # the harness still runs lax-only
        meta["jaxconv_build_info"] = f"unavailable: {type(e).__name__}: {e}"
    return meta


def memory_budget_bytes(platform_name: str) -> int:
    """How much the input/output sets of one timing series may take."""
    import jax
    if platform_name != "cpu":
        try:
            st = jax.devices()[0].memory_stats() or {}
            lim = st.get("bytes_limit") or st.get("bytes_reservable_limit")
            if lim:
                return int(0.35 * lim)
        except Exception:
            pass
        return 16 << 30
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return int(0.25 * total)
    except Exception:
        return 4 << 30
