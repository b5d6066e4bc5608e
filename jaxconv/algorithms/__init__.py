"""The names `algorithm=` and autotuning take, and what runs where: `python -m jaxconv.algorithms` prints the registry.

A request is "auto" (the registry's ordered table and its cost rules), a family name (the first of the family's
variants whose predicate accepts the problem) or a variant name (that variant). The registry itself is C++
(csrc/dispatch/variants.def); jaxconv/registry.py mirrors it.

    python -m jaxconv.algorithms                 the table: name, family, ops, dtypes, file, technique
    python -m jaxconv.algorithms --markdown      the same as docs/algorithms.md's markdown table
    python -m jaxconv.algorithms --families      the README's short table of families
    python -m jaxconv.algorithms --explain 'N:HxW:C->K:RxS[:sS][:pP]' [--dtype bfloat16] [--arch 90]
                                                 which variant auto runs for each op of one convolution, and why
                                                 every other variant does not apply or is passed over
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict

from jaxconv.registry import (AUTO, OPS, Choice, Variant, candidates, default_device, device, explain, families,
                              has_kernels, names, resolve, variant_names, variants)
from jaxconv.tuning.cache import MODES, autotune_mode, cache_path, clear_cache, set_autotune
from jaxconv.tuning.tuner import AutotuneResult, OpResult, Problem, autotune, problems, problems_of

_FAMILY_DESCRIPTIONS = {
    "direct": "CUDA cores, every configuration (auto's general fallback is xla; direct runs when forced)",
    "depthwise": "depthwise convolutions: groups == c == k (channel multiplier 1)",
    "long1d": "long 1-D windows with few channels (c, k <= 8), unit stride and dilations",
    "small": "few channels (c <= 16, k <= 64), channels-last, no groups: first layers, 1-channel images",
    "implicit_gemm": "tensor cores (CUTLASS implicit GEMM): channels-last, no groups",
    "implicit_gemm_sm80": "implicit_gemm's mma.sync (sm_80) kernels only, also on Hopper",
    "xla": "XLA's own convolution (cuDNN on the GPU): auto's floor where no jaxconv kernel runs the problem",
    "integer": "integer and bool operands (forward; lax has no integer gradients), int8 on tensor cores",
}


def _descriptions() -> Dict[str, str]:
  out = {AUTO: "the registry's ordered table and cost rules (csrc/dispatch/variants.def)"}
  out.update({f: _FAMILY_DESCRIPTIONS.get(f, "") for f in families()})
  out.update({v.name: v.summary for v in variants()})
  return out


# name -> one-line description: "auto", the families, then every variant in auto's order.
ALGORITHMS: Dict[str, str] = _descriptions()


def table_markdown() -> str:
  """The registry as a markdown table (the README's "What runs where" table is this, generated)."""
  rows = ["| variant | ops | dtypes | technique | file |", "|---|---|---|---|---|"]
  short = {"float32": "f32", "float64": "f64", "bfloat16": "bf16", "float16": "f16"}
  ints = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool")
  for v in variants():
    dts = [short.get(d, d) for d in v.dtypes]
    if set(ints) <= set(v.dtypes):  # the whole integer set in one word
      dts = [d for d in dts if d not in ints] + ["integers, bool"]
    rows.append(f"| `{v.name}` | {', '.join(v.ops)} | {', '.join(dts)} | {v.summary} | "
                f"`csrc/{v.file}` |")
  return "\n".join(rows) + "\n"


def families_markdown() -> str:
  """The README's short table: each family, what it is for, and its variants (generated from the registry)."""
  rows = ["| family | for | variants |", "|---|---|---|"]
  for f in dict.fromkeys(v.family for v in variants()):  # in the order auto meets them
    members = [v.name.split(".", 1)[1] for v in variants() if v.family == f]
    if members:
      rows.append(f"| `{f}` | {_FAMILY_DESCRIPTIONS.get(f, '')} | {', '.join(members)} |")
  return "\n".join(rows) + "\n"


def _print_table(out) -> None:
  width = max(len(v.name) for v in variants())
  for f in families():
    print(f"{f}: {_FAMILY_DESCRIPTIONS.get(f, '')}", file=out)
  print(file=out)
  for v in variants():
    print(f"{v.name:<{width}}  {'/'.join(v.ops):<17} {','.join(v.dtypes):<35} csrc/{v.file}", file=out)
    print(f"{'':<{width}}  {v.summary}", file=out)
  if not has_kernels():
    print("\n(this build has no CUDA kernels: the table lists names only)", file=out)


def _explain(spec_text: str, dtype: str, arch, out) -> int:
  import jax
  from jaxconv.bench import cases, harness
  case = cases.parse_case_spec(spec_text, [])
  jdt, _, _ = cases.dtype_info(dtype)
  x_shape, w_shape, _ = case.shapes()
  lhs, rhs = jax.ShapeDtypeStruct(x_shape, jdt), jax.ShapeDtypeStruct(w_shape, jdt)
  dev = None if arch is None else default_device(arch)
  for op, prob in problems(lhs, rhs, **harness.conv_kwargs(case, dtype)).items():
    params, dt, odt = prob.params, prob.dtype, prob.out_dtype
    choice = resolve(op, params, dt, odt, dev)
    print(f"{op}: {choice.name or 'none: ' + choice.why}", file=out)
    for name, why, prefer in explain(op, params, dt, odt, dev):
      mark = "*" if name == choice.name else " "
      print(f"  {mark} {name:<34} {why or prefer or 'applies'}", file=out)
  return 0


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m jaxconv.algorithms", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--markdown", action="store_true", help="print the markdown table")
  ap.add_argument("--families", action="store_true", help="print the README's short markdown table of families")
  ap.add_argument("--explain", metavar="CASE", help="one convolution in the benchmark's case grammar")
  ap.add_argument("--dtype", default="float32")
  ap.add_argument("--arch", type=int, help="compute capability as 90 or 80 (default: this process's GPU)")
  args = ap.parse_args(argv)
  if args.markdown:
    sys.stdout.write(table_markdown())
    return 0
  if args.families:
    sys.stdout.write(families_markdown())
    return 0
  if args.explain:
    return _explain(args.explain, args.dtype, args.arch, sys.stdout)
  _print_table(sys.stdout)
  return 0


__all__ = [
    "ALGORITHMS", "AUTO", "AutotuneResult", "Choice", "MODES", "OPS", "OpResult", "Problem", "Variant", "autotune",
    "autotune_mode", "cache_path", "candidates", "clear_cache", "device", "explain", "families", "has_kernels",
    "families_markdown", "main", "names", "problems", "problems_of", "resolve", "set_autotune", "table_markdown",
    "variant_names",
    "variants",
]
