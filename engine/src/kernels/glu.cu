// A gated MLP's elementwise part, act(gate) * up (SwiGLU: silu; GeGLU: gelu's tanh form), forward and backward,
// grid-stride over the elements: 16 bytes a thread at a time where every pointer is aligned and the count divides, one
// element at a time otherwise.
#include "cuda_common.cuh"

namespace tide::kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + __expf(-v)); }

// silu(g) = g s with s = sigmoid(g); silu'(g) = s (1 + g (1 - s)).
struct Silu {
  __device__ __forceinline__ static float value(float g) { return g * sigmoid(g); }
  __device__ __forceinline__ static void value_and_slope(float g, float& value, float& slope) {
    const float s = sigmoid(g);
    value = g * s;
    slope = s * (1.0f + g * (1.0f - s));
  }
};

// gelu(g) = g (1 + t) / 2 with t = tanh(b (g + k g^3)), b = sqrt(2 / pi), k = 0.044715
// (PyTorch's approximate = "tanh"); gelu'(g) = (1 + t) / 2 + g (1 - t^2) b (1 + 3 k g^2) / 2.
struct GeluTanh {
  static constexpr float kBeta = 0.7978845608028654f, kKappa = 0.044715f;
  __device__ __forceinline__ static float value(float g) {
    return 0.5f * g * (1.0f + tanhf(kBeta * (g + kKappa * g * g * g)));
  }
  __device__ __forceinline__ static void value_and_slope(float g, float& value, float& slope) {
    const float t = tanhf(kBeta * (g + kKappa * g * g * g));
    value = 0.5f * g * (1.0f + t);
    slope = 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * kBeta * (1.0f + 3.0f * kKappa * g * g);
  }
};

template <typename A, typename T>
__device__ __forceinline__ T glu(T gate, T up) {
  return from_float<T>(A::value(to_float(gate)) * to_float(up));
}

template <typename A, typename T>
__device__ __forceinline__ void glu_grad(T d_out, T gate, T up, T& d_gate, T& d_up) {
  const float g = to_float(gate), u = to_float(up), d = to_float(d_out);
  float a, slope;
  A::value_and_slope(g, a, slope);
  d_gate = from_float<T>(d * u * slope);
  d_up = from_float<T>(d * a);
}

__device__ __forceinline__ int64_t first_index() { return blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; }
__device__ __forceinline__ int64_t index_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

template <typename A, typename T>
__global__ void glu_forward_kernel(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ out,
                                   int64_t n) {
  for (int64_t i = first_index(); i < n; i += index_stride()) out[i] = glu<A>(gate[i], up[i]);
}

template <typename A, typename T>
__global__ void glu_forward_packed(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ out,
                                   int64_t packs) {
  constexpr int V = Pack<T>::kSize;
  for (int64_t i = first_index(); i < packs; i += index_stride()) {
    const Pack<T> g = load_pack(gate + i * V), u = load_pack(up + i * V);
    Pack<T> o;
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = glu<A>(g.v[k], u.v[k]);
    store_pack(out + i * V, o);
  }
}

// d_gate may be d_out (each element read before it is written); product, where given,
// receives act(gate) * up as the forward made it.
template <typename A, typename T>
__global__ void glu_backward_kernel(const T* d_out, const T* __restrict__ gate, const T* __restrict__ up, T* d_gate,
                                    T* __restrict__ d_up, T* __restrict__ product, int64_t n) {
  for (int64_t i = first_index(); i < n; i += index_stride()) {
    const T g = gate[i], u = up[i];
    if (product) product[i] = glu<A>(g, u);
    glu_grad<A>(d_out[i], g, u, d_gate[i], d_up[i]);
  }
}

template <typename A, typename T>
__global__ void glu_backward_packed(const T* d_out, const T* __restrict__ gate, const T* __restrict__ up, T* d_gate,
                                    T* __restrict__ d_up, T* __restrict__ product, int64_t packs) {
  constexpr int V = Pack<T>::kSize;
  for (int64_t i = first_index(); i < packs; i += index_stride()) {
    const Pack<T> d = load_pack(d_out + i * V), g = load_pack(gate + i * V), u = load_pack(up + i * V);
    Pack<T> dg, du;
#pragma unroll
    for (int k = 0; k < V; ++k) glu_grad<A>(d.v[k], g.v[k], u.v[k], dg.v[k], du.v[k]);
    store_pack(d_gate + i * V, dg);
    store_pack(d_up + i * V, du);
    if (product) {
      Pack<T> p;
#pragma unroll
      for (int k = 0; k < V; ++k) p.v[k] = glu<A>(g.v[k], u.v[k]);
      store_pack(product + i * V, p);
    }
  }
}

template <typename F>
void with_gate(Gate gate, F&& f) {
  if (gate == Gate::GeluTanh)
    f(GeluTanh{});
  else
    f(Silu{});
}

}  // namespace

void glu_forward(Gate act, const void* gate, const void* up, void* out, int64_t n, Element e, cudaStream_t stream) {
  if (n == 0) return;
  with_gate(act, [&](auto a) {
    using A = decltype(a);
    with_element(e, [&](auto t) {
      using T = decltype(t);
      const auto* g = static_cast<const T*>(gate);
      const auto* u = static_cast<const T*>(up);
      auto* o = static_cast<T*>(out);
      constexpr int V = Pack<T>::kSize;
      if (n % V == 0 && packable({gate, up, out}))
        launch(glu_forward_packed<A, T>, grid_for(n / V, kThreads), kThreads, 0, stream, g, u, o, n / V);
      else
        launch(glu_forward_kernel<A, T>, grid_for(n, kThreads), kThreads, 0, stream, g, u, o, n);
    });
  });
  check_launch("glu_forward");
}

void glu_backward(Gate act, const void* d_out, const void* gate, const void* up, void* d_gate, void* d_up,
                  void* product, int64_t n, Element e, cudaStream_t stream) {
  if (n == 0) return;
  with_gate(act, [&](auto a) {
    using A = decltype(a);
    with_element(e, [&](auto t) {
      using T = decltype(t);
      const auto* d = static_cast<const T*>(d_out);
      const auto* g = static_cast<const T*>(gate);
      const auto* u = static_cast<const T*>(up);
      auto* dg = static_cast<T*>(d_gate);
      auto* du = static_cast<T*>(d_up);
      auto* p = static_cast<T*>(product);
      constexpr int V = Pack<T>::kSize;
      if (n % V == 0 && packable({d_out, gate, up, d_gate, d_up}) && (!product || packable({product})))
        launch(glu_backward_packed<A, T>, grid_for(n / V, kThreads), kThreads, 0, stream, d, g, u, dg, du, p, n / V);
      else
        launch(glu_backward_kernel<A, T>, grid_for(n, kThreads), kThreads, 0, stream, d, g, u, dg, du, p, n);
    });
  });
  check_launch("glu_backward");
}

}  // namespace tide::kernels
