"""Benchmark cases: the suite file format, the compact --case form, and the cost model (FLOPs, bytes).

Suite file (JSON): {"version": 1, "note": ..., "cases": [case, ...]}, each case:
  name, source (free text), batch, spatial [sizes], in_channels, out_channels, filter [sizes],
  stride [per dim], padding [[lo, hi] per dim] (or "SAME"/"VALID"), dilation [per dim] (rhs / window dilation),
  groups, layout ("channels_last" | "channels_first"), dtypes [...], ops [...].
Optional fields (not used by the shipped suite, accepted for generality): lhs_dilation [per dim],
  batch_groups (int).
dtypes: "bfloat16", "float16", "float32" (lax DEFAULT precision: TF32 on GPU), "float32-high"
  (Precision.HIGH), "float32-highest" (Precision.HIGHEST, true FP32), "float64" (enables jax x64).
ops: "fwd", "dgrad", "wgrad", "fwd+bwd" (alias "fwdbwd").
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Any, Sequence

OPS = ("fwd", "dgrad", "wgrad", "fwd+bwd")
_OP_ALIASES = {"fwd": "fwd", "forward": "fwd", "dgrad": "dgrad", "wgrad": "wgrad",
               "fwd+bwd": "fwd+bwd", "fwdbwd": "fwd+bwd", "fwd_bwd": "fwd+bwd", "all": "fwd+bwd"}
DTYPES = ("bfloat16", "float16", "float32", "float32-high", "float32-highest", "float64")
_DTYPE_ALIASES = {"bf16": "bfloat16", "f16": "float16", "fp16": "float16", "half": "float16",
                  "f32": "float32", "fp32": "float32", "tf32": "float32", "f32-high": "float32-high",
                  "f32-highest": "float32-highest", "fp32-highest": "float32-highest", "highest": "float32-highest",
                  "f64": "float64", "double": "float64"}
DEFAULT_DTYPES = ("bfloat16", "float32", "float32-highest")

# Kernels a minimal implementation launches per op (used for the launch-overhead term of the floor).
KERNELS_PER_OP = {"fwd": 1, "dgrad": 1, "wgrad": 1, "fwd+bwd": 3}


def canon_op(op: str) -> str:
    k = op.strip().lower()
    if k not in _OP_ALIASES:
        raise ValueError(f"unknown op {op!r}; expected one of {', '.join(OPS)} (or fwdbwd)")
    return _OP_ALIASES[k]


def canon_dtype(dt: str) -> str:
    k = dt.strip().lower()
    k = _DTYPE_ALIASES.get(k, k)
    if k not in DTYPES:
        raise ValueError(f"unknown dtype {dt!r}; expected one of {', '.join(DTYPES)}")
    return k


def dtype_info(dt: str):
    """(numpy-ish dtype name, lax precision name or None, bytes per element)."""
    dt = canon_dtype(dt)
    return {
        "bfloat16": ("bfloat16", None, 2),
        "float16": ("float16", None, 2),
        "float32": ("float32", None, 4),
        "float32-high": ("float32", "HIGH", 4),
        "float32-highest": ("float32", "HIGHEST", 4),
        "float64": ("float64", "HIGHEST", 8),
    }[dt]


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    batch: int
    spatial: tuple
    in_channels: int
    out_channels: int
    filter: tuple
    stride: tuple
    padding: tuple            # ((lo, hi), ...)
    dilation: tuple           # rhs (window) dilation
    groups: int = 1
    layout: str = "channels_last"
    dtypes: tuple = DEFAULT_DTYPES
    ops: tuple = OPS
    lhs_dilation: tuple = None
    batch_groups: int = 1
    source: str = ""

    # ---- derived geometry ----
    @property
    def nd(self) -> int:
        return len(self.spatial)

    @property
    def lhs_dil(self) -> tuple:
        return self.lhs_dilation or (1,) * self.nd

    @property
    def out_spatial(self) -> tuple:
        out = []
        for i, f, s, (lo, hi), d, ld in zip(self.spatial, self.filter, self.stride, self.padding,
                                             self.dilation, self.lhs_dil):
            in_d = 0 if i == 0 else (i - 1) * ld + 1
            win_d = 0 if f == 0 else (f - 1) * d + 1
            span = in_d + lo + hi - win_d
            out.append(0 if span < 0 else span // s + 1)
        return tuple(out)

    def dimension_numbers(self):
        sp = "DHW"[3 - self.nd:]
        if self.layout == "channels_last":
            return ("N" + sp + "C", sp + "IO", "N" + sp + "C")
        return ("NC" + sp, "OI" + sp, "NC" + sp)

    def shapes(self):
        """(x shape, w shape, y shape) in the case's layout."""
        n, c, k, g, b = self.batch, self.in_channels, self.out_channels, self.groups, self.batch_groups
        sp, f, o = tuple(self.spatial), tuple(self.filter), self.out_spatial
        if self.layout == "channels_last":
            return (n, *sp, c), (*f, c // g, k), (n // b, *o, k)
        return (n, c, *sp), (k, c // g, *f), (n // b, k, *o)

    def macs(self) -> int:
        """Multiply-accumulates of the dense conv (window taps over padding included, the usual convention);
        feature groups, batch groups, strides and dilations all accounted for. dgrad and wgrad have the same count."""
        return ((self.batch // self.batch_groups) * self.out_channels * math.prod(self.out_spatial)
                * (self.in_channels // self.groups) * math.prod(self.filter))

    def flops(self, op: str) -> int:
        return 2 * self.macs() * (3 if canon_op(op) == "fwd+bwd" else 1)

    def min_bytes(self, op: str, itemsize: int) -> int:
        """Compulsory traffic: every operand read once, every result written once."""
        xs, ws, ys = (math.prod(s) for s in self.shapes())
        op = canon_op(op)
        elems = {"fwd": xs + ws + ys, "dgrad": ys + ws + xs, "wgrad": xs + ys + ws,
                 "fwd+bwd": 2 * (xs + ws + ys)}[op]
        return elems * itemsize

    def validate(self):
        nd = self.nd
        if nd not in (1, 2, 3):
            raise ValueError(f"case {self.name}: spatial must have 1-3 dims, got {self.spatial}")
        for fld in ("filter", "stride", "padding", "dilation"):
            if len(getattr(self, fld)) != nd:
                raise ValueError(f"case {self.name}: {fld} has {len(getattr(self, fld))} entries, expected {nd}")
        if self.lhs_dilation is not None and len(self.lhs_dilation) != nd:
            raise ValueError(f"case {self.name}: lhs_dilation must have {nd} entries")
        if self.layout not in ("channels_last", "channels_first"):
            raise ValueError(f"case {self.name}: layout must be channels_last or channels_first")
        if self.in_channels % self.groups or self.out_channels % self.groups:
            raise ValueError(f"case {self.name}: channels not divisible by groups={self.groups}")
        if self.batch_groups > 1 and (self.out_channels % self.batch_groups or self.batch % self.batch_groups):
            raise ValueError(f"case {self.name}: batch/out_channels not divisible by batch_groups")
        if self.groups > 1 and self.batch_groups > 1:
            raise ValueError(f"case {self.name}: groups and batch_groups cannot both exceed 1")
        if min(self.out_spatial) <= 0:
            raise ValueError(f"case {self.name}: empty output {self.out_spatial}")
        for dt in self.dtypes:
            canon_dtype(dt)
        for op in self.ops:
            canon_op(op)
        return self

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["padding"] = [list(p) for p in self.padding]
        for k in ("spatial", "filter", "stride", "dilation", "dtypes", "ops"):
            d[k] = list(d[k])
        if self.lhs_dilation is None:
            d.pop("lhs_dilation")
        else:
            d["lhs_dilation"] = list(self.lhs_dilation)
        if self.batch_groups == 1:
            d.pop("batch_groups")
        d["out_spatial"] = list(self.out_spatial)
        return d

    def short(self) -> str:
        """The compact --case form of this case (round-trips through parse_case_spec)."""
        x = lambda t: "x".join(str(v) for v in t)
        parts = [str(self.batch), x(self.spatial), f"{self.in_channels}->{self.out_channels}", x(self.filter)]
        if any(s != 1 for s in self.stride):
            parts.append("s" + x(self.stride))
        if any(p != (0, 0) for p in self.padding):
            parts.append("p" + x(f"{lo}-{hi}" if lo != hi else str(lo) for lo, hi in self.padding))
        if any(d != 1 for d in self.dilation):
            parts.append("d" + x(self.dilation))
        if self.lhs_dilation and any(d != 1 for d in self.lhs_dilation):
            parts.append("ld" + x(self.lhs_dilation))
        if self.groups != 1:
            parts.append(f"g{self.groups}")
        if self.batch_groups != 1:
            parts.append(f"bg{self.batch_groups}")
        if self.layout == "channels_first":
            parts.append("cf")
        return ":".join(parts)


def _dims(v, nd, what, name):
    if isinstance(v, int):
        return (int(v),) * nd
    v = tuple(int(a) for a in v)
    if len(v) == 1 and nd > 1:
        v = v * nd
    if len(v) != nd:
        raise ValueError(f"case {name}: {what} has {len(v)} entries, expected {nd}")
    return v


def _padding(p, spatial, filt, stride, dil, name):
    nd = len(spatial)
    if isinstance(p, str):
        mode = p.upper()
        if mode == "VALID":
            return ((0, 0),) * nd
        if mode in ("SAME", "SAME_LOWER"):
            pads = []
            for i, f, s, d in zip(spatial, filt, stride, dil):
                out = -(-i // s)
                total = max((out - 1) * s + (f - 1) * d + 1 - i, 0)
                lo = total // 2 if mode == "SAME" else total - total // 2
                pads.append((lo, total - lo))
            return tuple(pads)
        raise ValueError(f"case {name}: unknown padding {p!r}")
    if isinstance(p, int):
        return ((p, p),) * nd
    p = list(p)
    if all(isinstance(a, int) for a in p):
        if len(p) == 1:
            p = p * nd
        if len(p) != nd:
            raise ValueError(f"case {name}: padding has {len(p)} entries, expected {nd}")
        return tuple((a, a) for a in p)
    if len(p) == 1 and nd > 1:
        p = p * nd
    if len(p) != nd:
        raise ValueError(f"case {name}: padding has {len(p)} entries, expected {nd}")
    return tuple((int(lo), int(hi)) for lo, hi in p)


def case_from_dict(d: dict) -> Case:
    known = {"name", "source", "batch", "spatial", "in_channels", "out_channels", "filter", "stride", "padding",
             "dilation", "groups", "layout", "dtypes", "ops", "lhs_dilation", "batch_groups", "out_spatial", "note"}
    name = str(d.get("name", "case"))
    unknown = set(d) - known
    if unknown:
        raise ValueError(f"case {name}: unknown field(s) {sorted(unknown)}")
    spatial = tuple(int(v) for v in d["spatial"])
    nd = len(spatial)
    filt = _dims(d["filter"], nd, "filter", name)
    stride = _dims(d.get("stride", 1), nd, "stride", name)
    dil = _dims(d.get("dilation", 1), nd, "dilation", name)
    lhs_dil = d.get("lhs_dilation")
    lhs_dil = None if lhs_dil is None else _dims(lhs_dil, nd, "lhs_dilation", name)
    layout = {"nhwc": "channels_last", "nchw": "channels_first", "cl": "channels_last",
              "cf": "channels_first"}.get(str(d.get("layout", "channels_last")).lower(),
                                          str(d.get("layout", "channels_last")).lower())
    return Case(
        name=name, source=str(d.get("source", "")), batch=int(d["batch"]), spatial=spatial,
        in_channels=int(d["in_channels"]), out_channels=int(d["out_channels"]), filter=filt, stride=stride,
        padding=_padding(d.get("padding", "VALID"), spatial, filt, stride, dil, name), dilation=dil,
        groups=int(d.get("groups", 1)), layout=layout,
        dtypes=tuple(canon_dtype(x) for x in d.get("dtypes", DEFAULT_DTYPES)),
        ops=tuple(canon_op(x) for x in d.get("ops", OPS)),
        lhs_dilation=lhs_dil, batch_groups=int(d.get("batch_groups", 1)),
    ).validate()


def load_suite(path: str) -> list:
    with open(path) as f:
        data = json.load(f)
    cases = data["cases"] if isinstance(data, dict) else data
    out = [case_from_dict(c) for c in cases]
    names = [c.name for c in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"{path}: duplicate case names {sorted(dup)}")
    return out


CASE_SPEC_HELP = """\
--case SPEC (repeatable). SPEC is one of
  * the name of a case in the suite file (exact match), e.g. --case resnet50_res4_3x3_b32
  * a JSON object with the suite's case fields, e.g. --case '{"batch":8,"spatial":[32,32],...}'
  * the compact form  N:SPATIAL:CIN->COUT:FILTER[:option...]   (sizes joined by 'x')
      N        batch                     SPATIAL  e.g. 224x224 (1-3 dims)
      CIN->COUT channels (also CINxCOUT)  FILTER   e.g. 3x3 (a single value is used for every dim)
    options (any order; a single value applies to every spatial dim):
      s2 | s2x1        window strides                     d2 | d2x4      rhs (window) dilation
      p1 | p1x2        symmetric padding per dim          p3-0 | p1-0x2-2  (lo-hi) padding per dim
      pSAME | pVALID   padding mode (default: VALID)      ld2            lhs (input) dilation
      g32              feature groups (gdw = depthwise)   bg2            batch groups
      cf | cl          channels_first / channels_last (default cl)
      name=NAME        case name (default: the spec itself)
    dtypes and ops come from --dtypes / --ops (default: all ops; bfloat16,float32,float32-highest).
  examples:  32:224x224:3->64:7x7:s2:p3          (ResNet-50 conv1)
             8:4096:2048->2048:4:p3-0:gdw        (causal depthwise conv1d, k=4)
             1:1024x1024:1->1:3x3:d2:p2          (dilated 3x3)
"""


def parse_case_spec(spec: str, suite_cases: Sequence[Case] = ()) -> Case:
    spec = spec.strip()
    for c in suite_cases:
        if c.name == spec:
            return c
    if spec.startswith("{"):
        d = json.loads(spec)
        d.setdefault("name", "cli_case")
        return case_from_dict(d)
    parts = [p for p in spec.split(":") if p]
    if len(parts) < 4:
        raise ValueError(f"--case {spec!r}: not a suite case name and not N:SPATIAL:CIN->COUT:FILTER[:opts] "
                         "(see --help)")
    try:
        batch = int(parts[0])
        spatial = tuple(int(v) for v in parts[1].split("x"))
        m = re.fullmatch(r"(\d+)(?:->|x|,)(\d+)", parts[2])
        if not m:
            raise ValueError(f"channels {parts[2]!r} (expected CIN->COUT)")
        cin, cout = int(m.group(1)), int(m.group(2))
        nd = len(spatial)
        filt = tuple(int(v) for v in parts[3].split("x"))
        d: dict[str, Any] = dict(name=spec, batch=batch, spatial=list(spatial), in_channels=cin,
                                 out_channels=cout, filter=list(filt if len(filt) == nd else filt * nd))
        for opt in parts[4:]:
            o = opt.strip()
            lo = o.lower()
            if lo.startswith("name="):
                d["name"] = o[5:]
            elif lo in ("cf", "cl", "nchw", "nhwc", "channels_first", "channels_last"):
                d["layout"] = {"cf": "channels_first", "nchw": "channels_first"}.get(lo, "channels_last"
                                                                                     if lo in ("cl", "nhwc") else lo)
            elif lo in ("psame", "pvalid", "psame_lower"):
                d["padding"] = o[1:].upper()
            elif lo == "gdw":
                d["groups"] = cin
            elif lo.startswith("bg"):
                d["batch_groups"] = int(o[2:])
            elif lo.startswith("ld"):
                d["lhs_dilation"] = [int(v) for v in o[2:].split("x")]
            elif lo.startswith("g"):
                d["groups"] = int(o[1:])
            elif lo.startswith("s"):
                d["stride"] = [int(v) for v in o[1:].split("x")]
            elif lo.startswith("d"):
                d["dilation"] = [int(v) for v in o[1:].split("x")]
            elif lo.startswith("p"):
                pads = []
                for item in o[1:].split("x"):
                    if "-" in item.lstrip("-"):
                        a, b = re.fullmatch(r"(-?\d+)-(-?\d+)", item).groups()
                        pads.append([int(a), int(b)])
                    else:
                        pads.append([int(item), int(item)])
                d["padding"] = pads
            else:
                raise ValueError(f"unknown option {o!r}")
    except (ValueError, AttributeError, TypeError) as e:
        raise ValueError(f"--case {spec!r}: {e} (see --help for the compact form)") from None
    return case_from_dict(d)


# Tiny cases for --quick: run in well under a second each on a 2-core CPU, and together touch strides,
# padding (incl. asymmetric), dilation, feature groups (depthwise and grouped), 1-D and 3-D.
QUICK_CASES = [
    dict(name="quick_3x3_s1", batch=2, spatial=[24, 24], in_channels=16, out_channels=16, filter=[3, 3],
         stride=[1, 1], padding=[[1, 1], [1, 1]], dilation=[1, 1], groups=1),
    dict(name="quick_5x5_s2_g2", batch=2, spatial=[17, 15], in_channels=8, out_channels=8, filter=[5, 3],
         stride=[2, 2], padding=[[2, 2], [1, 0]], dilation=[1, 1], groups=2),
    dict(name="quick_dw1d_causal_d2", batch=2, spatial=[64], in_channels=16, out_channels=16, filter=[4],
         stride=[1], padding=[[6, 0]], dilation=[2], groups=16),
    dict(name="quick_3d_3x3x3", batch=1, spatial=[4, 8, 8], in_channels=4, out_channels=4, filter=[3, 3, 3],
         stride=[1, 1, 1], padding=[[1, 1], [1, 1], [1, 1]], dilation=[1, 1, 1], groups=1),
]


def quick_cases(dtypes=("float32", "bfloat16"), ops=OPS) -> list:
    out = []
    for i, d in enumerate(QUICK_CASES):
        d = dict(d)
        # every dtype on the first case, float32 only on the rest: keeps --quick well under its time limit
        d["dtypes"] = list(dtypes) if i == 0 else [dtypes[0]]
        d["ops"] = list(ops)
        out.append(case_from_dict(d))
    return out


def default_suite_path():
    """benchmarks/suite.json of the source tree (or of the current directory)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (os.path.join(os.getcwd(), "benchmarks", "suite.json"),
              os.path.join(here, "..", "..", "benchmarks", "suite.json")):
        if os.path.isfile(p):
            return os.path.normpath(p)
    return None
