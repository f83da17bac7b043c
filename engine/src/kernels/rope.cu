// Rotary embedding. Where the head dimension's halves are whole 16-byte packs and every
// row is aligned, a thread rotates one pack of pairs (i .. i + V - 1 with their partners
// i + Hd/2 ..) in four loads and two stores, and the row's (b, h, t) is decoded once a
// pack in 32-bit arithmetic where the counts allow; otherwise one thread a pair.
//
// Rows are numbered in x's memory order, the dimension of the smallest stride fastest:
// for q and k as the attention makes them ([B, T, H, Hd] memory under a [B, H, T, Hd]
// view) a warp's rows are the heads of one token, side by side in memory, and share
// their cos and sin rows (one load for the warp); numbered t fastest, each warp read
// eight tokens' rows of cos and sin, twice the bytes of x itself.
#include <algorithm>
#include <climits>

#include "cuda_common.cuh"

namespace tide::kernels {
namespace {

constexpr int kThreads = 256;

// Forward: (a, b) -> (a c_i - b s_i, b c_j + a s_j) for i < half, j = i + half; inverse
// (the transpose, for backward): (a c_i + b s_j, b c_j - a s_i).
template <typename T>
__device__ __forceinline__ void rotate(T a, T b, T ci, T cj, T si, T sj, bool inverse, T& ya, T& yb) {
  const float av = to_float(a), bv = to_float(b);
  if (!inverse) {
    ya = from_float<T>(av * to_float(ci) - bv * to_float(si));
    yb = from_float<T>(bv * to_float(cj) + av * to_float(sj));
  } else {
    ya = from_float<T>(av * to_float(ci) + bv * to_float(sj));
    yb = from_float<T>(bv * to_float(cj) - av * to_float(si));
  }
}

// B, H and T in x's memory order: dims[0] outermost (the largest stride), dims[2] fastest.
struct RowOrder {
  int64_t count[3];
  int64_t x_stride[3], y_stride[3];
  int t_dim;  // which of the three is T (cos and sin are per token)
  int64_t head_dim;
};

RowOrder row_order(const RopeShape& s) {
  const int64_t count[3] = {s.batch, s.heads, s.tokens};
  int dims[3] = {0, 1, 2};
  // Stable: dimensions of equal stride keep B, H, T's order.
  std::stable_sort(dims, dims + 3, [&](int a, int b) { return s.x_stride[a] > s.x_stride[b]; });
  RowOrder o{};
  for (int k = 0; k < 3; ++k) {
    o.count[k] = count[dims[k]];
    o.x_stride[k] = s.x_stride[dims[k]];
    o.y_stride[k] = s.y_stride[dims[k]];
    if (dims[k] == 2) o.t_dim = k;
  }
  o.head_dim = s.head_dim;
  return o;
}

// Row r (in RowOrder's numbering) and the offsets of its x and y rows.
template <typename I>
struct Row {
  I t, x, y;
};

template <typename I>
__device__ __forceinline__ Row<I> row_of(I r, const RowOrder& o) {
  const I c1 = static_cast<I>(o.count[1]), c2 = static_cast<I>(o.count[2]);
  const I i2 = r % c2;
  const I rest = r / c2;
  const I i1 = rest % c1, i0 = rest / c1;
  const I t = o.t_dim == 0 ? i0 : (o.t_dim == 1 ? i1 : i2);
  return {t, static_cast<I>(i0 * o.x_stride[0] + i1 * o.x_stride[1] + i2 * o.x_stride[2]),
          static_cast<I>(i0 * o.y_stride[0] + i1 * o.y_stride[1] + i2 * o.y_stride[2])};
}

template <typename T>
__global__ void rope_kernel(const T* __restrict__ x, const T* __restrict__ cos, const T* __restrict__ sin,
                            T* __restrict__ y, RowOrder s, bool inverse) {
  const int64_t half = s.head_dim / 2;
  const int64_t pairs = s.count[0] * s.count[1] * s.count[2] * half;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = p % half;
    const Row<int64_t> r = row_of<int64_t>(p / half, s);
    const T* xr = x + r.x;
    T* yr = y + r.y;
    const T* cr = cos + r.t * s.head_dim;
    const T* sr = sin + r.t * s.head_dim;
    rotate(xr[i], xr[i + half], cr[i], cr[i + half], sr[i], sr[i + half], inverse, yr[i], yr[i + half]);
  }
}

// I: the index type, 32-bit where every offset fits (integer division is several
// times cheaper there).
template <typename T, typename I>
__global__ void rope_packed(const T* __restrict__ x, const T* __restrict__ cos, const T* __restrict__ sin,
                            T* __restrict__ y, RowOrder s, bool inverse, I packs) {
  constexpr int V = Pack<T>::kSize;
  const I half = static_cast<I>(s.head_dim / 2), per_row = half / V;
  // The loop's count in 64 bits (p + stride may pass INT_MAX), the decoding in I.
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < packs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const I q = static_cast<I>(p);
    const I i = (q % per_row) * V;
    const Row<I> r = row_of<I>(q / per_row, s);
    const T* xr = x + r.x;
    T* yr = y + r.y;
    const T* cr = cos + r.t * static_cast<I>(s.head_dim);
    const T* sr = sin + r.t * static_cast<I>(s.head_dim);
    const Pack<T> a = load_pack(xr + i), b = load_pack(xr + i + half);
    const Pack<T> ci = load_pack(cr + i), cj = load_pack(cr + i + half);
    const Pack<T> si = load_pack(sr + i), sj = load_pack(sr + i + half);
    Pack<T> ya, yb;
#pragma unroll
    for (int k = 0; k < V; ++k) rotate(a.v[k], b.v[k], ci.v[k], cj.v[k], si.v[k], sj.v[k], inverse, ya.v[k], yb.v[k]);
    store_pack(yr + i, ya);
    store_pack(yr + i + half, yb);
  }
}

// The largest offset of any element of x or y, and of the packs' count.
int64_t largest_offset(const RowOrder& s) {
  int64_t x = 0, y = 0;
  for (int d = 0; d < 3; ++d) {
    x += (s.count[d] - 1) * s.x_stride[d];
    y += (s.count[d] - 1) * s.y_stride[d];
  }
  return (x > y ? x : y) + s.head_dim;
}

}  // namespace

void rope(const void* x, const void* cos, const void* sin, void* y, const RopeShape& shape, bool inverse, Element e,
          cudaStream_t stream) {
  const int64_t half = shape.head_dim / 2;
  const int64_t rows = shape.batch * shape.heads * shape.tokens;
  if (rows * half == 0) return;
  with_element(e, [&](auto t) {
    using T = decltype(t);
    constexpr int V = Pack<T>::kSize;
    const auto* xs = static_cast<const T*>(x);
    const auto* c = static_cast<const T*>(cos);
    const auto* s = static_cast<const T*>(sin);
    auto* ys = static_cast<T*>(y);
    bool packed = half % V == 0 && packable({x, cos, sin, y});
    for (int d = 0; d < 3; ++d) packed = packed && shape.x_stride[d] % V == 0 && shape.y_stride[d] % V == 0;
    const RowOrder order = row_order(shape);
    if (!packed) {
      launch(rope_kernel<T>, grid_for(rows * half, kThreads), kThreads, 0, stream, xs, c, s, ys, order, inverse);
      return;
    }
    const int64_t packs = rows * (half / V);
    const int64_t largest = std::max({packs, largest_offset(order), shape.tokens * shape.head_dim});
    if (largest < INT_MAX)
      launch(rope_packed<T, int>, grid_for(packs, kThreads), kThreads, 0, stream, xs, c, s, ys, order, inverse,
             static_cast<int>(packs));
    else
      launch(rope_packed<T, int64_t>, grid_for(packs, kThreads), kThreads, 0, stream, xs, c, s, ys, order, inverse,
             packs);
  });
  check_launch("rope");
}

}  // namespace tide::kernels
