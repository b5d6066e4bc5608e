"""Optional PyTorch comparison (--torch): same inputs (via DLPack), same precision, aten convolution_backward for
the gradient pieces. Timed with CUDA events over a loop (GPU) or perf_counter (CPU); it has no T-slope fit
(eager torch has its own dispatch per op, which the loop average includes). Never raises: errors are recorded."""
from __future__ import annotations

import time

from . import cases as _cases


def available():
    try:
        import torch  # noqa: F401
        return True
    except Exception:
        return False


def time_torch(case, dtype, op, sets, iters=20, budget_s=10.0):
    try:
        import torch
        import jax
    except Exception as e:
        return dict(error=f"torch unavailable: {e}")
    op = _cases.canon_op(op)
    if any(lo != hi for lo, hi in case.padding) or case.batch_groups != 1 or any(d != 1 for d in case.lhs_dil):
        return dict(error="skipped: torch conv needs symmetric padding, no batch groups, no lhs dilation")
    try:
        nd = case.nd
        dev = "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"
        _, prec, _ = _cases.dtype_info(dtype)
        if dev == "cuda":
            torch.backends.cudnn.allow_tf32 = prec is None and dtype == "float32"
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32

        def conv_in(a):  # jax array in the case layout -> torch tensor in torch's logical NC* order
            if dev == "cuda":
                return torch.from_dlpack(a)
            import numpy as np
            bf16 = str(a.dtype) == "bfloat16"
            t = torch.from_numpy(np.array(a, dtype=np.float32 if bf16 else None))
            return t.to(torch.bfloat16) if bf16 else t

        def act(a):
            t = conv_in(a)
            return t.movedim(-1, 1) if case.layout == "channels_last" else t

        def wt(a):
            t = conv_in(a)
            return t.permute(nd + 1, nd, *range(nd)) if case.layout == "channels_last" else t

        x, w, dy = act(sets[0][0]), wt(sets[0][1]), act(sets[0][2])
        if case.layout == "channels_last" and nd == 2:
            x, dy = (t.contiguous(memory_format=torch.channels_last) for t in (x, dy))
        conv = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d, 3: torch.nn.functional.conv3d}[nd]
        kw = dict(stride=list(case.stride), padding=[lo for lo, _ in case.padding], dilation=list(case.dilation),
                  groups=case.groups)
        bw = torch.ops.aten.convolution_backward

        def run():
            if op == "fwd":
                return conv(x, w, **kw)
            mask = {"dgrad": [True, False, False], "wgrad": [False, True, False], "fwd+bwd": [True, True, False]}[op]
            r = bw(dy, x, w, None, kw["stride"], kw["padding"], kw["dilation"], False, [0] * nd, case.groups, mask)
            if op == "fwd+bwd":
                return conv(x, w, **kw), r
            return r

        sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
        for _ in range(3):
            run()
        sync()
        t0 = time.perf_counter()
        run()
        sync()
        one = time.perf_counter() - t0
        n = int(max(3, min(iters, budget_s / max(one, 1e-6))))
        if dev == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(n):
                run()
            e.record()
            torch.cuda.synchronize()
            t = s.elapsed_time(e) * 1e-3 / n
        else:
            t0 = time.perf_counter()
            for _ in range(n):
                run()
            t = (time.perf_counter() - t0) / n
        return dict(time_s=t, ci90_s=[None, None], time_source=f"loop mean of {n} ({'cuda events' if dev == 'cuda' else 'wall'})",
                    torch=torch.__version__, device=dev)
    except Exception as e:
        return dict(error=f"{type(e).__name__}: {str(e)[:300]}")
