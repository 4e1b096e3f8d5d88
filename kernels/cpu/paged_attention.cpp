// Attention of a few query tokens per sequence (decode: 1; speculative verification: 1 + k)
// against the paged KV cache on the CPU, reading each sequence's keys and values in place
// through its block table: no gathered copy of the cache, one pass over it per layer.
//
// Work item = a sequence (or a range of its KV heads, when there are few sequences): each
// query token times each query head is a row; keys are walked a cache block at a time with an
// online softmax (running max and sum per row), so memory does not grow with the context.
// Query token i of a sequence with q_len tokens and seq_len keys sits at position
// seq_len - q_len + i and sees keys 0 ..= that position. Arithmetic is fp32 throughout.
//
// Built with -ffast-math (for the vectorised exp), which assumes no infinities: a masked score
// is a large finite negative instead, and exp(MASKED - max) is exactly 0.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

constexpr float MASKED = -1e30f;
constexpr int64_t MAX_BLOCK = 256;  // keys per cache block this kernel handles

struct Shapes {
  int64_t heads, kv_heads, group, block_size, table_width;
  int64_t block_stride, slot_stride, head_stride;  // cache strides, in floats
};

template <int64_t D>
inline float dot(const float* __restrict a, const float* __restrict b, int64_t dim) {
  const int64_t n = D > 0 ? D : dim;
  float sum = 0.f;
  for (int64_t d = 0; d < n; ++d) sum += a[d] * b[d];  // reassociated into lanes (-ffast-math)
  return sum;
}

template <int64_t D>
inline void scale_add(float* __restrict y, float a, const float* __restrict x, int64_t dim) {
  const int64_t n = D > 0 ? D : dim;
  for (int64_t d = 0; d < n; ++d) y[d] += a * x[d];
}

template <int64_t D>
inline void scale(float* __restrict y, float a, int64_t dim) {
  const int64_t n = D > 0 ? D : dim;
  for (int64_t d = 0; d < n; ++d) y[d] *= a;
}

// exp(x - max) in place over n scores; returns their sum. A loop gcc vectorises with libmvec.
inline float exp_sum(float* __restrict x, float max, int64_t n) {
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) {
    x[j] = std::exp(x[j] - max);
    sum += x[j];
  }
  return sum;
}

// Per-thread scratch, reused across items.
struct Scratch {
  std::vector<const float*> q;
  std::vector<float*> o;
  std::vector<float> scores, acc, row_max, row_sum;
  std::vector<int64_t> last_visible, kv_offset;
};

// Into L2, not L1 (prefetcht1): with the cache cold this was 1.3-1.5x faster than prefetching
// into L1, and prefetchnta was slower still (benchmarks/RESULTS.md).
inline void prefetch_span(const float* p, int64_t floats) {
  for (int64_t i = 0; i < floats; i += 16) __builtin_prefetch(p + i, 0, 2);  // one 64-byte line each
}

// One sequence's KV heads [h0, h1): a row per (query token i, query head of those KV heads).
// Each slot row of the cache holds the KV heads side by side, so the item reads the span of
// its heads contiguously, block after block; the next block is prefetched while this one runs.
template <int64_t D>
void attend_item(const float* query, const float* k_cache, const float* v_cache,
                 const int32_t* table, int64_t q_start, int64_t q_len, int64_t seq_len,
                 int64_t h0, int64_t h1, float softmax_scale, int64_t dim, const Shapes& s,
                 float* out, Scratch& w) {
  const int64_t heads_per_token = (h1 - h0) * s.group, rows = q_len * heads_per_token;
  const int64_t bs = s.block_size, context = seq_len - q_len;
  w.q.resize(rows);
  w.o.resize(rows);
  w.last_visible.resize(rows);
  w.kv_offset.resize(rows);
  w.scores.assign(rows * bs, 0.f);
  w.acc.assign(rows * dim, 0.f);
  w.row_max.assign(rows, MASKED);
  w.row_sum.assign(rows, 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t token = q_start + r / heads_per_token, head = h0 * s.group + r % heads_per_token;
    w.q[r] = query + (token * s.heads + head) * dim;
    w.o[r] = out + (token * s.heads + head) * dim;
    w.last_visible[r] = context + r / heads_per_token;
    w.kv_offset[r] = (head / s.group - h0) * s.head_stride;
  }
  const int64_t span = (h1 - h0) * s.head_stride;  // floats of one slot row the item reads
  auto block_base = [&](int64_t blk) {  // int64: block index x stride overflows int32
    return static_cast<int64_t>(table[blk]) * s.block_stride + h0 * s.head_stride;
  };
  const int64_t num_blocks = (seq_len + bs - 1) / bs;
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    const int64_t t0 = blk * bs, n = std::min(bs, seq_len - t0);
    const int64_t base = block_base(blk);
    // The next block's slot row j is prefetched while this block's row j is read, a row's
    // lines at a time: with the cache cold, a burst of the whole next block at the start of
    // this one was 1.2-1.4x slower (benchmarks/RESULTS.md).
    const bool has_next = blk + 1 < num_blocks;
    const int64_t next = has_next ? block_base(blk + 1) : base;
    for (int64_t j = 0; j < n; ++j) {
      const float* kj = k_cache + base + j * s.slot_stride;
      if (has_next) prefetch_span(k_cache + next + j * s.slot_stride, span);
      for (int64_t r = 0; r < rows; ++r)
        w.scores[r * bs + j] = t0 + j <= w.last_visible[r]
                                   ? dot<D>(w.q[r], kj + w.kv_offset[r], dim) * softmax_scale
                                   : MASKED;
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* sc = w.scores.data() + r * bs;
      const int64_t visible = std::min(n, w.last_visible[r] - t0 + 1);
      if (visible <= 0) {  // every key of the block lies after this row's position
        std::fill(sc, sc + n, 0.f);
        continue;
      }
      const float block_max = *std::max_element(sc, sc + visible);
      const float new_max = std::max(w.row_max[r], block_max);
      const float correction = std::exp(w.row_max[r] - new_max);  // 0 on the first block
      w.row_sum[r] = w.row_sum[r] * correction + exp_sum(sc, new_max, visible);
      std::fill(sc + visible, sc + n, 0.f);
      scale<D>(w.acc.data() + r * dim, correction, dim);
      w.row_max[r] = new_max;
    }
    for (int64_t j = 0; j < n; ++j) {
      const float* vj = v_cache + base + j * s.slot_stride;
      if (has_next) prefetch_span(v_cache + next + j * s.slot_stride, span);
      for (int64_t r = 0; r < rows; ++r)
        scale_add<D>(w.acc.data() + r * dim, w.scores[r * bs + j], vj + w.kv_offset[r], dim);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = 1.f / w.row_sum[r];  // key 0 is visible to every row: row_sum > 0
    for (int64_t d = 0; d < dim; ++d) w.o[r][d] = w.acc[r * dim + d] * inv;
  }
}

using ItemFn = decltype(&attend_item<0>);

ItemFn item_fn(int64_t head_dim) {
  switch (head_dim) {  // the common head sizes get fully unrolled loops
    case 32: return &attend_item<32>;
    case 64: return &attend_item<64>;
    case 128: return &attend_item<128>;
    default: return &attend_item<0>;
  }
}

// query, out [T, heads, head_dim] fp32 contiguous; kv_cache [2, blocks, block_size, kv_heads,
// head_dim] fp32 contiguous; block_tables [B, W] int32; query_start_loc [B + 1] and seq_lens
// [B] int32, on the CPU; seqs [S] int64: the sequences to compute (others' rows are untouched).
void paged_attention_short(const at::Tensor& query, const at::Tensor& kv_cache,
                           const at::Tensor& block_tables, const at::Tensor& query_start_loc,
                           const at::Tensor& seq_lens, const at::Tensor& seqs, double scale,
                           const at::Tensor& out) {
  TORCH_CHECK(query.scalar_type() == at::kFloat && kv_cache.scalar_type() == at::kFloat &&
              out.scalar_type() == at::kFloat, "paged_attention_short: fp32 tensors only");
  TORCH_CHECK(query.is_contiguous() && kv_cache.is_contiguous() && out.is_contiguous() &&
              block_tables.is_contiguous(), "paged_attention_short: contiguous tensors only");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && query_start_loc.scalar_type() == at::kInt &&
              seq_lens.scalar_type() == at::kInt && seqs.scalar_type() == at::kLong,
              "paged_attention_short: int32 tables, starts and lengths; int64 seqs");
  TORCH_CHECK(kv_cache.size(2) <= MAX_BLOCK, "paged_attention_short: block size over ", MAX_BLOCK);
  Shapes s;
  s.heads = query.size(1);
  s.kv_heads = kv_cache.size(3);
  s.group = s.heads / s.kv_heads;
  s.block_size = kv_cache.size(2);
  s.table_width = block_tables.size(1);
  s.block_stride = kv_cache.stride(1);
  s.slot_stride = kv_cache.stride(2);
  s.head_stride = kv_cache.stride(3);
  const int64_t dim = query.size(2);
  const float* q = query.data_ptr<float>();
  const float* k_cache = kv_cache.data_ptr<float>();
  const float* v_cache = k_cache + kv_cache.stride(0);
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* starts = query_start_loc.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int64_t* seq_ids = seqs.data_ptr<int64_t>();
  float* o = out.data_ptr<float>();
  const ItemFn fn = item_fn(dim);
  // Whole sequences per item when there are enough of them to keep every thread busy; else
  // each sequence's KV heads are split (batch 1 still uses all threads).
  const int64_t num_seqs = seqs.numel(), wanted = 4 * at::get_num_threads();
  const int64_t splits = std::min(s.kv_heads, std::max<int64_t>(1, (wanted + num_seqs - 1) / num_seqs));
  const int64_t heads_per_item = (s.kv_heads + splits - 1) / splits;
  at::parallel_for(0, num_seqs * splits, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = seq_ids[item / splits], h0 = (item % splits) * heads_per_item;
      const int64_t h1 = std::min(s.kv_heads, h0 + heads_per_item);
      const int64_t q_start = starts[b], q_len = starts[b + 1] - starts[b];
      if (q_len == 0 || h0 >= h1) continue;
      fn(q, k_cache, v_cache, tables + b * s.table_width, q_start, q_len, lens[b], h0, h1,
         static_cast<float>(scale), dim, s, o, scratch);
    }
  });
}

}  // namespace

TORCH_LIBRARY(specserve_cpu, m) {
  m.def("paged_attention_short(Tensor query, Tensor kv_cache, Tensor block_tables, "
        "Tensor query_start_loc, Tensor seq_lens, Tensor seqs, float scale, Tensor(a!) out) -> ()",
        &paged_attention_short);
}
