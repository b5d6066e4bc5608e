// Integer and bool forward convolution on the CPU (conv_int.h): exact sums modulo 2^bits of the result type.
//
// Arithmetic: unsigned accumulation (wraparound is defined for unsigned types in C++), in 32 bits when the result has
// at most 32 bits (a sum modulo 2^32 reduces to the same value modulo 2^bits for any narrower result) and in 64 bits
// otherwise and for bool results (whose count of true products must not wrap to zero). Operands are widened to the
// accumulator as XLA widens them to the result type: sign extension for signed types, zero extension for unsigned
// ones; the truncation to the result type is then two's complement, as XLA's.
//
// Plan: x is widened once into a channels-last copy (N, D, H, W, C) and w into (taps, Cg, K), so that the inner loop
// is a multiply-add over contiguous output channels of one group (it vectorises); rows of output positions
// (nb, od, oh) are split among threads, each writing its own outputs.
#include "cpu/conv_int.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <thread>
#include <vector>

#include "cpu/conv_cpu.h"  // NumThreads

namespace jaxconv {
namespace cpu {
namespace {

using ::jaxconv::DType;

// Element i of a buffer of type t, widened to the accumulator type (sign or zero extension, bool as 0/1).
template <class Acc>
Acc Widen(DType t, const void* src, int64_t i) {
  switch (t) {
    case DType::kI8: return static_cast<Acc>(static_cast<int64_t>(static_cast<const int8_t*>(src)[i]));
    case DType::kI16: return static_cast<Acc>(static_cast<int64_t>(static_cast<const int16_t*>(src)[i]));
    case DType::kI32: return static_cast<Acc>(static_cast<int64_t>(static_cast<const int32_t*>(src)[i]));
    case DType::kI64: return static_cast<Acc>(static_cast<const int64_t*>(src)[i]);
    case DType::kU8: return static_cast<Acc>(static_cast<const uint8_t*>(src)[i]);
    case DType::kU16: return static_cast<Acc>(static_cast<const uint16_t*>(src)[i]);
    case DType::kU32: return static_cast<Acc>(static_cast<const uint32_t*>(src)[i]);
    case DType::kU64: return static_cast<Acc>(static_cast<const uint64_t*>(src)[i]);
    default: return static_cast<Acc>(static_cast<const uint8_t*>(src)[i] != 0);  // kPred
  }
}

// Stores acc into element i of a buffer of type t (truncation modulo 2^bits; bool: nonzero).
template <class Acc>
void Store(DType t, void* dst, int64_t i, Acc acc) {
  switch (t) {
    case DType::kI8: case DType::kU8: static_cast<uint8_t*>(dst)[i] = static_cast<uint8_t>(acc); break;
    case DType::kI16: case DType::kU16: static_cast<uint16_t*>(dst)[i] = static_cast<uint16_t>(acc); break;
    case DType::kI32: case DType::kU32: static_cast<uint32_t*>(dst)[i] = static_cast<uint32_t>(acc); break;
    case DType::kI64: case DType::kU64: static_cast<uint64_t*>(dst)[i] = static_cast<uint64_t>(acc); break;
    default: static_cast<uint8_t*>(dst)[i] = acc != 0 ? 1 : 0; break;  // kPred
  }
}

// The geometry the loops need, read once from the params.
struct Geometry {
  int64_t n, c, k, nb, units, cu, ku;  // batch, channels, outputs; per unit: input channels cu, outputs ku
  bool batch_units;                    // units are batch groups (else feature groups, or one unit)
  int64_t in[3], win[3], out[3], stride[3], pad_lo[3], lhs_dil[3], rhs_dil[3];
  int64_t taps, in_sp, out_sp;
  bool channels_last;
};

Geometry GeometryOf(const ConvParams& p) {
  Geometry g;
  g.n = p.n[0];
  g.c = p.c[0];
  g.k = p.k[0];
  g.nb = p.n[0] / p.batch_groups[0];
  g.batch_units = p.batch_groups[0] > 1;
  g.units = g.batch_units ? p.batch_groups[0] : p.groups[0];
  g.cu = p.c[0] / p.groups[0];
  g.ku = p.k[0] / g.units;
  for (int d = 0; d < 3; ++d) {
    g.in[d] = p.in[d];
    g.win[d] = p.win[d];
    g.out[d] = p.out[d];
    g.stride[d] = p.stride[d];
    g.pad_lo[d] = p.pad_lo[d];
    g.lhs_dil[d] = p.lhs_dil[d];
    g.rhs_dil[d] = p.rhs_dil[d];
  }
  g.taps = SpatialCount(p.win);
  g.in_sp = SpatialCount(p.in);
  g.out_sp = SpatialCount(p.out);
  g.channels_last = p.layout[0] == kChannelsLast;
  return g;
}

// Runs fn(begin, end) over [0, total) split among up to NumThreads() threads (inline for small totals).
template <class F>
void ParallelFor(int64_t total, int64_t work_per_item, F fn) {
  const int64_t want = std::max<int64_t>(1, std::min<int64_t>(NumThreads(), total));
  // Below ~64k multiply-adds in all, a thread costs more than it saves.
  const int64_t threads = total * std::max<int64_t>(work_per_item, 1) < (int64_t(1) << 16) ? 1 : want;
  if (threads <= 1) {
    fn(int64_t(0), total);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t chunk = (total + threads - 1) / threads;
  for (int64_t t = 1; t < threads; ++t) {
    const int64_t b = t * chunk, e = std::min(total, b + chunk);
    if (b < e) pool.emplace_back(fn, b, e);
  }
  fn(int64_t(0), std::min(total, chunk));
  for (auto& th : pool) th.join();
}

template <class Acc>
std::string Run(const ConvParams& p, DType in_t, const void* x, const void* w, DType out_t, void* y) {
  const Geometry g = GeometryOf(p);
  std::vector<Acc> xs, ws;
  try {
    xs.resize(static_cast<size_t>(g.n * g.in_sp * g.c));
    ws.resize(static_cast<size_t>(g.taps * g.cu * g.k));
  } catch (const std::exception&) {
    return "out of memory for the widened operands";
  }
  // x -> (N, S, C): channels-last is a copy, channels-first a transpose.
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t s = 0; s < g.in_sp; ++s) {
      for (int64_t ch = 0; ch < g.c; ++ch) {
        const int64_t src = g.channels_last ? (n * g.in_sp + s) * g.c + ch : (n * g.c + ch) * g.in_sp + s;
        xs[static_cast<size_t>((n * g.in_sp + s) * g.c + ch)] = Widen<Acc>(in_t, x, src);
      }
    }
  }
  // w -> (taps, Cg, K): channels-last (taps, Cg, K) is a copy; channels-first (K, Cg, taps) a transpose.
  for (int64_t t = 0; t < g.taps; ++t) {
    for (int64_t cg = 0; cg < g.cu; ++cg) {
      for (int64_t kk = 0; kk < g.k; ++kk) {
        const int64_t src = g.channels_last ? (t * g.cu + cg) * g.k + kk : (kk * g.cu + cg) * g.taps + t;
        ws[static_cast<size_t>((t * g.cu + cg) * g.k + kk)] = Widen<Acc>(in_t, w, src);
      }
    }
  }

  // One row: the output positions (nb, od, oh, 0..OW) of all K channels.
  const int64_t rows = g.nb * g.out[0] * g.out[1];
  auto body = [&](int64_t r0, int64_t r1) {
    std::vector<Acc> acc(static_cast<size_t>(g.k));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t oh = r % g.out[1], od = (r / g.out[1]) % g.out[0], nb = r / (g.out[1] * g.out[0]);
      for (int64_t ow = 0; ow < g.out[2]; ++ow) {
        std::fill(acc.begin(), acc.end(), Acc(0));
        const int64_t o[3] = {od, oh, ow};
        for (int64_t t = 0; t < g.taps; ++t) {
          const int64_t f[3] = {t / (g.win[1] * g.win[2]), (t / g.win[2]) % g.win[1], t % g.win[2]};
          int64_t i[3];
          bool ok = true;
          for (int d = 0; d < 3 && ok; ++d) {
            // In range: DecodeParams bounds every term, and o*stride + f*rhs_dil stays below the padded input.
            const int64_t q = o[d] * g.stride[d] - g.pad_lo[d] + f[d] * g.rhs_dil[d];
            ok = q >= 0 && q % g.lhs_dil[d] == 0 && (i[d] = q / g.lhs_dil[d]) < g.in[d];
          }
          if (!ok) continue;
          const int64_t sp = (i[0] * g.in[1] + i[1]) * g.in[2] + i[2];
          for (int64_t u = 0; u < g.units; ++u) {
            const int64_t batch = g.batch_units ? u * g.nb + nb : nb;
            const Acc* xrow = xs.data() + (batch * g.in_sp + sp) * g.c + (g.batch_units ? 0 : u * g.cu);
            Acc* a = acc.data() + u * g.ku;
            const Acc* wt = ws.data() + t * g.cu * g.k + u * g.ku;
            for (int64_t cg = 0; cg < g.cu; ++cg) {
              const Acc xv = xrow[cg];
              if (xv == 0) continue;
              const Acc* wrow = wt + cg * g.k;
              for (int64_t kk = 0; kk < g.ku; ++kk) a[kk] += xv * wrow[kk];
            }
          }
        }
        const int64_t pos = (od * g.out[1] + oh) * g.out[2] + ow;
        for (int64_t kk = 0; kk < g.k; ++kk) {
          const int64_t dst = g.channels_last ? (nb * g.out_sp + pos) * g.k + kk : (nb * g.k + kk) * g.out_sp + pos;
          Store<Acc>(out_t, y, dst, acc[static_cast<size_t>(kk)]);
        }
      }
    }
  };
  ParallelFor(rows, g.out[2] * g.taps * g.cu * g.ku, body);
  return {};
}

}  // namespace

std::string ConvIntFwd(const ConvParams& p, ::jaxconv::DType in_t, const void* x, const void* w,
                       ::jaxconv::DType out_t, void* y) {
  if (!IsInteger(in_t) || !IsInteger(out_t)) return "ConvIntFwd: integer or bool operands and result expected";
  // Narrow results wrap modulo 2^32 without loss; 64-bit results and bool counts need 64 bits.
  if (DTypeBytes(out_t) <= 4 && out_t != ::jaxconv::DType::kPred) return Run<uint32_t>(p, in_t, x, w, out_t, y);
  return Run<uint64_t>(p, in_t, x, w, out_t, y);
}

}  // namespace cpu
}  // namespace jaxconv
