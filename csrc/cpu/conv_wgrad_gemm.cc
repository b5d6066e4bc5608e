// wgrad as a GEMM over the output positions: per segment and tap f,
//   dw[f, cg, kk] = sum over output positions o (and batches) of x[i(o, f), cg] * dy[o, kk],
// a product whose reduction runs over positions. Rows of the tile are kMR consecutive input channels (read in
// place from channels-last x), columns kNR output channels of dy, packed per chunk of positions. Along the
// last spatial dim the positions valid for a tap form one arithmetic progression in both o and i, so the
// micro-kernel walks runs (x pointer and step, dy row and step, count) instead of a list per position, and
// positions outside the input (padding, lhs dilation) are never visited.
//
// Work items are (reduction part, segment, column panel, block of row tiles); each keeps its tiles of all
// taps in scratch while it walks its positions in chunks (so that a chunk's x and dy stay in cache), and
// writes them once at the end. Every element sums its positions in one fixed order; when the output has too
// few tiles to share out, the positions are cut into a number of parts that depends on the shape only, and
// the parts' sums are added in order.
#include <algorithm>
#include <vector>

#include "cpu/conv_cpu.h"
#include "cpu/conv_gemm.h"
#include "cpu/convert.h"
#include "cpu/microkernel.h"
#include "cpu/thread_pool.h"

namespace jaxconv {
namespace cpu {
namespace {

constexpr int64_t kTargetItems = 16;           // work items wanted per call, for load balance
constexpr int64_t kMaxParts = 16;              // most reduction parts
constexpr int64_t kMinPartPositions = 1024;    // fewest positions per reduction part
constexpr int64_t kItemAccBytes = 512 * 1024;  // most scratch for one item's tiles
constexpr int64_t kChunkXBytes = 128 * 1024;   // x data of one chunk of positions

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }  // a >= 0, b > 0
inline int64_t PosMod(int64_t a, int64_t m) {
  const int64_t r = a % m;
  return r < 0 ? r + m : r;
}

// For one tap of one spatial dim, the output positions o = o0 + e*ostep (e < count) that read an input
// position, i = i0 + e*istep.
struct TapRun {
  int64_t o0 = 0, ostep = 1, i0 = 0, istep = 0, count = 0;
};

// One spatial dim: input position i = (o*stride - pad_lo + f*rhs_dil) / lhs_dil when exact and in range.
struct DimTab {
  int64_t Q = 1;
  std::vector<int64_t> src;  // [f * Q + o]: the input position, or -1
  std::vector<TapRun> runs;  // per tap

  void Init(int64_t in, int64_t out, int64_t win, int64_t st, int64_t lo, int64_t ld, int64_t rd) {
    Q = out;
    src.assign(static_cast<size_t>(win * out), -1);
    runs.assign(static_cast<size_t>(win), TapRun{});
    for (int64_t f = 0; f < win; ++f) {
      TapRun& run = runs[f];
      for (int64_t o = 0; o < out; ++o) {
        const int64_t v = o * st - lo + f * rd;
        if (PosMod(v, ld) != 0 || v < 0 || v / ld >= in) continue;
        const int64_t i = v / ld;
        src[f * out + o] = i;
        // The valid o form an arithmetic progression (a residue class cut to an interval), i linear in o.
        if (run.count == 0) {
          run.o0 = o;
          run.i0 = i;
        } else if (run.count == 1) {
          run.ostep = o - run.o0;
          run.istep = i - run.i0;
        }
        ++run.count;
      }
    }
  }
};

}  // namespace

// As for fwd and dgrad (conv_igemm.cc): everything but depthwise convolutions.
bool WgradGemmApplies(const ConvParams& p) {
  const int64_t S = p.groups[0] * p.batch_groups[0];
  return !(p.groups[0] > 1 && p.c[0] / p.groups[0] == 1 && p.k[0] / S == 1);
}

template <class Acc>
bool WgradGemm(const ConvParams& p, const Acc* x, const Acc* dy, Acc* dw) {
  constexpr int NR = kNR<Acc>;
  constexpr int64_t kTile = kMR * NR;
  const int64_t G = p.groups[0], BG = p.batch_groups[0], S = G * BG;
  const int64_t C = p.c[0], K = p.k[0], Cg = C / G, Ks = K / S, Nb = p.n[0] / BG;
  const int64_t ID = p.in[0], IH = p.in[1], IW = p.in[2];
  const int64_t OD = p.out[0], OH = p.out[1], OW = p.out[2];
  const int64_t W0 = p.win[0], W1 = p.win[1], W2 = p.win[2], F = W0 * W1 * W2;
  const int64_t nw = F * Cg * K;
  if (nw == 0) return true;
  DimTab dim[3];
  for (int d = 0; d < 3; ++d) {
    dim[d].Init(p.in[d], p.out[d], p.win[d], p.stride[d], p.pad_lo[d], p.lhs_dil[d], p.rhs_dil[d]);
  }
  const int64_t rows_total = Nb * OD * OH;  // rows of OW positions

  // Shape of the work (a function of the problem alone: see the top of the file).
  const int64_t panels = CeilDiv(Ks, NR), ctiles = CeilDiv(Cg, kMR), units = S * panels;
  int64_t tpb = ctiles;
  if (units < kTargetItems) tpb = CeilDiv(ctiles, std::min(ctiles, CeilDiv(kTargetItems, units)));
  tpb = std::clamp<int64_t>(kItemAccBytes / (F * kTile * static_cast<int64_t>(sizeof(Acc))), 1, tpb);
  const int64_t blocks = CeilDiv(ctiles, tpb);
  int64_t parts = 1;
  if (units * blocks < kTargetItems) {
    const int64_t most = std::clamp<int64_t>(rows_total * OW / kMinPartPositions, 1, kMaxParts);
    parts = std::clamp<int64_t>(CeilDiv(kTargetItems, units * blocks), 1, std::min(most, std::max<int64_t>(rows_total, 1)));
  }
  const int64_t chunk_positions = std::clamp<int64_t>(kChunkXBytes / (Cg * static_cast<int64_t>(sizeof(Acc))), 64, 2048);
  const int64_t rows_per_chunk = std::max<int64_t>(1, chunk_positions / std::max<int64_t>(OW, 1));

  ScratchVec<Acc> part_buf;
  if (parts > 1) part_buf.resize(static_cast<size_t>(parts * nw));
  const double macs = static_cast<double>(rows_total) * OW * F * Cg * K;
  const int threads = static_cast<int>(std::clamp<double>(macs / kGemmMinWorkPerThread, 1, PoolThreads()));
  struct Scratch {
    std::vector<Acc> acc, packed;
    std::vector<RunSpec<Acc>> runs;
    std::vector<int64_t> rowx, rowo0, rowo1;  // per row of the chunk: x batch, o0, o1
  };
  std::vector<Scratch> scratch(static_cast<size_t>(threads));
  const RunTileFn<Acc> kernel = GetMicroKernels<Acc>().runs;
  const int64_t nitems = parts * S * panels * blocks;

  const bool ok = PoolFor(nitems, threads, [&](int64_t it, int thread) {
    const int64_t blk = it % blocks, jp = (it / blocks) % panels, s = (it / (blocks * panels)) % S;
    const int64_t part = it / (blocks * panels * S);
    Scratch& sc = scratch[thread];
    sc.acc.assign(static_cast<size_t>(F * tpb * kTile), Acc(0));
    sc.packed.resize(static_cast<size_t>(rows_per_chunk * OW * NR));
    sc.runs.resize(static_cast<size_t>(rows_per_chunk));
    sc.rowx.resize(static_cast<size_t>(rows_per_chunk));
    sc.rowo0.resize(static_cast<size_t>(rows_per_chunk));
    sc.rowo1.resize(static_cast<size_t>(rows_per_chunk));
    const int64_t ct0 = blk * tpb, ct1 = std::min(ctiles, ct0 + tpb);
    const int64_t n0 = jp * NR, nv = std::min<int64_t>(NR, Ks - n0), dyoff = s * Ks + n0;
    const Acc* xs = x + (G > 1 ? s * Cg : 0);
    const int64_t row_begin = rows_total * part / parts, row_end = rows_total * (part + 1) / parts;
    for (int64_t rc = row_begin; rc < row_end; rc += rows_per_chunk) {
      const int64_t nrows = std::min(rows_per_chunk, row_end - rc);
      for (int64_t rl = 0; rl < nrows; ++rl) {
        const int64_t row = rc + rl;
        const int64_t nb = row / (OD * OH);
        sc.rowx[rl] = BG > 1 ? s * Nb + nb : nb;
        sc.rowo0[rl] = (row / OH) % OD;
        sc.rowo1[rl] = row % OH;
        const Acc* d = dy + row * OW * K + dyoff;
        Acc* b = sc.packed.data() + rl * OW * NR;
        for (int64_t o2 = 0; o2 < OW; ++o2, d += K, b += NR) {
          for (int64_t j = 0; j < NR; ++j) b[j] = j < nv ? d[j] : Acc(0);
        }
      }
      for (int64_t f = 0; f < F; ++f) {
        const int64_t f0 = f / (W1 * W2), f1 = (f / W2) % W1, f2 = f % W2;
        const TapRun& t2 = dim[2].runs[f2];
        if (t2.count == 0) continue;
        int64_t nr = 0;
        for (int64_t rl = 0; rl < nrows; ++rl) {
          const int64_t i0 = dim[0].src[f0 * OD + sc.rowo0[rl]], i1 = dim[1].src[f1 * OH + sc.rowo1[rl]];
          if (i0 < 0 || i1 < 0) continue;
          sc.runs[nr++] = {xs + (((sc.rowx[rl] * ID + i0) * IH + i1) * IW + t2.i0) * C, t2.istep * C,
                           (rl * OW + t2.o0) * NR, t2.ostep * NR, t2.count};
        }
        if (nr == 0) continue;
        for (int64_t ct = ct0; ct < ct1; ++ct) {
          const int64_t cg0 = ct * kMR;
          kernel(static_cast<int>(std::min<int64_t>(kMR, Cg - cg0)), nr, sc.runs.data(), cg0, sc.packed.data(),
                 sc.acc.data() + (f * tpb + (ct - ct0)) * kTile);
        }
      }
    }
    Acc* out = parts > 1 ? part_buf.data() + part * nw : dw;
    for (int64_t f = 0; f < F; ++f) {
      for (int64_t ct = ct0; ct < ct1; ++ct) {
        const int64_t cg0 = ct * kMR, rows = std::min<int64_t>(kMR, Cg - cg0);
        const Acc* tile = sc.acc.data() + (f * tpb + (ct - ct0)) * kTile;
        for (int64_t r = 0; r < rows; ++r) {
          std::copy(tile + r * NR, tile + r * NR + nv, out + (f * Cg + cg0 + r) * K + dyoff);
        }
      }
    }
  });
  if (!ok) return false;
  if (parts == 1) return true;
  // The parts' sums, added in order.
  constexpr int64_t kBlock = 4096;
  return PoolFor(CeilDiv(nw, kBlock), threads, [&](int64_t b, int) {
    const int64_t e0 = b * kBlock, e1 = std::min(nw, e0 + kBlock);
    for (int64_t e = e0; e < e1; ++e) {
      Acc v = part_buf[e];
      for (int64_t q = 1; q < parts; ++q) v += part_buf[q * nw + e];
      dw[e] = v;
    }
  });
}

template bool WgradGemm<float>(const ConvParams&, const float*, const float*, float*);
template bool WgradGemm<double>(const ConvParams&, const double*, const double*, double*);

}  // namespace cpu
}  // namespace jaxconv
