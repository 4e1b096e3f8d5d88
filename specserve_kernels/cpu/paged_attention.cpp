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
// Two versions of a work item: written with AVX-512 intrinsics where the compiler targets it
// (-march=native) and the head size is 32, 64 or 128; plain loops the compiler vectorises
// otherwise. Built with -ffast-math (for the vectorised exp), which assumes no infinities: a
// masked score is a large finite negative instead, and its weight is exactly 0.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

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
  std::vector<float> scores, acc, row_max, row_sum, correction;
  std::vector<int64_t> last_visible, kv_offset;
};

// Into L2, not L1 (prefetcht1): with the cache cold this was 1.3-1.5x faster than prefetching
// into L1, and prefetchnta was slower still (benchmarks/RESULTS.md).
inline void prefetch_span(const float* p, int64_t floats) {
  for (int64_t i = 0; i < floats; i += 16) __builtin_prefetch(p + i, 0, 2);  // one 64-byte line each
}

// Where the item's span of block `blk` starts in the K (or V) cache, in floats (int64: block
// index x stride overflows int32).
inline int64_t block_base(const int32_t* table, int64_t blk, int64_t h0, const Shapes& s) {
  return static_cast<int64_t>(table[blk]) * s.block_stride + h0 * s.head_stride;
}

// The rows of one work item, and where each reads and writes.
void prepare_rows(const float* query, float* out, int64_t q_start, int64_t q_len, int64_t seq_len,
                  int64_t h0, int64_t h1, int64_t dim, const Shapes& s, Scratch& w) {
  const int64_t heads_per_token = (h1 - h0) * s.group, rows = q_len * heads_per_token;
  w.q.resize(rows);
  w.o.resize(rows);
  w.last_visible.resize(rows);
  w.kv_offset.resize(rows);
  w.scores.assign(rows * s.block_size, 0.f);
  w.acc.assign(rows * dim, 0.f);
  w.row_max.assign(rows, MASKED);
  w.row_sum.assign(rows, 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t token = q_start + r / heads_per_token, head = h0 * s.group + r % heads_per_token;
    w.q[r] = query + (token * s.heads + head) * dim;
    w.o[r] = out + (token * s.heads + head) * dim;
    w.last_visible[r] = seq_len - q_len + r / heads_per_token;
    w.kv_offset[r] = (head / s.group - h0) * s.head_stride;
  }
}

// The online softmax over one block's scores (keys t0 .. t0 + n): each row's scores become
// their weights, and its running sum and accumulator are rescaled to the new running max.
template <int64_t D>
void softmax_block(int64_t rows, int64_t t0, int64_t n, int64_t dim, int64_t bs, Scratch& w) {
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
}

void finish_rows(int64_t rows, int64_t dim, const Scratch& w) {
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = 1.f / w.row_sum[r];  // key 0 is visible to every row: row_sum > 0
    for (int64_t d = 0; d < dim; ++d) w.o[r][d] = w.acc[r * dim + d] * inv;
  }
}

// One sequence's KV heads [h0, h1): a row per (query token i, query head of those KV heads).
// Each slot row of the cache holds the KV heads side by side, so the item reads the span of
// its heads contiguously, block after block; the next block is prefetched while this one runs.
template <int64_t D>
void attend_item(const float* query, const float* k_cache, const float* v_cache,
                 const int32_t* table, int64_t q_start, int64_t q_len, int64_t seq_len,
                 int64_t h0, int64_t h1, float softmax_scale, int64_t dim, const Shapes& s,
                 float* out, Scratch& w) {
  prepare_rows(query, out, q_start, q_len, seq_len, h0, h1, dim, s, w);
  const int64_t rows = q_len * (h1 - h0) * s.group, bs = s.block_size;
  const int64_t span = (h1 - h0) * s.head_stride;  // floats of one slot row the item reads
  const int64_t num_blocks = (seq_len + bs - 1) / bs;
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    const int64_t t0 = blk * bs, n = std::min(bs, seq_len - t0);
    const int64_t base = block_base(table, blk, h0, s);
    // The next block's slot row j is prefetched while this block's row j is read, a row's
    // lines at a time: with the cache cold, a burst of the whole next block at the start of
    // this one was 1.2-1.4x slower (benchmarks/RESULTS.md).
    const bool has_next = blk + 1 < num_blocks;
    const int64_t next = has_next ? block_base(table, blk + 1, h0, s) : base;
    for (int64_t j = 0; j < n; ++j) {
      const float* kj = k_cache + base + j * s.slot_stride;
      if (has_next) prefetch_span(k_cache + next + j * s.slot_stride, span);
      for (int64_t r = 0; r < rows; ++r)
        w.scores[r * bs + j] = t0 + j <= w.last_visible[r]
                                   ? dot<D>(w.q[r], kj + w.kv_offset[r], dim) * softmax_scale
                                   : MASKED;
    }
    softmax_block<D>(rows, t0, n, dim, bs, w);
    for (int64_t j = 0; j < n; ++j) {
      const float* vj = v_cache + base + j * s.slot_stride;
      if (has_next) prefetch_span(v_cache + next + j * s.slot_stride, span);
      for (int64_t r = 0; r < rows; ++r)
        scale_add<D>(w.acc.data() + r * dim, w.scores[r * bs + j], vj + w.kv_offset[r], dim);
    }
  }
  finish_rows(rows, dim, w);
}

#if defined(__AVX512F__)
// With 16-lane vectors a row's scores are made 16 keys at a time: one vector of partial
// products per key, summed across lanes by one transpose-and-add tree for all 16 (about 3
// instructions a key, against a horizontal sum of 8 or so for each key alone), and their
// online softmax is taken on the vector; a row's weighted values are summed in registers.

// Lane j of the result is the sum of v[j]'s lanes.
inline __m512 lane_sums(const __m512* v) {
  __m512 pairs[8], quads[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3], a, b = v[2i], v[2i+1]
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: the lane's sums of v[4i .. 4i + 4]
    const __m512d x = _mm512_castps_pd(pairs[2 * i]), y = _mm512_castps_pd(pairs[2 * i + 1]);
    quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  constexpr int EVEN = _MM_SHUFFLE(2, 0, 2, 0), ODD = _MM_SHUFFLE(3, 1, 3, 1);
  const __m512 low = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], EVEN),
                                   _mm512_shuffle_f32x4(quads[0], quads[1], ODD));
  const __m512 high = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], EVEN),
                                    _mm512_shuffle_f32x4(quads[2], quads[3], ODD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(low, high, EVEN), _mm512_shuffle_f32x4(low, high, ODD));
}

// exp(x) for x <= 0, within 2 ulp (Cephes' expf: x = n ln2 + f, |f| <= ln2 / 2, a degree-6
// polynomial in f, times 2^n). Below -87 it gives about 1e-38, not 0: masked lanes are zeroed
// by the caller.
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  f = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), f);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(f, f), _mm512_add_ps(f, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

inline __mmask16 first_lanes(int64_t n) {
  return n <= 0 ? 0 : n >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1);
}

// attend_item for head_dim = 16 * C: the same rows and blocks. Per block, each row makes its
// keys' weights (scores, then the online softmax on them) and then sums the weighted values.
template <int C>
void attend_item_avx512(const float* query, const float* k_cache, const float* v_cache,
                        const int32_t* table, int64_t q_start, int64_t q_len, int64_t seq_len,
                        int64_t h0, int64_t h1, float softmax_scale, int64_t dim, const Shapes& s,
                        float* out, Scratch& w) {
  constexpr int64_t D = 16 * C;
  prepare_rows(query, out, q_start, q_len, seq_len, h0, h1, D, s, w);
  const int64_t rows = q_len * (h1 - h0) * s.group, bs = s.block_size;
  const int64_t span_lines = ((h1 - h0) * s.head_stride + 15) / 16;  // 64-byte lines of a slot row's span
  w.correction.resize(rows);
  const __m512 scale_v = _mm512_set1_ps(softmax_scale);
  const int64_t num_blocks = (seq_len + bs - 1) / bs;
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    const int64_t t0 = blk * bs, n = std::min(bs, seq_len - t0);
    const int64_t base = block_base(table, blk, h0, s);
    const bool has_next = blk + 1 < num_blocks;
    const int64_t next = has_next ? block_base(table, blk + 1, h0, s) : base;
    for (int64_t r = 0; r < rows; ++r) {
      __m512 q[C];
      for (int c = 0; c < C; ++c) q[c] = _mm512_loadu_ps(w.q[r] + 16 * c);
      const float* k_row = k_cache + base + w.kv_offset[r];
      float* weights = w.scores.data() + r * bs;
      float correction = 1.f;
      for (int64_t c0 = 0; c0 < n; c0 += 16) {
        const int64_t keys = std::min<int64_t>(16, n - c0);
        const __mmask16 visible = first_lanes(std::min(keys, w.last_visible[r] - (t0 + c0) + 1));
        if (!visible) {  // every key of the chunk lies after this row's position
          _mm512_mask_storeu_ps(weights + c0, first_lanes(keys), _mm512_setzero_ps());
          continue;
        }
        __m512 partial[16];
        for (int64_t j = 0; j < 16; ++j) {
          if (j >= keys) {
            partial[j] = _mm512_setzero_ps();
            continue;
          }
          const float* k = k_row + (c0 + j) * s.slot_stride;
          // The rows share the prefetch of the next block's keys and values, about a line a
          // key: row r takes lines r, r + rows, ... of each slot row (benchmarks/RESULTS.md,
          // 2026-12-02: slot rows shared out at each row's start were slower at 8 sequences).
          if (has_next)
            for (int64_t line = r; line < span_lines; line += rows) {
              __builtin_prefetch(k_cache + next + (c0 + j) * s.slot_stride + 16 * line, 0, 2);
              __builtin_prefetch(v_cache + next + (c0 + j) * s.slot_stride + 16 * line, 0, 2);
            }
          __m512 sum = _mm512_mul_ps(q[0], _mm512_loadu_ps(k));
          for (int c = 1; c < C; ++c) sum = _mm512_fmadd_ps(q[c], _mm512_loadu_ps(k + 16 * c), sum);
          partial[j] = sum;
        }
        const __m512 scores = _mm512_mul_ps(lane_sums(partial), scale_v);
        const float chunk_max = _mm512_mask_reduce_max_ps(visible, scores);
        if (chunk_max > w.row_max[r]) {  // 0 on the row's first chunk: its sums are 0 then
          const float chunk_correction = std::exp(w.row_max[r] - chunk_max);
          w.row_sum[r] *= chunk_correction;
          w.row_max[r] = chunk_max;
          correction *= chunk_correction;
          for (int64_t j = 0; j < c0; ++j) weights[j] *= chunk_correction;  // blocks over 16 keys
        }
        const __m512 p = _mm512_maskz_mov_ps(
            visible, exp_nonpositive(_mm512_sub_ps(scores, _mm512_set1_ps(w.row_max[r]))));
        w.row_sum[r] += _mm512_reduce_add_ps(p);
        _mm512_mask_storeu_ps(weights + c0, first_lanes(keys), p);
      }
      w.correction[r] = correction;
    }
    for (int64_t r = 0; r < rows; ++r) {
      // Two sums per lane, even keys and odd, so that C < 4 still has 4 FMA chains in flight.
      __m512 even[C], odd[C];
      float* acc = w.acc.data() + r * D;
      const __m512 correction = _mm512_set1_ps(w.correction[r]);
      for (int c = 0; c < C; ++c) {
        even[c] = _mm512_mul_ps(_mm512_loadu_ps(acc + 16 * c), correction);
        odd[c] = _mm512_setzero_ps();
      }
      const float* weights = w.scores.data() + r * bs;
      const float* v_row = v_cache + base + w.kv_offset[r];
      int64_t j = 0;
      for (; j + 1 < n; j += 2) {
        const __m512 p0 = _mm512_set1_ps(weights[j]), p1 = _mm512_set1_ps(weights[j + 1]);
        const float* v0 = v_row + j * s.slot_stride;
        const float* v1 = v0 + s.slot_stride;
        for (int c = 0; c < C; ++c) {
          even[c] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(v0 + 16 * c), even[c]);
          odd[c] = _mm512_fmadd_ps(p1, _mm512_loadu_ps(v1 + 16 * c), odd[c]);
        }
      }
      if (j < n) {
        const __m512 p = _mm512_set1_ps(weights[j]);
        const float* v = v_row + j * s.slot_stride;
        for (int c = 0; c < C; ++c) even[c] = _mm512_fmadd_ps(p, _mm512_loadu_ps(v + 16 * c), even[c]);
      }
      for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + 16 * c, _mm512_add_ps(even[c], odd[c]));
    }
  }
  finish_rows(rows, D, w);
}
#endif

using ItemFn = decltype(&attend_item<0>);

ItemFn item_fn(int64_t head_dim) {
  switch (head_dim) {  // the common head sizes get fully unrolled loops
#if defined(__AVX512F__)
    case 32: return &attend_item_avx512<2>;
    case 64: return &attend_item_avx512<4>;
    case 128: return &attend_item_avx512<8>;
#else
    case 32: return &attend_item<32>;
    case 64: return &attend_item<64>;
    case 128: return &attend_item<128>;
#endif
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
