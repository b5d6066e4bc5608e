// implicit_gemm.im2col_chunked: first layers (im2col.cuh) as 1x1 problems on their unrolled window. The window is
// unrolled into cols (M, cr): M output pixels, cr = taps*c rounded up to the alignment, columns in the filter's own
// HWIO row order (t, r, s, c). The convolution then is a 1x1 problem on cols, which the family's GEMM variants run
// (InnerOf: the Hopper GEMMs for 16-bit operands, else the conv kernels, 3xTF32 included):
//   fwd    y     = act(cols(x) @ w' + bias)
//   dgrad  dcols = dy @ w'^T, then dx = col2im(dcols): a gather, each dx element sums its own taps (no atomics)
//   wgrad  dw'   = cols(x)^T @ dy
// w' is the (cr, K) filter matrix: the HWIO filter's (taps*c, K) rows, plus zero rows up to cr.
// cols is built in chunks of whole images: the workspace stays bounded and a chunk is still in L2 when its GEMM
// reads it. wgrad sums the chunks' f32 partial filters in chunk order (deterministic).
#include <algorithm>
#include <string>

#include "dispatch/registry.h"
#include "dispatch/variant.h"
#include "kernels/implicit_gemm/family.h"
#include "kernels/implicit_gemm/im2col.cuh"

namespace jaxconv {
namespace cuda {
namespace {

constexpr size_t kChunkBytes = size_t(32) << 20;  // cols per chunk: about two thirds of an H100's L2

// The 1x1 problem of `images` images: x = cols (images, out spatial, cr), y = the conv's own y.
ConvParams OneByOne(const ConvParams& p, Op op, int64_t images, int64_t cr) {
  ConvParams q = p;
  q.layout[0] = kChannelsLast;
  q.n[0] = images;
  q.c[0] = cr;
  q.groups[0] = q.batch_groups[0] = 1;
  for (int d = 0; d < 3; ++d) {
    q.in[d] = p.out[d];
    q.win[d] = q.stride[d] = q.lhs_dil[d] = q.rhs_dil[d] = 1;
    q.pad_lo[d] = q.pad_hi[d] = 0;
  }
  if (op != Op::kFwd) q.activation[0] = kActNone, q.has_bias[0] = 0;
  q.poison[0] = 0;
  return q;
}

// The 1x1 problem as the family's GEMM variants see it: its filter gradient is float32 (the chunks' partial sums),
// its data gradient (dcols) in the operand type.
Problem OneByOneProblem(const Problem& pr, int64_t images, int64_t cr) {
  Problem q = pr;
  q.p = OneByOne(pr.p, pr.op, images, cr);
  q.out = pr.op == Op::kWgrad ? DType::kF32 : pr.op == Op::kDgrad ? pr.in : pr.out;
  return q;
}

// The GEMM variant that runs a chunk's 1x1 problem: the first in the family's order that takes it, as the tensor-core
// route ran it on its own (the first-layer variants never take one tap). The request implicit_gemm_sm80 keeps it on
// the mma.sync kernels.
enum class Inner { kNone, kGemm1x1, kFlipped, kPhased, kSwapped, kSm90, kSm80 };

bool HopperAllowed(const Problem& pr) { return RequestName(pr.p.algorithm[0]) != "implicit_gemm_sm80"; }

Inner InnerOf(const Problem& q, bool hopper) {
  namespace v = variants;
  if (hopper && v::implicit_gemm_gemm1x1_sm90::PlanError(q).empty()) return Inner::kGemm1x1;
  if (hopper && q.op == Op::kDgrad && v::implicit_gemm_flipped_dgrad_sm90::PlanError(q).empty()) return Inner::kFlipped;
  if (hopper && q.op == Op::kDgrad && v::implicit_gemm_phased_dgrad_sm90::PlanError(q).empty()) return Inner::kPhased;
  if (hopper && q.op == Op::kWgrad && v::implicit_gemm_swapped_wgrad_sm90::PlanError(q).empty()) return Inner::kSwapped;
  if (hopper && v::implicit_gemm_sm90::PlanError(q).empty() && v::implicit_gemm_sm90::Sm90Preferred(q)) {
    return Inner::kSm90;
  }
  if (v::implicit_gemm_sm80::PlanError(q).empty()) return Inner::kSm80;
  return Inner::kNone;
}

size_t InnerWorkspace(Inner kind, const Problem& q) {
  namespace v = variants;
  switch (kind) {
    case Inner::kGemm1x1: return v::implicit_gemm_gemm1x1_sm90::Workspace(q);
    case Inner::kFlipped: return v::implicit_gemm_flipped_dgrad_sm90::Workspace(q);
    case Inner::kPhased: return v::implicit_gemm_phased_dgrad_sm90::Workspace(q);
    case Inner::kSwapped: return v::implicit_gemm_swapped_wgrad_sm90::Workspace(q);
    case Inner::kSm90: return v::implicit_gemm_sm90::Workspace(q);
    case Inner::kSm80: return v::implicit_gemm_sm80::Workspace(q);
    default: return 0;
  }
}

cudaError_t InnerLaunch(Inner kind, const Problem& q, const Buffers& b, cudaStream_t s) {
  namespace v = variants;
  switch (kind) {
    case Inner::kGemm1x1: return v::implicit_gemm_gemm1x1_sm90::Launch(q, b, s);
    case Inner::kFlipped: return v::implicit_gemm_flipped_dgrad_sm90::Launch(q, b, s);
    case Inner::kPhased: return v::implicit_gemm_phased_dgrad_sm90::Launch(q, b, s);
    case Inner::kSwapped: return v::implicit_gemm_swapped_wgrad_sm90::Launch(q, b, s);
    case Inner::kSm90: return v::implicit_gemm_sm90::Launch(q, b, s);
    case Inner::kSm80: return v::implicit_gemm_sm80::Launch(q, b, s);
    default: return cudaErrorNotSupported;
  }
}

// Workspace: [fwd/dgrad: the padded filter w'][wgrad: the chunks' f32 partial filters][one chunk of cols][the GEMM's].
struct Plan {
  int64_t rows = 0;       // taps * c: the filter matrix's real rows
  int64_t cr = 0;         // rows rounded up to the alignment: the 1x1 problem's input channels
  int64_t pixels = 0;     // output pixels per image
  int64_t images = 0;     // images per chunk (the last chunk may have fewer)
  int64_t chunks = 0;
  size_t filter = 0;      // fwd/dgrad: the padded filter w' (0 when rows == cr: w is used in place)
  size_t slices = 0;      // wgrad: the chunks' f32 partial filters
  size_t cols = 0;        // one chunk of cols (dgrad: dcols)
  size_t gemm = 0;        // the 1x1 GEMM's own workspace (the larger of a full and the last chunk's)
  Inner full = Inner::kNone, last = Inner::kNone;  // the GEMM of a full chunk and of the last one
  size_t bytes() const { return filter + slices + cols + gemm; }
};

Plan MakePlan(const Problem& pr) {
  const ConvParams& p = pr.p;
  const Op op = pr.op;
  const DType in = pr.in;
  Plan pl;
  const int64_t align = ImplicitGemmAlign(in);
  pl.rows = SpatialCount(p.win) * p.c[0];
  pl.cr = (pl.rows + align - 1) / align * align;
  pl.pixels = SpatialCount(p.out);
  const size_t image_cols = static_cast<size_t>(pl.pixels * pl.cr) * ElemBytes(in);
  const int64_t image_x = SpatialCount(p.in) * p.c[0];  // per image; a chunk's x and dx stay below 2^31
  pl.images = std::max<int64_t>(
      1, std::min({p.n[0], static_cast<int64_t>(kChunkBytes / image_cols), kMaxIndex / image_x}));
  pl.chunks = CeilDiv(p.n[0], pl.images);
  const int64_t last = p.n[0] - (pl.chunks - 1) * pl.images;
  const int64_t kk = p.k[0];
  if (op != Op::kWgrad && pl.cr != pl.rows) pl.filter = AlignUp(static_cast<size_t>(pl.cr * kk) * ElemBytes(in));
  // Chunk i writes its (cr, K) partial filter at slice i * rows * K; the cr - rows padding rows' sums (not
  // needed) spill into slice i + 1, which chunk i + 1 then overwrites (the GEMMs run in stream order).
  if (op == Op::kWgrad) pl.slices = AlignUp(static_cast<size_t>(((pl.chunks - 1) * pl.rows + pl.cr) * kk) * 4);
  pl.cols = AlignUp(image_cols * static_cast<size_t>(pl.images));
  const bool hopper = HopperAllowed(pr);
  const Problem qf = OneByOneProblem(pr, pl.images, pl.cr), ql = OneByOneProblem(pr, last, pl.cr);
  pl.full = InnerOf(qf, hopper);
  pl.last = InnerOf(ql, hopper);
  pl.gemm = std::max(InnerWorkspace(pl.full, qf), InnerWorkspace(pl.last, ql));
  return pl;
}

// Stages in shared memory the input patch that the taps of output row `row` (n, z, p over the images x starts
// at), pixels q0 .. q0 + qt - 1, read: win0*win1 rows of wt columns of c channels, zeros outside the image.
// Patch row tr = (t, r) is the contiguous run of wt * c elements of x row (d, h) from column w_lo on; the
// elements outside [0, W * c) of that row are padding (ncu: per-element divisions here had made the unroll
// kernel issue-bound). The caller synchronises before and after.
template <class E>
__device__ __forceinline__ void StagePatch(const Geometry& g, const E* __restrict__ x, int row, int q0,
                                           E* __restrict__ patch) {
  const int pp = row % g.out[1], zq = row / g.out[1];
  const int z = zq % g.out[0], n = zq / g.out[0];
  const E* xn = x + static_cast<int64_t>(n) * g.in[0] * g.in[1] * g.in[2] * g.c;
  const int w_lo = q0 * g.stride[2] - g.pad_lo[2], span = g.wt * g.c;
  const int e_lo = max(0, -w_lo * g.c), e_hi = min(span, (g.in[2] - w_lo) * g.c);
  for (int tr = 0; tr < g.win0 * g.win1; ++tr) {
    const int t = tr / g.win1, r = tr - t * g.win1;
    const int d = z * g.stride[0] - g.pad_lo[0] + t * g.dil[0], h = pp * g.stride[1] - g.pad_lo[1] + r * g.dil[1];
    const bool row_ok = static_cast<unsigned>(d) < static_cast<unsigned>(g.in[0]) &&
                        static_cast<unsigned>(h) < static_cast<unsigned>(g.in[1]);
    const E* src = row_ok ? xn + (static_cast<int64_t>(d) * g.in[1] + h) * g.in[2] * g.c + int64_t(w_lo) * g.c : xn;
    E* dst_row = patch + tr * span;
    for (int e = threadIdx.x; e < span; e += blockDim.x) dst_row[e] = row_ok && e >= e_lo && e < e_hi ? src[e] : E{};
  }
}

// cols[m, j] for the output rows (n, z, p) of `row_count` whole-image rows (x points at the chunk's first image).
// A block takes qt consecutive pixels of one output row: it stages their input patch (StagePatch), then writes
// their cols rows as 16-byte words of V columns (cr % V == 0), column j reading patch[table[j] + pixel * stride
// * c]. E moves the elements as bits.
template <class E>
__global__ void __launch_bounds__(256) Im2colKernel(const Geometry g, const E* __restrict__ x, E* __restrict__ cols,
                                                    int row_count) {
  constexpr int V = 16 / sizeof(E);
  extern __shared__ int4 smem4[];
  int* table = reinterpret_cast<int*>(smem4);
  E* patch = reinterpret_cast<E*>(table + ((g.rows + 3) / 4 * 4));
  for (int j = threadIdx.x; j < g.rows; j += blockDim.x) table[j] = PatchOffset(g, j);
  const int segs = (g.out[2] + g.qt - 1) / g.qt, groups = g.cr / V;
  for (int b = blockIdx.x; b < row_count * segs; b += gridDim.x) {
    const int row = b / segs, q0 = (b - row * segs) * g.qt, qn = min(g.qt, g.out[2] - q0);
    __syncthreads();  // the table is written; the previous tile's readers are done with the patch
    StagePatch(g, x, row, q0, patch);
    __syncthreads();
    uint4* dst = reinterpret_cast<uint4*>(cols + (static_cast<int64_t>(row) * g.out[2] + q0) * g.cr);
    for (int k = threadIdx.x; k < qn * groups; k += blockDim.x) {
      const int ml = k / groups, j0 = (k - ml * groups) * V, shift = ml * g.stride[2] * g.c;
      union {
        uint4 v;
        E e[V];
      } word;
#pragma unroll
      for (int i = 0; i < V; ++i) word.e[i] = j0 + i < g.rows ? patch[table[j0 + i] + shift] : E{};
      dst[k] = word.v;
    }
  }
}

// dx[n, d, h, w, :] = sum over the taps (t, r, s) that reach (d, h, w) from an output pixel (z, p, q) of
// dcols[n, z, p, q, (t, r, s, :)], for `count` input pixels of whole images; one thread per pixel, all c < 8
// channels (contiguous dcols reads per tap), f32 sums in tap order.
template <class T>
__global__ void __launch_bounds__(256) Col2imKernel(const Geometry g, const T* __restrict__ dcols,
                                                    T* __restrict__ dx, int count) {
  constexpr int kMaxC = 8;
  for (int m = blockIdx.x * blockDim.x + threadIdx.x; m < count; m += gridDim.x * blockDim.x) {
    const int w = m % g.in[2], hq = m / g.in[2];
    const int h = hq % g.in[1], dq = hq / g.in[1];
    const int d = dq % g.in[0], n = dq / g.in[0];
    const T* dn = dcols + static_cast<int64_t>(n) * g.out[0] * g.out[1] * g.out[2] * g.cr;
    float acc[kMaxC];
#pragma unroll
    for (int ch = 0; ch < kMaxC; ++ch) acc[ch] = 0.f;
    for (int t = 0; t < g.win0; ++t) {
      const int zz = d + g.pad_lo[0] - t * g.dil[0];
      if (zz < 0) break;
      const int z = zz / g.stride[0];
      if (z * g.stride[0] != zz || z >= g.out[0]) continue;
      for (int r = 0; r < g.win1; ++r) {
        const int pp = h + g.pad_lo[1] - r * g.dil[1];
        if (pp < 0) break;
        const int p = pp / g.stride[1];
        if (p * g.stride[1] != pp || p >= g.out[1]) continue;
        for (int s = 0; s < g.win2; ++s) {
          const int qq = w + g.pad_lo[2] - s * g.dil[2];
          if (qq < 0) break;
          const int q = qq / g.stride[2];
          if (q * g.stride[2] != qq || q >= g.out[2]) continue;
          const T* src = dn + static_cast<int64_t>((z * g.out[1] + p) * g.out[2] + q) * g.cr +
                         ((t * g.win1 + r) * g.win2 + s) * g.c;
#pragma unroll
          for (int ch = 0; ch < kMaxC; ++ch) {
            if (ch < g.c) acc[ch] += ToAcc(src[ch]);
          }
        }
      }
    }
    T* dst = dx + static_cast<int64_t>(m) * g.c;
#pragma unroll
    for (int ch = 0; ch < kMaxC; ++ch) {
      if (ch < g.c) dst[ch] = FromAcc<T>(acc[ch]);
    }
  }
}

unsigned Blocks(int64_t work) { return GridX(std::min<int64_t>(CeilDiv(work, 256), kPlanSms * 16)); }

// row_count: output rows (n, z, p) of the chunk.
cudaError_t Im2col(DType in, const Geometry& g, const void* x, void* cols, int row_count, cudaStream_t s) {
  const int64_t tiles = static_cast<int64_t>(row_count) * CeilDiv(g.out[2], g.qt);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, kPlanSms * 8));
  const size_t smem = static_cast<size_t>(TableInts(g.rows)) * 4 +
                      static_cast<size_t>(g.win0 * g.win1 * g.wt * g.c) * ElemBytes(in);
  if (in == DType::kF32) {
    Im2colKernel<uint32_t><<<grid, 256, smem, s>>>(g, static_cast<const uint32_t*>(x), static_cast<uint32_t*>(cols),
                                                   row_count);
  } else {
    Im2colKernel<uint16_t><<<grid, 256, smem, s>>>(g, static_cast<const uint16_t*>(x), static_cast<uint16_t*>(cols),
                                                   row_count);
  }
  return cudaGetLastError();
}

cudaError_t Col2im(DType in, const Geometry& g, const void* dcols, void* dx, int count, cudaStream_t s) {
  const unsigned grid = Blocks(count);
  switch (in) {
    case DType::kF32:
      Col2imKernel<float><<<grid, 256, 0, s>>>(g, static_cast<const float*>(dcols), static_cast<float*>(dx), count);
      break;
    case DType::kBF16:
      Col2imKernel<__nv_bfloat16><<<grid, 256, 0, s>>>(g, static_cast<const __nv_bfloat16*>(dcols),
                                                       static_cast<__nv_bfloat16*>(dx), count);
      break;
    default:
      Col2imKernel<__half><<<grid, 256, 0, s>>>(g, static_cast<const __half*>(dcols), static_cast<__half*>(dx),
                                                count);
  }
  return cudaGetLastError();
}

}  // namespace
}  // namespace cuda

namespace variants::implicit_gemm_im2col_chunked {

std::string Applies(const Problem& pr) {
  if (std::string why = cuda::Im2colError(pr); !why.empty()) return why;
  const cuda::Plan pl = cuda::MakePlan(pr);
  if (pl.full == cuda::Inner::kNone || pl.last == cuda::Inner::kNone) {
    return "no GEMM variant of the family takes its 1x1 problem on this device";
  }
  return {};
}

size_t Workspace(const Problem& pr) { return cuda::MakePlan(pr).bytes(); }

cudaError_t Launch(const Problem& pr, const Buffers& b, cudaStream_t s) {
  const ConvParams& p = pr.p;
  const Op op = pr.op;
  const DType in = pr.in;
  const cuda::Plan pl = cuda::MakePlan(pr);
  if (b.ws == nullptr || b.ws_bytes < pl.bytes()) return cudaErrorInvalidValue;
  char* filter = static_cast<char*>(b.ws);
  float* slices = reinterpret_cast<float*>(filter + pl.filter);
  char* cols = filter + pl.filter + pl.slices;
  char* gemm_ws = cols + pl.cols;
  const size_t eb = cuda::ElemBytes(in);
  const int64_t kk = p.k[0], in_pixels = SpatialCount(p.in);
  const cuda::Geometry g = cuda::GeometryOf(p, in);
  cudaError_t e = cudaSuccess;
  const void* wmat = b.b;  // fwd/dgrad: the (cr, K) filter matrix
  if (pl.filter > 0) {
    const size_t real = static_cast<size_t>(pl.rows * kk) * eb;
    if ((e = cudaMemcpyAsync(filter, b.b, real, cudaMemcpyDeviceToDevice, s)) != cudaSuccess) return e;
    if ((e = cudaMemsetAsync(filter + real, 0, static_cast<size_t>((pl.cr - pl.rows) * kk) * eb, s)) != cudaSuccess) {
      return e;
    }
    wmat = filter;
  }
  for (int64_t i = 0; i < pl.chunks; ++i) {
    const int64_t n0 = i * pl.images, images = std::min(pl.images, p.n[0] - n0);
    const Problem q = cuda::OneByOneProblem(pr, images, pl.cr);
    const cuda::Inner inner = images == pl.images ? pl.full : pl.last;
    const char* x = static_cast<const char*>(b.a) + static_cast<size_t>(n0 * in_pixels * p.c[0]) * eb;
    const char* dy = static_cast<const char*>(op == Op::kDgrad ? b.a : b.b) +
                     static_cast<size_t>(n0 * pl.pixels * kk) * eb;
    Buffers gb;
    gb.ws = gemm_ws;
    gb.ws_bytes = pl.gemm;
    switch (op) {
      case Op::kFwd: {
        const int rows = static_cast<int>(images * p.out[0] * p.out[1]);
        if ((e = cuda::Im2col(in, g, x, cols, rows, s)) != cudaSuccess) return e;
        gb.a = cols;
        gb.b = wmat;
        gb.bias = b.bias;
        gb.out = static_cast<char*>(b.out) + static_cast<size_t>(n0 * pl.pixels * kk) * eb;
        e = cuda::InnerLaunch(inner, q, gb, s);
        break;
      }
      case Op::kDgrad: {
        gb.a = dy;
        gb.b = wmat;
        gb.out = cols;
        if ((e = cuda::InnerLaunch(inner, q, gb, s)) != cudaSuccess) return e;
        char* dx = static_cast<char*>(b.out) + static_cast<size_t>(n0 * in_pixels * p.c[0]) * eb;
        e = cuda::Col2im(in, g, cols, dx, static_cast<int>(images * in_pixels), s);
        break;
      }
      default: {
        const int rows = static_cast<int>(images * p.out[0] * p.out[1]);
        if ((e = cuda::Im2col(in, g, x, cols, rows, s)) != cudaSuccess) return e;
        gb.a = cols;
        gb.b = dy;
        gb.out = slices + i * pl.rows * kk;
        e = cuda::InnerLaunch(inner, q, gb, s);
      }
    }
    if (e != cudaSuccess) return e;
  }
  if (op != Op::kWgrad) return cudaSuccess;
  return cuda::ReduceSplits(in, pr.out, slices, pl.chunks, pl.rows * kk, b.out, s);  // fixed chunk order
}

}  // namespace variants::implicit_gemm_im2col_chunked
}  // namespace jaxconv
