// fwd and dgrad as indirect GEMMs (the "indirect convolution" formulation): each output row (an output
// position for fwd, an input position for dgrad) is the product of its window, given as one pointer per
// (row, tap) into the channels-last source (or to zeros where the window leaves the tensor), with the
// filter, packed once per call into panels of kNR columns. The micro-kernel reads the source rows in place,
// so there is no im2col buffer, and sums the whole reduction (taps x channels) of a tile in registers.
//
// Per spatial dim both ops read source position s = (q*a + b + f*c) / m for destination position q and tap f,
// used when the division is exact and s is in range:
//   fwd:   q = o, s = i: a = stride,  b = -pad_lo, c = rhs_dil,  m = lhs_dil
//   dgrad: q = i, s = o: a = lhs_dil, b = pad_lo,  c = -rhs_dil, m = stride
// Whether the division is exact depends only on q mod P (P = m / gcd(a, m)), so the destination rows are
// split into residue classes, each a GEMM over only its own taps: a strided dgrad (or an lhs-dilated fwd)
// does no multiply-adds by zeros beyond those of the padding.
#include <algorithm>
#include <numeric>
#include <vector>

#include "cpu/activation.h"
#include "cpu/conv_cpu.h"
#include "cpu/conv_gemm.h"
#include "cpu/convert.h"
#include "cpu/microkernel.h"
#include "cpu/thread_pool.h"

namespace jaxconv {
namespace cpu {
namespace {

// Bytes of packed filter one block of column panels may take: the block stays in L2 while the tiles of a
// chunk of rows stream through it.
constexpr int64_t kPackedBlockBytes = 256 * 1024;
constexpr int64_t kMaxChunkTiles = 16;  // row tiles per work item
constexpr int64_t kTargetItems = 16;    // work items wanted per call, for load balance

inline int64_t PosMod(int64_t a, int64_t m) {
  const int64_t r = a % m;
  return r < 0 ? r + m : r;
}
inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }  // a >= 0, b > 0

// One spatial dim of the map between destination and source positions (see the top of the file).
struct DimMap {
  int64_t Q = 1, L = 1, W = 1, P = 1;
  std::vector<std::vector<int64_t>> taps;  // per residue class r < min(P, Q): the taps with exact division
  std::vector<int64_t> src;                // [q * W + f]: the source position, or -1

  void Init(int64_t q_n, int64_t l_n, int64_t w_n, int64_t a, int64_t b, int64_t c, int64_t m) {
    Q = q_n;
    L = l_n;
    W = w_n;
    P = m / std::gcd(a, m);
    const int64_t classes = std::min(P, Q);
    taps.assign(static_cast<size_t>(classes), {});
    for (int64_t r = 0; r < classes; ++r) {
      for (int64_t f = 0; f < W; ++f) {
        if (PosMod(r * a + b + f * c, m) == 0) taps[r].push_back(f);
      }
    }
    src.assign(static_cast<size_t>(Q * W), -1);
    for (int64_t q = 0; q < Q; ++q) {
      for (int64_t f = 0; f < W; ++f) {
        const int64_t v = q * a + b + f * c;
        if (PosMod(v, m) != 0) continue;
        const int64_t s = v / m;  // exact
        if (s >= 0 && s < L) src[q * W + f] = s;
      }
    }
  }
};

// Writes rows r < nrows, columns j < nv of a block of results (row r at src + r*ld) to
// dst[row[r] + (col0 + j)*cs], converting to the output type, through the fwd epilogue act(acc + bias[j]) when
// kEpi. Template arguments, so that the loops vectorize. Channels-last destinations (cs == 1) take one tile at
// a time; channels-first ones a chunk of rows at a time, so that each channel's stores are runs of positions.
template <class Acc>
using StoreFn = void (*)(const Acc* src, int64_t ld, const int64_t* row, int64_t nrows, int64_t col0, int64_t nv,
                         int64_t cs, const Acc* bias, void* dst);

template <class Acc, class Out, bool kEpi, int kAct>
void StoreBlock(const Acc* src, int64_t ld, const int64_t* row, int64_t nrows, int64_t col0, int64_t nv,
                int64_t cs, const Acc* bias, void* dst) {
  Out* out = static_cast<Out*>(dst) + col0 * cs;
  auto value = [&](int64_t r, int64_t j) {
    const Acc v = src[r * ld + j];
    return FromAcc<Out, Acc>(kEpi ? Activate(kAct, v + bias[j]) : v);
  };
  if (cs == 1) {
    for (int64_t r = 0; r < nrows; ++r) {
      Out* d = out + row[r];
      for (int64_t j = 0; j < nv; ++j) d[j] = value(r, j);
    }
  } else {
    for (int64_t j = 0; j < nv; ++j) {
      Out* d = out + j * cs;
      for (int64_t r = 0; r < nrows; ++r) d[row[r]] = value(r, j);
    }
  }
}

template <class Acc, class Out>
StoreFn<Acc> GetStore(bool epilogue, int act) {
  if (!epilogue) return &StoreBlock<Acc, Out, false, kActNone>;
  switch (act) {
    case kActRelu: return &StoreBlock<Acc, Out, true, kActRelu>;
    case kActGelu: return &StoreBlock<Acc, Out, true, kActGelu>;
    case kActSilu: return &StoreBlock<Acc, Out, true, kActSilu>;
    default: return &StoreBlock<Acc, Out, true, kActNone>;
  }
}

// The operands of one indirect GEMM call, generic over fwd and dgrad.
template <class Acc>
struct Op {
  DimMap dim[3];
  int64_t S = 1;       // segments (feature or batch groups)
  int64_t nbatch = 0;  // destination batches per segment
  int64_t cin = 0;     // reduction channels per tap
  int64_t ncols = 0;   // output columns per segment
  const Acc* src = nullptr;
  int64_t src_c = 0, src_bstep = 0, src_cstep = 0;  // channels per position; per-segment batch/channel offsets
  // Destination element (batch b, flat position q, channel ch) at dst[b*dst_bs + q*dst_qs + ch*dst_cs], in the
  // output's own layout and type (store converts); per-segment batch and channel offsets.
  void* dst = nullptr;
  int64_t dst_bs = 0, dst_qs = 0, dst_cs = 0, dst_bstep = 0, dst_cstep = 0;
  // Filter value for (segment s, tap f, reduction channel c, column n): w[f*wf + c*wc + s*ws + n*wn].
  const Acc* w = nullptr;
  int64_t wf = 0, wc = 0, ws = 0, wn = 0;
  const Acc* bias = nullptr;  // fwd epilogue only (else null): k values, indexed by the destination channel
  StoreFn<Acc> store = nullptr;
};

// One (segment, residue class) GEMM.
struct Problem {
  int64_t s = 0;
  int64_t r[3] = {0, 0, 0};
  int64_t cnt[3] = {1, 1, 1};  // destination positions of the class per dim
  int64_t rows = 0;
  int64_t tap0 = 0, ntaps = 0;  // its taps: taps[tap0 .. tap0 + ntaps), as (f0, f1, f2)
  int64_t packed = 0;           // offset of its packed filter
  int64_t panels = 0, panels_per_block = 1;
};

struct Item {
  int64_t prob, panel0, panel1, tile0, tile1;
};

template <class Acc>
bool Run(const Op<Acc>& op) {
  constexpr int NR = kNR<Acc>;
  const DimMap* dm = op.dim;
  std::vector<Problem> probs;
  std::vector<int64_t> taps;  // triples
  int64_t packed_size = 0;
  double macs = 0;
  const int64_t panels = CeilDiv(op.ncols, NR);
  if (panels == 0) return true;  // no output channels: nothing to write
  for (int64_t s = 0; s < op.S; ++s) {
    const int64_t c0 = std::min(dm[0].P, dm[0].Q), c1 = std::min(dm[1].P, dm[1].Q), c2 = std::min(dm[2].P, dm[2].Q);
    for (int64_t r0 = 0; r0 < c0; ++r0) {
      for (int64_t r1 = 0; r1 < c1; ++r1) {
        for (int64_t r2 = 0; r2 < c2; ++r2) {
          Problem pb;
          pb.s = s;
          pb.r[0] = r0;
          pb.r[1] = r1;
          pb.r[2] = r2;
          pb.rows = op.nbatch;
          for (int d = 0; d < 3; ++d) {
            pb.cnt[d] = CeilDiv(dm[d].Q - pb.r[d], dm[d].P);
            pb.rows *= pb.cnt[d];
          }
          if (pb.rows == 0) continue;
          pb.tap0 = static_cast<int64_t>(taps.size()) / 3;
          for (int64_t f0 : dm[0].taps[r0]) {
            for (int64_t f1 : dm[1].taps[r1]) {
              for (int64_t f2 : dm[2].taps[r2]) taps.insert(taps.end(), {f0, f1, f2});
            }
          }
          pb.ntaps = static_cast<int64_t>(taps.size()) / 3 - pb.tap0;
          pb.panels = panels;
          pb.packed = packed_size;
          packed_size += panels * pb.ntaps * op.cin * NR;
          macs += static_cast<double>(pb.rows) * pb.ntaps * op.cin * op.ncols;
          const int64_t panel_bytes = std::max<int64_t>(1, pb.ntaps * op.cin * NR * static_cast<int64_t>(sizeof(Acc)));
          pb.panels_per_block = std::clamp<int64_t>(kPackedBlockBytes / panel_bytes, 1, panels);
          probs.push_back(pb);
        }
      }
    }
  }
  if (probs.empty()) return true;
  const int threads = static_cast<int>(std::clamp<double>(macs / kGemmMinWorkPerThread, 1, PoolThreads()));

  // Pack the filter: per problem and column panel, [tap][channel][NR] (columns past ncols are zero).
  ScratchVec<Acc> packed(static_cast<size_t>(packed_size));
  const int64_t npack = static_cast<int64_t>(probs.size()) * panels;
  const bool packed_ok = PoolFor(npack, threads, [&](int64_t item, int) {
    const Problem& pb = probs[item / panels];
    const int64_t jp = item % panels;
    Acc* out = packed.data() + pb.packed + jp * pb.ntaps * op.cin * NR;
    const Acc* ws = op.w + pb.s * op.ws;
    for (int64_t t = 0; t < pb.ntaps; ++t) {
      const int64_t* ft = &taps[(pb.tap0 + t) * 3];
      const int64_t f = (ft[0] * dm[1].W + ft[1]) * dm[2].W + ft[2];
      for (int64_t c = 0; c < op.cin; ++c, out += NR) {
        const Acc* wr = ws + f * op.wf + c * op.wc;
        for (int j = 0; j < NR; ++j) {
          const int64_t n = jp * NR + j;
          out[j] = n < op.ncols ? wr[n * op.wn] : Acc(0);
        }
      }
    }
  });
  if (!packed_ok) return false;

  // Work items: blocks of column panels x chunks of row tiles, enough of them to share out.
  std::vector<Item> items;
  int64_t total_tiles = 0;
  for (const Problem& pb : probs) total_tiles += CeilDiv(pb.rows, kMR) * CeilDiv(pb.panels, pb.panels_per_block);
  const int64_t tiles_per_chunk = std::clamp<int64_t>(total_tiles / kTargetItems, 1, kMaxChunkTiles);
  int64_t max_taps = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(probs.size()); ++i) {
    Problem& pb = probs[i];
    max_taps = std::max(max_taps, pb.ntaps);
    const int64_t mtiles = CeilDiv(pb.rows, kMR);
    int64_t ppb = pb.panels_per_block;
    // Too few items (few rows): narrower panel blocks.
    const int64_t chunks = CeilDiv(mtiles, tiles_per_chunk);
    if (chunks * CeilDiv(pb.panels, ppb) < kTargetItems) {
      ppb = std::clamp<int64_t>(pb.panels * chunks / kTargetItems, 1, ppb);
    }
    for (int64_t p0 = 0; p0 < pb.panels; p0 += ppb) {
      for (int64_t t0 = 0; t0 < mtiles; t0 += tiles_per_chunk) {
        items.push_back({i, p0, std::min(pb.panels, p0 + ppb), t0, std::min(mtiles, t0 + tiles_per_chunk)});
      }
    }
  }

  int64_t max_block = 1;  // widest panel block of an item, in columns
  for (const Item& item : items) max_block = std::max(max_block, (item.panel1 - item.panel0) * NR);
  const bool by_chunk = op.dst_cs != 1;
  const std::vector<Acc> zeros(static_cast<size_t>(std::max<int64_t>(op.cin, 1)), Acc(0));
  struct Scratch {
    std::vector<const Acc*> ptrs;     // [tap][row of the tile]
    std::vector<int64_t> rows;        // destination offsets of the chunk's rows
    ScratchVec<Acc> block;            // channels-first destinations: the chunk's results, [row][column]
    alignas(64) Acc tile[kMR * NR];
  };
  std::vector<Scratch> scratch(static_cast<size_t>(threads));
  for (Scratch& sc : scratch) {
    sc.ptrs.resize(static_cast<size_t>(std::max<int64_t>(max_taps, 1) * kMR));
    sc.rows.resize(static_cast<size_t>(tiles_per_chunk * kMR));
    if (by_chunk) sc.block.resize(static_cast<size_t>(tiles_per_chunk * kMR * max_block));
  }
  const IgemmTileFn<Acc> kernel = GetMicroKernels<Acc>().igemm;
  const int64_t L0 = dm[0].L, L1 = dm[1].L, L2 = dm[2].L;
  const int64_t Q1 = dm[1].Q, Q2 = dm[2].Q;

  return PoolFor(static_cast<int64_t>(items.size()), threads, [&](int64_t it, int thread) {
    const Item& item = items[it];
    const Problem& pb = probs[item.prob];
    Scratch& sc = scratch[thread];
    const Acc** ptrs = sc.ptrs.data();
    Acc* tile = sc.tile;
    const int64_t* tp = &taps[pb.tap0 * 3];
    const Acc* src = op.src + pb.s * op.src_cstep;
    const int64_t src_b0 = pb.s * op.src_bstep, dst_b0 = pb.s * op.dst_bstep, dst_co = pb.s * op.dst_cstep;
    const int64_t c0 = item.panel0 * NR, ncols = std::min(op.ncols, item.panel1 * NR) - c0;
    const Acc* bias = op.bias ? op.bias + dst_co : nullptr;
    const int64_t m_begin = item.tile0 * kMR, m_end = std::min(pb.rows, item.tile1 * kMR);
    for (int64_t m0 = m_begin; m0 < m_end; m0 += kMR) {
      const int nrows = static_cast<int>(std::min<int64_t>(kMR, m_end - m0));
      int64_t* rowp = sc.rows.data() + (m0 - m_begin);
      for (int r = 0; r < kMR; ++r) {
        if (r >= nrows) {
          for (int64_t t = 0; t < pb.ntaps; ++t) ptrs[t * kMR + r] = zeros.data();
          continue;
        }
        int64_t m = m0 + r;
        const int64_t t2 = m % pb.cnt[2];
        m /= pb.cnt[2];
        const int64_t t1 = m % pb.cnt[1];
        m /= pb.cnt[1];
        const int64_t t0 = m % pb.cnt[0];
        const int64_t j = m / pb.cnt[0];
        const int64_t q0 = pb.r[0] + t0 * dm[0].P, q1 = pb.r[1] + t1 * dm[1].P, q2 = pb.r[2] + t2 * dm[2].P;
        rowp[r] = (dst_b0 + j) * op.dst_bs + ((q0 * Q1 + q1) * Q2 + q2) * op.dst_qs + dst_co * op.dst_cs;
        const int64_t* s0 = dm[0].src.data() + q0 * dm[0].W;
        const int64_t* s1 = dm[1].src.data() + q1 * dm[1].W;
        const int64_t* s2 = dm[2].src.data() + q2 * dm[2].W;
        const int64_t sb = src_b0 + j;
        for (int64_t t = 0; t < pb.ntaps; ++t) {
          const int64_t i0 = s0[tp[3 * t]], i1 = s1[tp[3 * t + 1]], i2 = s2[tp[3 * t + 2]];
          ptrs[t * kMR + r] = (i0 < 0 || i1 < 0 || i2 < 0)
                                  ? zeros.data()
                                  : src + (((sb * L0 + i0) * L1 + i1) * L2 + i2) * op.src_c;
        }
      }
      for (int64_t jp = item.panel0; jp < item.panel1; ++jp) {
        if (pb.ntaps > 0) {
          kernel(pb.ntaps, op.cin, ptrs, packed.data() + pb.packed + jp * pb.ntaps * op.cin * NR, tile);
        } else {
          std::fill(tile, tile + kMR * NR, Acc(0));
        }
        const int64_t n0 = jp * NR, nv = std::min<int64_t>(NR, op.ncols - n0);
        if (!by_chunk) {
          op.store(tile, NR, rowp, nrows, n0, nv, 1, bias ? bias + n0 : nullptr, op.dst);
        } else {
          for (int r = 0; r < nrows; ++r) {
            std::copy(tile + r * NR, tile + r * NR + nv, sc.block.data() + (m0 - m_begin + r) * max_block + n0 - c0);
          }
        }
      }
    }
    if (by_chunk) {
      op.store(sc.block.data(), max_block, sc.rows.data(), m_end - m_begin, c0, ncols, op.dst_cs,
               bias ? bias + c0 : nullptr, op.dst);
    }
  });
}

// Channels per group and the per-dim maps shared by the applicability tests and the drivers.
struct Shape {
  int64_t Cg, Ks, Nb, S;
  bool depthwise;
};
Shape ShapeOf(const ConvParams& p) {
  Shape s;
  s.S = p.groups[0] * p.batch_groups[0];
  s.Cg = p.c[0] / p.groups[0];
  s.Ks = p.k[0] / s.S;
  s.Nb = p.n[0] / p.batch_groups[0];
  s.depthwise = p.groups[0] > 1 && s.Cg == 1 && s.Ks == 1;
  return s;
}

}  // namespace

// Everything but depthwise convolutions (one channel in and out per group), which the direct kernels run as
// elementwise products: the GEMM paths beat the direct kernels even with a single channel per group.
bool IgemmFwdApplies(const ConvParams& p) { return !ShapeOf(p).depthwise; }

bool IgemmDgradApplies(const ConvParams& p) { return !ShapeOf(p).depthwise; }

// Strides of the destination (batch, flat position, channel) in its layout.
void DestStrides(const ConvParams& p, bool is_x, int64_t* bs, int64_t* qs, int64_t* cs) {
  const int64_t* sp = is_x ? p.in : p.out;
  const int64_t q = sp[0] * sp[1] * sp[2], ch = is_x ? p.c[0] : p.k[0];
  *bs = q * ch;
  if (p.layout[0] == kChannelsFirst) {
    *qs = 1;
    *cs = q;
  } else {
    *qs = ch;
    *cs = 1;
  }
}

template <class Acc, class Out>
bool IgemmFwd(const ConvParams& p, const Acc* x, const Acc* w, const Acc* bias, Out* y) {
  const Shape sh = ShapeOf(p);
  Op<Acc> op;
  for (int d = 0; d < 3; ++d) {
    op.dim[d].Init(p.out[d], p.in[d], p.win[d], p.stride[d], -p.pad_lo[d], p.rhs_dil[d], p.lhs_dil[d]);
  }
  op.S = sh.S;
  op.nbatch = sh.Nb;
  op.cin = sh.Cg;
  op.ncols = sh.Ks;
  op.src = x;
  op.src_c = p.c[0];
  op.src_bstep = p.batch_groups[0] > 1 ? sh.Nb : 0;
  op.src_cstep = p.groups[0] > 1 ? sh.Cg : 0;
  op.dst = y;
  DestStrides(p, false, &op.dst_bs, &op.dst_qs, &op.dst_cs);
  op.dst_bstep = 0;
  op.dst_cstep = sh.Ks;
  op.w = w;  // (F, Cg, K)
  op.wf = sh.Cg * p.k[0];
  op.wc = p.k[0];
  op.ws = sh.Ks;
  op.wn = 1;
  const int act = static_cast<int>(p.activation[0]);
  std::vector<Acc> zero_bias;
  if (bias == nullptr && act != kActNone) {
    zero_bias.assign(static_cast<size_t>(p.k[0]), Acc(0));
    bias = zero_bias.data();
  }
  op.bias = bias;  // non-null exactly when there is an epilogue
  op.store = GetStore<Acc, Out>(bias != nullptr, act);
  return Run(op);
}

template <class Acc, class Out>
bool IgemmDgrad(const ConvParams& p, const Acc* dy, const Acc* w, Out* dx) {
  const Shape sh = ShapeOf(p);
  Op<Acc> op;
  for (int d = 0; d < 3; ++d) {
    op.dim[d].Init(p.in[d], p.out[d], p.win[d], p.lhs_dil[d], p.pad_lo[d], -p.rhs_dil[d], p.stride[d]);
  }
  op.S = sh.S;
  op.nbatch = sh.Nb;
  op.cin = sh.Ks;
  op.ncols = sh.Cg;
  op.src = dy;
  op.src_c = p.k[0];
  op.src_bstep = 0;
  op.src_cstep = sh.Ks;
  op.dst = dx;
  DestStrides(p, true, &op.dst_bs, &op.dst_qs, &op.dst_cs);
  op.dst_bstep = p.batch_groups[0] > 1 ? sh.Nb : 0;
  op.dst_cstep = p.groups[0] > 1 ? sh.Cg : 0;
  op.w = w;  // (F, Cg, K): reduction channel kk, column cg
  op.wf = sh.Cg * p.k[0];
  op.wc = 1;
  op.ws = sh.Ks;
  op.wn = p.k[0];
  op.store = GetStore<Acc, Out>(false, kActNone);
  return Run(op);
}

#define JAXCONV_IGEMM_INSTANTIATE(Acc, Out)                                                        \
  template bool IgemmFwd<Acc, Out>(const ConvParams&, const Acc*, const Acc*, const Acc*, Out*); \
  template bool IgemmDgrad<Acc, Out>(const ConvParams&, const Acc*, const Acc*, Out*);
JAXCONV_IGEMM_INSTANTIATE(float, float)
JAXCONV_IGEMM_INSTANTIATE(float, bf16_t)
JAXCONV_IGEMM_INSTANTIATE(float, f16_t)
JAXCONV_IGEMM_INSTANTIATE(double, double)
#undef JAXCONV_IGEMM_INSTANTIATE

}  // namespace cpu
}  // namespace jaxconv
