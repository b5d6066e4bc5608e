// CPU kernels: see conv_cpu.h. Strategy:
//  - Inputs are converted (and, for channels-first, transposed) into channels-last temporaries of the
//    accumulation type (f32, or f64 for f64); f32/f64 channels-last inputs are used in place (convert.h).
//  - Every convolution but a depthwise one runs on the GEMM paths (conv_gemm.h: indirect GEMMs for fwd and
//    dgrad, which write the output in its own layout and type, and a GEMM over positions for wgrad).
//  - The direct kernels below run the rest (depthwise) and keep the general case: per spatial dim, the
//    valid (tap, position) pairs of every output (fwd), input (dgrad) or tap (wgrad) position form one
//    arithmetic progression, precomputed (lhs-dilation divisibility, padding and bounds folded in), so the
//    inner loops never test validity.
//    fwd: per output position, a full K row is accumulated (innermost loop over contiguous K).
//    dgrad: gather per dx position over (tap, output position), a full C row (innermost over contiguous Cg).
//    wgrad: per (tap, block of Cg rows), accumulate outer products over (batch, output position) in a fixed
//    order. Every output element is produced by one thread in a fixed order: deterministic results.
//    Their outputs are written through a channels-last accumulation-type buffer (the output itself when it
//    has that type and layout), then converted / transposed.
#include "cpu/conv_cpu.h"

#include "cpu/activation.h"
#include "cpu/conv_gemm.h"
#include "cpu/convert.h"
#include "cpu/microkernel.h"
#include "cpu/thread_pool.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <numeric>
#include <thread>
#include <type_traits>
#include <vector>

namespace jaxconv {
namespace cpu {

// ---------------------------------------------------------------------------------------------------------
// Scalar conversions
// ---------------------------------------------------------------------------------------------------------

float BF16ToFloat(uint16_t h) { return cvt::BF16ToFloat(h); }
uint16_t FloatToBF16(float f) { return cvt::FloatToBF16(f); }
float HalfToFloat(uint16_t h) { return cvt::HalfToFloat(h); }
uint16_t FloatToHalf(float f) { return cvt::FloatToHalf(f); }

namespace {

// ---------------------------------------------------------------------------------------------------------
// Threads
// ---------------------------------------------------------------------------------------------------------

constexpr double kMinWorkPerThread = 1 << 19;  // multiply-adds; below this a thread costs more than it saves

// Runs fn(begin, end) over [0, n) split into contiguous chunks, on the pool (thread_pool.h; a few chunks per
// thread, claimed dynamically). Every kernel computes each output element inside one chunk in a fixed order,
// so the split does not change any result. Returns false if any chunk threw (e.g. bad_alloc); the caller
// reports an error.
template <class F>
bool ParallelFor(int64_t n, double work_per_item, F&& fn) {
  if (n <= 0) return true;
  const double total = work_per_item * static_cast<double>(n);
  int64_t t = std::min<int64_t>(PoolThreads(), n);
  t = std::min<int64_t>(t, std::max<int64_t>(1, static_cast<int64_t>(total / kMinWorkPerThread)));
  if (t <= 1) {
    try {
      fn(int64_t{0}, n);
    } catch (...) {
      return false;
    }
    return true;
  }
  const int64_t chunks = std::min<int64_t>(n, 4 * t);
  return PoolFor(chunks, static_cast<int>(t), [&](int64_t i, int) { fn(n * i / chunks, n * (i + 1) / chunks); });
}

// ---------------------------------------------------------------------------------------------------------
// Geometry and index progressions
// ---------------------------------------------------------------------------------------------------------

struct Geo {
  int64_t N, C, K, G, BG, S, Nb, Cg, Ks;
  int64_t in[3], win[3], out[3];
  int64_t IS, F, OS;
  bool cf;
  int act;
  bool has_bias;
  bool poison;
  int64_t ChOff(int64_t s) const { return G > 1 ? s * Cg : 0; }
  int64_t XBatch(int64_t s, int64_t nb) const { return BG > 1 ? s * Nb + nb : nb; }
  // groups == c == k: one input channel and one output channel per group.
  bool Depthwise() const { return G > 1 && Cg == 1 && Ks == 1; }
};

Geo MakeGeo(const ConvParams& p) {
  Geo g;
  g.N = p.n[0];
  g.C = p.c[0];
  g.K = p.k[0];
  g.G = p.groups[0];
  g.BG = p.batch_groups[0];
  g.S = g.G * g.BG;
  g.Nb = g.N / g.BG;
  g.Cg = g.C / g.G;
  g.Ks = g.K / g.S;
  for (int d = 0; d < 3; ++d) {
    g.in[d] = p.in[d];
    g.win[d] = p.win[d];
    g.out[d] = p.out[d];
  }
  g.IS = g.in[0] * g.in[1] * g.in[2];
  g.F = g.win[0] * g.win[1] * g.win[2];
  g.OS = g.out[0] * g.out[1] * g.out[2];
  g.cf = p.layout[0] == kChannelsFirst;
  g.act = static_cast<int>(p.activation[0]);
  g.has_bias = p.has_bias[0] == 1;
  g.poison = p.poison[0] == 1;
  return g;
}

// The valid j in [0, nj) with v = base + a*j divisible by m (> 0) and q = v / m in [0, limit), as the
// progression j = j0 + t*jstep, q = q0 + t*qstep for t in [0, count).
struct Prog {
  int64_t j0 = 0, jstep = 1, q0 = 0, qstep = 0, count = 0;
};

inline int64_t FloorDiv(int64_t a, int64_t b) {  // b > 0
  int64_t q = a / b;
  if (a % b != 0 && a < 0) --q;
  return q;
}
inline int64_t CeilDiv(int64_t a, int64_t b) { return -FloorDiv(-a, b); }  // b > 0
inline int64_t PosMod(int64_t a, int64_t m) {
  int64_t r = a % m;
  return r < 0 ? r + m : r;
}

Prog Solve(int64_t base, int64_t a, int64_t m, int64_t nj, int64_t limit) {
  Prog r;
  if (nj <= 0 || limit <= 0 || a == 0) return r;
  const int64_t aa = a < 0 ? -a : a;
  const int64_t g = std::gcd(aa, m);
  const int64_t jstep = m / g;
  int64_t j0 = -1;
  const int64_t jmax = std::min(jstep, nj);
  for (int64_t j = 0; j < jmax; ++j) {
    if (PosMod(base + a * j, m) == 0) {
      j0 = j;
      break;
    }
  }
  if (j0 < 0) return r;
  const int64_t q0 = (base + a * j0) / m;  // exact
  const int64_t qstep = a / g;             // = a * jstep / m, exact, nonzero
  int64_t tlo = 0, thi = (nj - 1 - j0) / jstep;
  if (qstep > 0) {
    tlo = std::max(tlo, CeilDiv(-q0, qstep));
    thi = std::min(thi, FloorDiv(limit - 1 - q0, qstep));
  } else {
    const int64_t s = -qstep;
    thi = std::min(thi, FloorDiv(q0, s));
    tlo = std::max(tlo, CeilDiv(q0 - (limit - 1), s));
  }
  if (thi < tlo) return r;
  r.j0 = j0 + tlo * jstep;
  r.jstep = jstep;
  r.q0 = q0 + tlo * qstep;
  r.qstep = qstep;
  r.count = thi - tlo + 1;
  return r;
}

enum class ProgKind {
  kFwd,    // per output position o: taps f (j) and input positions i (q)
  kDgrad,  // per input position i: taps f (j) and output positions o (q)
  kWgrad,  // per tap f: output positions o (j) and input positions i (q)
};

void MakeProgs(const ConvParams& p, ProgKind kind, std::vector<Prog> progs[3]) {
  for (int d = 0; d < 3; ++d) {
    const int64_t st = p.stride[d], lo = p.pad_lo[d], ld = p.lhs_dil[d], rd = p.rhs_dil[d];
    const int64_t in = p.in[d], win = p.win[d], out = p.out[d];
    if (kind == ProgKind::kFwd) {
      // p = o*st - lo + f*rd; valid iff p % ld == 0 and i = p / ld in [0, in)
      progs[d].resize(static_cast<size_t>(out));
      for (int64_t o = 0; o < out; ++o) progs[d][o] = Solve(o * st - lo, rd, ld, win, in);
    } else if (kind == ProgKind::kDgrad) {
      // o*st = i*ld + lo - f*rd; valid iff divisible and o in [0, out)
      progs[d].resize(static_cast<size_t>(in));
      for (int64_t i = 0; i < in; ++i) progs[d][i] = Solve(i * ld + lo, -rd, st, win, out);
    } else {
      // p = f*rd - lo + o*st
      progs[d].resize(static_cast<size_t>(win));
      for (int64_t f = 0; f < win; ++f) progs[d][f] = Solve(f * rd - lo, st, ld, out, in);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Layout conversion
// ---------------------------------------------------------------------------------------------------------

// An activation tensor (x or dy): (B, P, Ch) channels-last, or (B, Ch, P) channels-first, to channels-last Acc.
template <class In, class Acc>
const Acc* PrepAct(bool cf, int64_t B, int64_t P, int64_t Ch, const In* src, ScratchVec<Acc>& buf) {
  if constexpr (std::is_same_v<In, Acc>) {
    if (!cf) return src;
  }
  const int64_t n = B * P * Ch;
  buf.resize(static_cast<size_t>(n));
  auto cvt = [](In v) { return ToAcc<Acc>(v); };
  if (cf) {
    TransposeConvert(B, Ch, P, src, buf.data(), cvt);
  } else {
    ConvertCopy(n, src, buf.data(), cvt);
  }
  return buf.data();
}

// w (channels-last (F, Cg, K) or channels-first (K, Cg, F)) -> (F, Cg, K) Acc.
template <class In, class Acc>
const Acc* PrepWFwd(const Geo& g, const In* src, ScratchVec<Acc>& buf) {
  if constexpr (std::is_same_v<In, Acc>) {
    if (!g.cf) return src;
  }
  const int64_t F = g.F, Cg = g.Cg, K = g.K;
  buf.resize(static_cast<size_t>(F * Cg * K));
  if (!g.cf) {
    for (int64_t e = 0; e < F * Cg * K; ++e) buf[e] = ToAcc<Acc>(src[e]);
  } else {
    for (int64_t k = 0; k < K; ++k)
      for (int64_t cg = 0; cg < Cg; ++cg)
        for (int64_t f = 0; f < F; ++f) buf[(f * Cg + cg) * K + k] = ToAcc<Acc>(src[(k * Cg + cg) * F + f]);
  }
  return buf.data();
}

// w -> (F, K, Cg) Acc, for dgrad.
template <class In, class Acc>
const Acc* PrepWDgrad(const Geo& g, const In* src, ScratchVec<Acc>& buf) {
  const int64_t F = g.F, Cg = g.Cg, K = g.K;
  auto cvt = [](In v) { return ToAcc<Acc>(v); };
  if (g.Depthwise()) return PrepWFwd<In, Acc>(g, src, buf);  // Cg == 1: (F, 1, K) == (F, K, 1)
  buf.resize(static_cast<size_t>(F * Cg * K));
  if (!g.cf) {
    TransposeConvert(F, Cg, K, src, buf.data(), cvt);  // (F, Cg, K) -> (F, K, Cg)
  } else {
    TransposeConvert<In, Acc>(1, K * Cg, F, src, buf.data(), cvt);  // (K*Cg, F) -> (F, K*Cg)
  }
  return buf.data();
}

// Channels-last Acc result (B, P, Ch) -> the output buffer in its layout and dtype.
template <class Acc, class Out>
void StoreAct(bool cf, int64_t B, int64_t P, int64_t Ch, const Acc* src, Out* dst) {
  const int64_t n = B * P * Ch;
  auto cvt = [](Acc v) { return FromAcc<Out, Acc>(v); };
  if (cf) {
    TransposeConvert(B, P, Ch, src, dst, cvt);
  } else {
    ConvertCopy(n, src, dst, cvt);
  }
}

template <class Acc>
void FillNaN(Acc* p, int64_t n) {
  std::fill(p, p + n, std::numeric_limits<Acc>::quiet_NaN());
}

// Where a kernel writes its channels-last Acc result: straight into the output when it has that type and
// layout, else into a temporary.
template <class Acc, class Out>
Acc* ResultBuffer(const Geo& g, int64_t n, Out* out, ScratchVec<Acc>& buf) {
  if constexpr (std::is_same_v<Out, Acc>) {
    if (!g.cf) return out;
  }
  buf.resize(static_cast<size_t>(n));
  if (g.poison) FillNaN(buf.data(), n);
  return buf.data();
}

// ---------------------------------------------------------------------------------------------------------
// Kernels (channels-last, accumulation type)
// ---------------------------------------------------------------------------------------------------------

#if defined(__GNUC__) || defined(__clang__)
#define JAXCONV_INLINE inline __attribute__((always_inline))
#else
#define JAXCONV_INLINE inline
#endif

// acc[0..n) += x0*w0[..] + x1*w1[..] + x2*w2[..] + x3*w3[..]
template <class Acc>
JAXCONV_INLINE void Axpy4(int64_t n, Acc* __restrict a, Acc x0, const Acc* __restrict w0, Acc x1,
                          const Acc* __restrict w1, Acc x2, const Acc* __restrict w2, Acc x3,
                          const Acc* __restrict w3) {
  for (int64_t i = 0; i < n; ++i) a[i] += x0 * w0[i] + x1 * w1[i] + x2 * w2[i] + x3 * w3[i];
}
template <class Acc>
JAXCONV_INLINE void Axpy1(int64_t n, Acc* __restrict a, Acc x0, const Acc* __restrict w0) {
  for (int64_t i = 0; i < n; ++i) a[i] += x0 * w0[i];
}

// The leaf operations of the kernels. Each call does a whole (tap, segment) worth of work, so they are
// compiled twice (baseline and AVX2+FMA) and picked once at run time; the call overhead is negligible.
//   MatVec: a[0..n) += sum_{j<m} xs[j] * w[j*wstride + 0..n), in blocks of 4 j's.
//   Mul:    a[0..n) += x[0..n) * w[0..n).
//   Outer:  b[j*ldb + 0..n) += xs[j] * v[0..n) for j < m.
template <class Acc>
JAXCONV_INLINE void MatVecBody(int64_t m, int64_t n, Acc* a, const Acc* xs, const Acc* w, int64_t wstride) {
  int64_t j = 0;
  for (; j + 4 <= m; j += 4) {
    Axpy4(n, a, xs[j], w + j * wstride, xs[j + 1], w + (j + 1) * wstride, xs[j + 2], w + (j + 2) * wstride,
          xs[j + 3], w + (j + 3) * wstride);
  }
  for (; j < m; ++j) Axpy1(n, a, xs[j], w + j * wstride);
}
template <class Acc>
JAXCONV_INLINE void MulBody(int64_t n, Acc* __restrict a, const Acc* __restrict x, const Acc* __restrict w) {
  for (int64_t i = 0; i < n; ++i) a[i] += x[i] * w[i];
}
template <class Acc>
JAXCONV_INLINE void OuterBody(int64_t m, int64_t n, Acc* b, int64_t ldb, const Acc* xs, const Acc* v) {
  for (int64_t j = 0; j < m; ++j) Axpy1(n, b + j * ldb, xs[j], v);
}

template <class Acc>
JAXCONV_INLINE void Outer4Body(int64_t m, int64_t n, Acc* b, int64_t ldb, const Acc* const* xs,
                               const Acc* const* v) {
  for (int64_t j = 0; j < m; ++j) Axpy4(n, b + j * ldb, xs[0][j], v[0], xs[1][j], v[1], xs[2][j], v[2], xs[3][j], v[3]);
}

template <class Acc>
struct Leaf {
  void (*mat_vec)(int64_t, int64_t, Acc*, const Acc*, const Acc*, int64_t);
  void (*mul)(int64_t, Acc*, const Acc*, const Acc*);
  void (*outer)(int64_t, int64_t, Acc*, int64_t, const Acc*, const Acc*);
  // Four outer products at once: b[j*ldb + 0..n) += sum_{p<4} xs[p][j] * v[p][0..n).
  void (*outer4)(int64_t, int64_t, Acc*, int64_t, const Acc* const*, const Acc* const*);
};

template <class Acc>
void MatVecBase(int64_t m, int64_t n, Acc* a, const Acc* xs, const Acc* w, int64_t ws) { MatVecBody(m, n, a, xs, w, ws); }
template <class Acc>
void MulBase(int64_t n, Acc* a, const Acc* x, const Acc* w) { MulBody(n, a, x, w); }
template <class Acc>
void OuterBase(int64_t m, int64_t n, Acc* b, int64_t ldb, const Acc* xs, const Acc* v) { OuterBody(m, n, b, ldb, xs, v); }

template <class Acc>
void Outer4Base(int64_t m, int64_t n, Acc* b, int64_t ldb, const Acc* const* xs, const Acc* const* v) {
  Outer4Body(m, n, b, ldb, xs, v);
}

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define JAXCONV_HAVE_AVX2_LEAF 1
template <class Acc>
__attribute__((target("avx2,fma"))) void MatVecAvx2(int64_t m, int64_t n, Acc* a, const Acc* xs, const Acc* w,
                                                    int64_t ws) {
  MatVecBody(m, n, a, xs, w, ws);
}
template <class Acc>
__attribute__((target("avx2,fma"))) void MulAvx2(int64_t n, Acc* a, const Acc* x, const Acc* w) {
  MulBody(n, a, x, w);
}
template <class Acc>
__attribute__((target("avx2,fma"))) void OuterAvx2(int64_t m, int64_t n, Acc* b, int64_t ldb, const Acc* xs,
                                                   const Acc* v) {
  OuterBody(m, n, b, ldb, xs, v);
}
template <class Acc>
__attribute__((target("avx2,fma"))) void Outer4Avx2(int64_t m, int64_t n, Acc* b, int64_t ldb,
                                                    const Acc* const* xs, const Acc* const* v) {
  Outer4Body(m, n, b, ldb, xs, v);
}
#endif

template <class Acc>
Leaf<Acc> GetLeaf() {
#ifdef JAXCONV_HAVE_AVX2_LEAF
  if (UseAvx2()) return {&MatVecAvx2<Acc>, &MulAvx2<Acc>, &OuterAvx2<Acc>, &Outer4Avx2<Acc>};
#endif
  return {&MatVecBase<Acc>, &MulBase<Acc>, &OuterBase<Acc>, &Outer4Base<Acc>};
}

// y (Nb, OS, K) = act(bias + conv(x (N, IS, C), w (F, Cg, K))).
template <class Acc>
bool FwdKernel(const Geo& g, const std::vector<Prog> pr[3], const Acc* x, const Acc* w, const Acc* bias,
               Acc* y) {
  const int64_t OD = g.out[0], OH = g.out[1], OW = g.out[2];
  const int64_t IH = g.in[1], IW = g.in[2], WH = g.win[1], WW = g.win[2];
  const int64_t K = g.K, C = g.C, Cg = g.Cg, Ks = g.Ks, S = g.S;
  const int64_t rows = g.Nb * OD * OH;
  const double work = static_cast<double>(OW) * static_cast<double>(g.F) * static_cast<double>(Cg * K + 1);
  const Leaf<Acc> leaf = GetLeaf<Acc>();
  return ParallelFor(rows, work, [&](int64_t rb, int64_t re) {
    std::vector<Acc> accv(static_cast<size_t>(K));
    Acc* acc = accv.data();
    for (int64_t r = rb; r < re; ++r) {
      const int64_t nb = r / (OD * OH), od = (r / OH) % OD, oh = r % OH;
      const Prog& pd = pr[0][od];
      const Prog& ph = pr[1][oh];
      for (int64_t ow = 0; ow < OW; ++ow) {
        const Prog& pw = pr[2][ow];
        std::fill(acc, acc + K, Acc(0));
        for (int64_t td = 0; td < pd.count; ++td) {
          const int64_t fd = pd.j0 + td * pd.jstep, id = pd.q0 + td * pd.qstep;
          for (int64_t th = 0; th < ph.count; ++th) {
            const int64_t fh = ph.j0 + th * ph.jstep, ih = ph.q0 + th * ph.qstep;
            for (int64_t tw = 0; tw < pw.count; ++tw) {
              const int64_t fw = pw.j0 + tw * pw.jstep, iw = pw.q0 + tw * pw.qstep;
              const int64_t f = (fd * WH + fh) * WW + fw;
              const int64_t xpos = (id * IH + ih) * IW + iw;
              const Acc* wt = w + f * Cg * K;
              if (S == 1) {
                leaf.mat_vec(Cg, K, acc, x + (nb * g.IS + xpos) * C, wt, K);
              } else if (g.Depthwise()) {
                leaf.mul(K, acc, x + (nb * g.IS + xpos) * C, wt);
              } else {
                for (int64_t s = 0; s < S; ++s) {
                  leaf.mat_vec(Cg, Ks, acc + s * Ks, x + (g.XBatch(s, nb) * g.IS + xpos) * C + g.ChOff(s),
                               wt + s * Ks, K);
                }
              }
            }
          }
        }
        Acc* yrow = y + (((nb * OD + od) * OH + oh) * OW + ow) * K;
        for (int64_t k = 0; k < K; ++k) yrow[k] = Activate(g.act, acc[k] + (bias ? bias[k] : Acc(0)));
      }
    }
  });
}

// dx (N, IS, C) from dy (Nb, OS, K) and wT (F, K, Cg).
template <class Acc>
bool DgradKernel(const Geo& g, const std::vector<Prog> pr[3], const Acc* dy, const Acc* wT, Acc* dx) {
  const int64_t ID = g.in[0], IH = g.in[1], IW = g.in[2];
  const int64_t OH = g.out[1], OW = g.out[2], WH = g.win[1], WW = g.win[2];
  const int64_t K = g.K, C = g.C, Cg = g.Cg, Ks = g.Ks, S = g.S;
  const int64_t rows = g.N * ID * IH;
  // Average taps per input position ~ F * OS / IS (bounded by F).
  const double taps = g.IS > 0 ? std::min<double>(static_cast<double>(g.F),
                                                   static_cast<double>(g.F) * g.OS / static_cast<double>(g.IS))
                               : 0.0;
  const double work = static_cast<double>(IW) * (taps * static_cast<double>(Cg * K / std::max<int64_t>(g.BG, 1)) + 1);
  const Leaf<Acc> leaf = GetLeaf<Acc>();
  return ParallelFor(rows, work, [&](int64_t rb, int64_t re) {
    std::vector<Acc> accv(static_cast<size_t>(C));
    Acc* acc = accv.data();
    for (int64_t r = rb; r < re; ++r) {
      const int64_t n = r / (ID * IH), id = (r / IH) % ID, ih = r % IH;
      int64_t s_lo = 0, s_hi = S, nb = n;
      if (g.BG > 1) {
        s_lo = n / g.Nb;
        s_hi = s_lo + 1;
        nb = n % g.Nb;
      }
      const Prog& pd = pr[0][id];
      const Prog& ph = pr[1][ih];
      for (int64_t iw = 0; iw < IW; ++iw) {
        const Prog& pw = pr[2][iw];
        std::fill(acc, acc + C, Acc(0));
        for (int64_t td = 0; td < pd.count; ++td) {
          const int64_t fd = pd.j0 + td * pd.jstep, od = pd.q0 + td * pd.qstep;
          for (int64_t th = 0; th < ph.count; ++th) {
            const int64_t fh = ph.j0 + th * ph.jstep, oh = ph.q0 + th * ph.qstep;
            for (int64_t tw = 0; tw < pw.count; ++tw) {
              const int64_t fw = pw.j0 + tw * pw.jstep, ow = pw.q0 + tw * pw.qstep;
              const int64_t f = (fd * WH + fh) * WW + fw;
              const Acc* dyrow = dy + (nb * g.OS + (od * OH + oh) * OW + ow) * K;
              const Acc* wt = wT + f * K * Cg;
              if (g.Depthwise()) {
                leaf.mul(K, acc, dyrow, wt);
              } else {
                for (int64_t s = s_lo; s < s_hi; ++s) {
                  leaf.mat_vec(Ks, Cg, acc + g.ChOff(s), dyrow + s * Ks, wt + s * Ks * Cg, Cg);
                }
              }
            }
          }
        }
        std::copy(acc, acc + C, dx + (((n * ID + id) * IH + ih) * IW + iw) * C);
      }
    }
  });
}

// dw (F, Cg, K) from x (N, IS, C) and dy (Nb, OS, K).
template <class Acc>
bool WgradKernel(const Geo& g, const std::vector<Prog> pr[3], const Acc* x, const Acc* dy, Acc* dw) {
  const int64_t IH = g.in[1], IW = g.in[2], OH = g.out[1], OW = g.out[2];
  const int64_t WH = g.win[1], WW = g.win[2];
  const int64_t K = g.K, C = g.C, Cg = g.Cg, Ks = g.Ks, S = g.S, F = g.F, Nb = g.Nb;
  const bool depthwise = g.Depthwise();
  // Work items: (tap, block of cg rows). The block size does not change any result (each element is summed
  // over (nb, o) in the same order); it only sets the parallelism and the block's memory.
  const int64_t rows_per_tap = depthwise ? 1 : Cg;
  int64_t blocks = std::max<int64_t>(1, (4 * NumThreads() + F - 1) / std::max<int64_t>(F, 1));
  blocks = std::max(blocks, (rows_per_tap * K + 65535) / 65536);
  blocks = std::min(blocks, std::max<int64_t>(rows_per_tap, 1));
  const int64_t cb = std::max<int64_t>(1, (rows_per_tap + blocks - 1) / blocks);
  const int64_t nblk = (rows_per_tap + cb - 1) / cb;
  // Upper bound of the multiply-adds of one item (every (nb, o) pair valid for the tap).
  const double work = static_cast<double>(Nb) * static_cast<double>(g.OS) *
                      static_cast<double>((depthwise ? K : cb * K) + 1);
  const Leaf<Acc> leaf = GetLeaf<Acc>();
  return ParallelFor(F * nblk, work, [&](int64_t ib, int64_t ie) {
    std::vector<Acc> blkv;
    for (int64_t item = ib; item < ie; ++item) {
      const int64_t f = item / nblk, c0 = (item % nblk) * cb, c1 = std::min(rows_per_tap, c0 + cb);
      const int64_t fd = f / (WH * WW), fh = (f / WW) % WH, fw = f % WW;
      const int64_t rowlen = depthwise ? K : (c1 - c0) * K;
      blkv.assign(static_cast<size_t>(rowlen), Acc(0));
      Acc* blk = blkv.data();
      const Prog& pd = pr[0][fd];
      const Prog& ph = pr[1][fh];
      const Prog& pw = pr[2][fw];
      // (x position, dy row) pairs are applied four at a time, in the loop order: the grouping, and hence
      // every result, does not depend on the thread count.
      int64_t pend_x[4];  // x element offset of the position (batch of segment 0)
      const Acc* pend_dy[4];
      int64_t pend_nb[4];
      int npend = 0;
      auto flush = [&]() {
        if (depthwise) {
          for (int q = 0; q < npend; ++q) leaf.mul(K, blk, x + pend_x[q], pend_dy[q]);
        } else {
          for (int64_t s = 0; s < S; ++s) {
            const Acc* xr[4];
            const Acc* dr[4];
            for (int q = 0; q < npend; ++q) {
              xr[q] = x + pend_x[q] + (g.XBatch(s, pend_nb[q]) - pend_nb[q]) * g.IS * C + g.ChOff(s) + c0;
              dr[q] = pend_dy[q] + s * Ks;
            }
            if (npend == 4) {
              leaf.outer4(c1 - c0, Ks, blk + s * Ks, K, xr, dr);
            } else {
              for (int q = 0; q < npend; ++q) leaf.outer(c1 - c0, Ks, blk + s * Ks, K, xr[q], dr[q]);
            }
          }
        }
        npend = 0;
      };
      for (int64_t nb = 0; nb < Nb; ++nb) {
        for (int64_t td = 0; td < pd.count; ++td) {
          const int64_t od = pd.j0 + td * pd.jstep, id = pd.q0 + td * pd.qstep;
          for (int64_t th = 0; th < ph.count; ++th) {
            const int64_t oh = ph.j0 + th * ph.jstep, ih = ph.q0 + th * ph.qstep;
            for (int64_t tw = 0; tw < pw.count; ++tw) {
              const int64_t ow = pw.j0 + tw * pw.jstep, iw = pw.q0 + tw * pw.qstep;
              pend_dy[npend] = dy + (nb * g.OS + (od * OH + oh) * OW + ow) * K;
              pend_x[npend] = (nb * g.IS + (id * IH + ih) * IW + iw) * C;
              pend_nb[npend] = nb;
              if (++npend == 4) flush();
            }
          }
        }
      }
      flush();
      std::copy(blk, blk + rowlen, dw + (f * Cg + c0) * K);
    }
  });
}

// ---------------------------------------------------------------------------------------------------------
// Drivers
// ---------------------------------------------------------------------------------------------------------

constexpr const char* kOom = "jaxconv cpu: out of memory (or a worker failed)";

template <class In, class Out>
std::string FwdImpl(const ConvParams& p, const In* x, const In* w, const Out* bias, Out* y) {
  using Acc = std::conditional_t<std::is_same_v<In, double>, double, float>;
  const Geo g = MakeGeo(p);
  std::vector<Prog> pr[3];
  MakeProgs(p, ProgKind::kFwd, pr);
  ScratchVec<Acc> xb, wb, yb, bb;
  const Acc* xa = PrepAct<In, Acc>(g.cf, g.N, g.IS, g.C, x, xb);
  const Acc* wa = PrepWFwd<In, Acc>(g, w, wb);
  const Acc* ba = nullptr;
  if (g.has_bias) {
    bb.resize(static_cast<size_t>(g.K));
    for (int64_t k = 0; k < g.K; ++k) bb[k] = static_cast<Acc>(Cvt<Out>::Load(bias[k]));
    ba = bb.data();
  }
  if (IgemmFwdApplies(p)) {  // writes y in its layout and type
    return IgemmFwd<Acc, Out>(p, xa, wa, ba, y) ? std::string() : std::string(kOom);
  }
  const int64_t ny = g.Nb * g.OS * g.K;
  Acc* ya = ResultBuffer<Acc, Out>(g, ny, y, yb);
  if (!FwdKernel<Acc>(g, pr, xa, wa, ba, ya)) return kOom;
  if (ya != static_cast<void*>(y)) StoreAct<Acc, Out>(g.cf, g.Nb, g.OS, g.K, ya, y);
  return {};
}

template <class In, class Out>
std::string DgradImpl(const ConvParams& p, const In* dy, const In* w, Out* dx) {
  using Acc = std::conditional_t<std::is_same_v<In, double>, double, float>;
  const Geo g = MakeGeo(p);
  std::vector<Prog> pr[3];
  MakeProgs(p, ProgKind::kDgrad, pr);
  ScratchVec<Acc> dyb, wb, xb;
  const Acc* dya = PrepAct<In, Acc>(g.cf, g.Nb, g.OS, g.K, dy, dyb);
  if (IgemmDgradApplies(p)) {  // packs the filter from (F, Cg, K); writes dx in its layout and type
    const Acc* wa = PrepWFwd<In, Acc>(g, w, wb);
    return IgemmDgrad<Acc, Out>(p, dya, wa, dx) ? std::string() : std::string(kOom);
  }
  const Acc* wa = PrepWDgrad<In, Acc>(g, w, wb);
  const int64_t nx = g.N * g.IS * g.C;
  Acc* xa = ResultBuffer<Acc, Out>(g, nx, dx, xb);
  if (!DgradKernel<Acc>(g, pr, dya, wa, xa)) return kOom;
  if (xa != static_cast<void*>(dx)) StoreAct<Acc, Out>(g.cf, g.N, g.IS, g.C, xa, dx);
  return {};
}

template <class In, class Out>
std::string WgradImpl(const ConvParams& p, const In* x, const In* dy, Out* dw) {
  using Acc = std::conditional_t<std::is_same_v<In, double>, double, float>;
  const Geo g = MakeGeo(p);
  std::vector<Prog> pr[3];
  MakeProgs(p, ProgKind::kWgrad, pr);
  ScratchVec<Acc> xb, dyb, wb;
  const Acc* xa = PrepAct<In, Acc>(g.cf, g.N, g.IS, g.C, x, xb);
  const Acc* dya = PrepAct<In, Acc>(g.cf, g.Nb, g.OS, g.K, dy, dyb);
  const int64_t nw = g.F * g.Cg * g.K;
  Acc* wa = ResultBuffer<Acc, Out>(g, nw, dw, wb);
  const bool ok = WgradGemmApplies(p) ? WgradGemm<Acc>(p, xa, dya, wa) : WgradKernel<Acc>(g, pr, xa, dya, wa);
  if (!ok) return kOom;
  if (wa != static_cast<void*>(dw)) {
    if (!g.cf) {
      for (int64_t e = 0; e < nw; ++e) dw[e] = FromAcc<Out, Acc>(wa[e]);
    } else {  // (F, Cg, K) -> (K, Cg, F)
      for (int64_t f = 0; f < g.F; ++f)
        for (int64_t cg = 0; cg < g.Cg; ++cg)
          for (int64_t k = 0; k < g.K; ++k)
            dw[(k * g.Cg + cg) * g.F + f] = FromAcc<Out, Acc>(wa[(f * g.Cg + cg) * g.K + k]);
    }
  }
  return {};
}

// Calls fn(In*, Out*) typed for the (in_t, out_t) pair; out_t is in_t or f32 (f64 only with f64).
template <class Fn>
std::string Dispatch(DType in_t, DType out_t, Fn&& fn) {
  const bool out_in = out_t == in_t;
  const bool out_f32 = out_t == DType::kF32;
  switch (in_t) {
    case DType::kF32:
      if (out_in) return fn(static_cast<float*>(nullptr), static_cast<float*>(nullptr));
      break;
    case DType::kF64:
      if (out_in) return fn(static_cast<double*>(nullptr), static_cast<double*>(nullptr));
      break;
    case DType::kBF16:
      if (out_in) return fn(static_cast<bf16_t*>(nullptr), static_cast<bf16_t*>(nullptr));
      if (out_f32) return fn(static_cast<bf16_t*>(nullptr), static_cast<float*>(nullptr));
      break;
    case DType::kF16:
      if (out_in) return fn(static_cast<f16_t*>(nullptr), static_cast<f16_t*>(nullptr));
      if (out_f32) return fn(static_cast<f16_t*>(nullptr), static_cast<float*>(nullptr));
      break;
  }
  return "jaxconv cpu: unsupported input/output dtype pair";
}

template <class Body>
std::string Guarded(Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return kOom;
  } catch (const std::exception& e) {
    return std::string("jaxconv cpu: ") + e.what();
  } catch (...) {
    return "jaxconv cpu: unknown failure";
  }
}

}  // namespace

int NumThreads() {
  static const int n = [] {
    if (const char* s = std::getenv("JAXCONV_CPU_THREADS")) {
      const long v = std::strtol(s, nullptr, 10);
      if (v >= 1) return static_cast<int>(std::min<long>(v, 256));
    }
    const unsigned hc = std::thread::hardware_concurrency();
    return static_cast<int>(std::clamp<unsigned>(hc, 1u, 64u));
  }();
  return n;
}

std::string ConvFwd(const ConvParams& p, DType in_t, const void* x, const void* w, DType out_t,
                    const void* bias, void* y) {
  return Guarded([&] {
    return Dispatch(in_t, out_t, [&](auto* in_tag, auto* out_tag) -> std::string {
      using In = std::remove_pointer_t<decltype(in_tag)>;
      using Out = std::remove_pointer_t<decltype(out_tag)>;
      return FwdImpl<In, Out>(p, static_cast<const In*>(x), static_cast<const In*>(w),
                              static_cast<const Out*>(bias), static_cast<Out*>(y));
    });
  });
}

std::string ConvDgrad(const ConvParams& p, DType in_t, const void* dy, const void* w, DType out_t, void* dx) {
  return Guarded([&] {
    return Dispatch(in_t, out_t, [&](auto* in_tag, auto* out_tag) -> std::string {
      using In = std::remove_pointer_t<decltype(in_tag)>;
      using Out = std::remove_pointer_t<decltype(out_tag)>;
      return DgradImpl<In, Out>(p, static_cast<const In*>(dy), static_cast<const In*>(w), static_cast<Out*>(dx));
    });
  });
}

std::string ConvWgrad(const ConvParams& p, DType in_t, const void* x, const void* dy, DType out_t, void* dw) {
  return Guarded([&] {
    return Dispatch(in_t, out_t, [&](auto* in_tag, auto* out_tag) -> std::string {
      using In = std::remove_pointer_t<decltype(in_tag)>;
      using Out = std::remove_pointer_t<decltype(out_tag)>;
      return WgradImpl<In, Out>(p, static_cast<const In*>(x), static_cast<const In*>(dy), static_cast<Out*>(dw));
    });
  });
}

}  // namespace cpu
}  // namespace jaxconv
