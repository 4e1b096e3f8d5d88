// The elementwise work of a decoder layer on the CPU, one pass each where eager PyTorch runs
// several ops (and as many dispatches, which dominate a step at small batches): RMSNorm with
// the residual add, rotary embedding with the KV-cache write, SiLU with the multiply. The
// references are app/models/layer_ops.py's TorchLayerOps; arithmetic is fp32.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <tuple>

namespace {

constexpr int64_t ROWS_PER_TASK = 16;  // tokens per parallel_for grain

void check_fp32(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, ": fp32 only");
  TORCH_CHECK(t.stride(-1) == 1, name, ": the last dimension must be contiguous");
}

// h = x + residual (h = x without one) -> (h * rsqrt(mean(h^2) + eps) * weight, h).
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                                                const at::Tensor& weight, double eps) {
  check_fp32(x, "add_rms_norm x");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "add_rms_norm: x [T, hidden] contiguous");
  const int64_t rows = x.size(0), n = x.size(1);
  at::Tensor h = x;
  if (residual.has_value()) {
    TORCH_CHECK(residual->is_contiguous() && residual->sizes() == x.sizes(), "add_rms_norm: residual like x");
    h = at::empty_like(x);
  }
  at::Tensor out = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* rp = residual.has_value() ? residual->data_ptr<float>() : nullptr;
  const float* w = weight.data_ptr<float>();
  float* hp = h.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float epsf = static_cast<float>(eps);
  at::parallel_for(0, rows, ROWS_PER_TASK, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* xr = xp + t * n;
      float* hr = hp + t * n;
      if (rp != nullptr)
        for (int64_t i = 0; i < n; ++i) hr[i] = xr[i] + rp[t * n + i];
      float sum = 0.f;
      for (int64_t i = 0; i < n; ++i) sum += hr[i] * hr[i];
      const float inv = 1.f / std::sqrt(sum / static_cast<float>(n) + epsf);
      float* o = op + t * n;
      for (int64_t i = 0; i < n; ++i) o[i] = w[i] * (hr[i] * inv);
    }
  });
  return {out, h};
}

// Rotate the half-split pairs (i, i + half) of `heads` vectors at src (head stride hs) into
// dst (head stride ds): out1 = x1 cos - x2 sin, out2 = x2 cos + x1 sin (cos/sin halves equal).
inline void rotate(const float* src, int64_t hs, float* dst, int64_t ds, int64_t heads, int64_t half,
                   const float* cos, const float* sin) {
  for (int64_t h = 0; h < heads; ++h) {
    const float* x = src + h * hs;
    float* y = dst + h * ds;
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = x[i], x2 = x[i + half];
      y[i] = x1 * cos[i] - x2 * sin[i];
      y[i + half] = x2 * cos[i + half] + x1 * sin[i + half];
    }
  }
}

// q [T, H, D], k and v [T, KVH, D] (rows may be strided: views of the qkv projection), cos/sin
// [T, D]; kv_cache [2, blocks, block_size, KVH, D] contiguous; slot_mapping [T] int64 (-1:
// padding, nothing written). Returns the rotated q, contiguous; rotated k and v go to the cache.
at::Tensor rotary_write_kv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& kv_cache,
                           const at::Tensor& slot_mapping) {
  for (const auto* t : {&q, &k, &v, &cos, &sin, &kv_cache}) check_fp32(*t, "rotary_write_kv");
  TORCH_CHECK(kv_cache.is_contiguous() && cos.is_contiguous() && sin.is_contiguous() &&
              slot_mapping.scalar_type() == at::kLong, "rotary_write_kv: contiguous cache and cos/sin, int64 slots");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1, "rotary_write_kv: head_dim contiguous");
  const int64_t tokens = q.size(0), heads = q.size(1), kv_heads = k.size(1), dim = q.size(2), half = dim / 2;
  at::Tensor out = at::empty({tokens, heads, dim}, q.options());
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  float* op = out.data_ptr<float>();
  float* k_cache = kv_cache.data_ptr<float>();
  float* v_cache = k_cache + kv_cache.stride(0);
  const int64_t block_size = kv_cache.size(2), block_stride = kv_cache.stride(1), slot_stride = kv_cache.stride(2);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  at::parallel_for(0, tokens, ROWS_PER_TASK, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *c = cp + t * dim, *s = sp + t * dim;
      rotate(qp + t * q.stride(0), q.stride(1), op + t * heads * dim, dim, heads, half, c, s);
      const int64_t slot = slots[t];
      if (slot < 0) continue;
      // int64: block index x block stride overflows int32 in large pools.
      const int64_t base = (slot / block_size) * block_stride + (slot % block_size) * slot_stride;
      rotate(kp + t * k.stride(0), k.stride(1), k_cache + base, dim, kv_heads, half, c, s);
      for (int64_t h = 0; h < kv_heads; ++h) {
        const float* src = vp + t * v.stride(0) + h * v.stride(1);
        float* dst = v_cache + base + h * dim;
        for (int64_t i = 0; i < dim; ++i) dst[i] = src[i];
      }
    }
  });
  return out;
}

// x [T, 2I] -> silu(x[:, :I]) * x[:, I:], [T, I].
at::Tensor silu_and_mul(const at::Tensor& x) {
  check_fp32(x, "silu_and_mul");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "silu_and_mul: x [T, 2I] contiguous");
  const int64_t rows = x.size(0), inner = x.size(1) / 2;
  at::Tensor out = at::empty({rows, inner}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, ROWS_PER_TASK, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *g = xp + t * 2 * inner, *u = g + inner;
      float* o = op + t * inner;
      for (int64_t i = 0; i < inner; ++i) o[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specserve_cpu, m) {
  m.def("add_rms_norm(Tensor x, Tensor? residual, Tensor weight, float eps) -> (Tensor, Tensor)", &add_rms_norm);
  m.def("rotary_write_kv(Tensor q, Tensor k, Tensor v, Tensor cos, Tensor sin, Tensor(a!) kv_cache, "
        "Tensor slot_mapping) -> Tensor", &rotary_write_kv);
  m.def("silu_and_mul(Tensor x) -> Tensor", &silu_and_mul);
}
