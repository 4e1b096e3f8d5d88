// A sampled row's token on the CPU, drawn from its top-p / min-p distribution by rejection
// without a sort: app/engine/selection/draw.py's draw_top_p_by_rejection (the reference, in
// torch ops) in one pass over each row's logits per step instead of ~10 batched torch passes
// and a float64 cumsum of every row (9.5 of a ~13 ms sampled selection at batch 256, one
// thread, 2026-11-27). The same rounds, uniforms and tests; sums are taken in double, so a
// token can differ from the reference's only where a uniform falls within rounding of a
// boundary of the CDF.
//
// Built with -ffast-math (specserve_kernels/cpu/__init__.py), which lets the compiler assume no
// infinities: a grammar's -inf logits are told apart by their bits, and never enter the
// arithmetic (weight 0, never above a drawn token, never drawn).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

namespace {

constexpr int64_t ROWS_PER_TASK = 8;
constexpr int64_t SCAN_CHUNK = 16;  // a top-k row's logits by chunks, each with its maximum
constexpr int64_t FINAL_CUT = -1;  // the row's last uniform is drawn from the cut nucleus (in torch)

bool finite_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return (bits & 0x7f800000u) != 0x7f800000u;
}

// exp(x - top), a token's weight against the row's largest; clamped, so that no infinity
// reaches exp (fp32's exp is 0 below about -103.3 anyway).
float weight_below(float x, float top) { return std::exp(std::max(x - top, -110.0f)); }

// The first token whose running sum of `weights` passes u x their total: the reference's
// sample_inverse_cdf (a float64 CDF and searchsorted). The sums are taken by blocks of
// CDF_BLOCK tokens, and the walk goes block by block to the one the target falls in, then token
// by token: ~n / CDF_BLOCK dependent additions instead of ~n / 2.
constexpr int64_t CDF_BLOCK = 64;

int64_t inverse_cdf(const float* weights, int64_t n, double u) {
  const int64_t blocks = (n + CDF_BLOCK - 1) / CDF_BLOCK;
  thread_local std::vector<double> block_sums;
  block_sums.resize(blocks);
  double total = 0.0;
  for (int64_t b = 0; b < blocks; ++b) {
    double sum = 0.0;
    for (int64_t j = b * CDF_BLOCK; j < std::min(n, (b + 1) * CDF_BLOCK); ++j) sum += static_cast<double>(weights[j]);
    block_sums[b] = sum;
    total += sum;
  }
  const double target = std::min(u * total, std::nextafter(total, 0.0));
  double running = 0.0;
  int64_t b = 0;
  for (; b + 1 < blocks && running + block_sums[b] <= target; ++b) running += block_sums[b];
  for (int64_t j = b * CDF_BLOCK; j < n; ++j) {
    if (weights[j] > 0.0f) {
      running += static_cast<double>(weights[j]);
      if (running > target) return j;
    }
  }
  // the sums token by token came out below the block sums': the last token with mass
  for (int64_t j = n - 1; j > 0; --j)
    if (weights[j] > 0.0f) return j;
  return 0;
}

// A greedy row (temperature 0) draws as at temperature 1: its caller takes the argmax instead.
float positive(float temperature) { return temperature > 0.0f ? temperature : 1.0f; }

// logits [R, V] fp32, contiguous; each row's temperature, top_p and min_p [R] fp32.
void check_rows(const char* op, const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_p,
                const at::Tensor& min_p) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.is_contiguous(),
              op, ": logits [R, V] fp32, contiguous");
  for (const at::Tensor* t : {&temperature, &top_p, &min_p})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == logits.size(0),
                op, ": temperature, top_p and min_p [R] fp32");
}

// One row: the draw of round 0, then a check and a redraw above the pivot per round; the
// reference's loop, row by row. Scratch: x, weight and drawable, n floats each.
int64_t draw_row(const float* __restrict__ logits, int64_t n, float temperature, float top_p, float min_p,
                 const double* u, int64_t rounds, float* __restrict__ x, float* __restrict__ weight,
                 float* __restrict__ drawable) {
  float top = -FLT_MAX;
  for (int64_t j = 0; j < n; ++j) {  // restrict: no store here can change a logit, so this vectorises
    const bool allowed = finite_bits(logits[j]);
    const float xj = allowed ? logits[j] / temperature : -FLT_MAX;
    x[j] = xj;
    weight[j] = allowed ? 1.0f : 0.0f;  // a mark until the weights below
    top = std::max(top, xj);
  }
  double mass = 0.0;
  const float min_x = min_p > 0.0f ? top + std::log(min_p) : -FLT_MAX;
  for (int64_t j = 0; j < n; ++j) {
    const float w = weight[j] > 0.0f ? weight_below(x[j], top) : 0.0f;
    weight[j] = w;
    mass += w;
    drawable[j] = (min_p > 0.0f && x[j] < min_x) ? 0.0f : w;
  }
  int64_t token = inverse_cdf(drawable, n, u[0]);
  if (!(top_p < 1.0f)) return token;
  const double goal = std::max(static_cast<double>(top_p) * mass, static_cast<double>(FLT_MIN));
  for (int64_t r = 1; r < rounds; ++r) {  // checks the draw of uniform r - 1
    const float drawn_x = x[token];
    double above = 0.0;
    for (int64_t j = 0; j < n; ++j) above += x[j] > drawn_x ? weight[j] : 0.0f;
    if (above < goal) return token;  // in the nucleus: kept
    if (r == rounds - 1) break;
    for (int64_t j = 0; j < n; ++j)  // nothing at or below it can be in the nucleus
      if (x[j] <= drawn_x) drawable[j] = 0.0f;
    token = inverse_cdf(drawable, n, u[r]);
  }
  return FINAL_CUT;
}

// logits [R, V] fp32; temperature, top_p, min_p [R] fp32; u [R, rounds] float64, rows at any stride.
// -> [R] int64 tokens, FINAL_CUT where every redraw fell outside the nucleus.
at::Tensor draw_top_p_by_rejection(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_p,
                                   const at::Tensor& min_p, const at::Tensor& u) {
  check_rows("draw_top_p_by_rejection", logits, temperature, top_p, min_p);
  const int64_t rows = logits.size(0), n = logits.size(1);
  TORCH_CHECK(u.dim() == 2 && u.size(0) == rows && u.scalar_type() == at::kDouble && u.stride(1) == 1,
              "draw_top_p_by_rejection: u [R, rounds] float64, its rounds side by side");
  at::Tensor tokens = at::empty({rows}, logits.options().dtype(at::kLong));
  const float* lp = logits.data_ptr<float>();
  const float *tp = temperature.data_ptr<float>(), *pp = top_p.data_ptr<float>(), *mp = min_p.data_ptr<float>();
  const double* up = u.data_ptr<double>();
  int64_t* out = tokens.data_ptr<int64_t>();
  const int64_t rounds = u.size(1), u_stride = u.stride(0);
  at::parallel_for(0, rows, ROWS_PER_TASK, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(3 * n);
    for (int64_t row = begin; row < end; ++row)
      out[row] = draw_row(lp + row * n, n, positive(tp[row]), pp[row], mp[row], up + row * u_stride, rounds,
                          scratch.data(), scratch.data() + n, scratch.data() + 2 * n);
  });
  return tokens;
}

// One row with a top-k cut: the reference's draw (app/engine/selection/draw.py's draw_top_k)
// on the row's k largest logits: top-p on their distribution, then min-p, then the inverse CDF
// of the survivors in vocabulary order. Ties at the k-th value are kept in an arbitrary order,
// as torch's topk keeps them.
int64_t draw_top_k_row(const float* logits, int64_t n, float temperature, int64_t top_k, float top_p, float min_p,
                       double u, std::vector<std::pair<float, int64_t>>& kept, std::vector<float>& weights,
                       std::vector<float>& chunk_max, std::vector<float>& order) {
  // The k largest (by the raw logits: a positive temperature keeps their order). First a floor:
  // the k-th largest of the chunks' maxima is the largest of k distinct logits, so at least k
  // logits reach it, and every one of the k largest does. Then one scan of the chunks whose
  // maximum reaches the threshold: tokens above it are kept, and when 2k are, cut back to the
  // k largest, whose smallest becomes the threshold.
  const auto larger = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
    return a.first > b.first;
  };
  const auto keep_largest = [&](int64_t count) {
    std::nth_element(kept.begin(), kept.begin() + (count - 1), kept.end(), larger);
    kept.resize(count);
  };
  const int64_t chunks = n / SCAN_CHUNK;
  chunk_max.resize(chunks);
  float* __restrict__ maxima = chunk_max.data();
  for (int64_t c = 0; c < chunks; ++c) {
    float lanes[SCAN_CHUNK];
    for (int64_t i = 0; i < SCAN_CHUNK; ++i) {
      const float v = logits[c * SCAN_CHUNK + i];
      lanes[i] = finite_bits(v) ? v : -FLT_MAX;
    }
    float largest = lanes[0];
    for (int64_t i = 1; i < SCAN_CHUNK; ++i) largest = std::max(largest, lanes[i]);
    maxima[c] = largest;
  }
  float threshold = -FLT_MAX;  // a logit passes when above it
  if (top_k <= chunks) {
    order.assign(chunk_max.begin(), chunk_max.end());
    std::nth_element(order.begin(), order.begin() + (top_k - 1), order.end(), std::greater<float>());
    if (order[top_k - 1] > -FLT_MAX) threshold = std::nextafter(order[top_k - 1], -FLT_MAX);  // reaching the floor
  }
  kept.clear();
  const auto scan = [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const float v = logits[j];
      if (v > threshold && finite_bits(v)) {
        kept.emplace_back(v, j);
        if (static_cast<int64_t>(kept.size()) >= 2 * top_k + 64) {
          keep_largest(top_k);
          threshold = kept[top_k - 1].first;
        }
      }
    }
  };
  for (int64_t c = 0; c < chunks; ++c)
    if (chunk_max[c] > threshold) scan(c * SCAN_CHUNK, (c + 1) * SCAN_CHUNK);
  scan(chunks * SCAN_CHUNK, n);
  if (static_cast<int64_t>(kept.size()) > top_k) keep_largest(top_k);
  const int64_t k = static_cast<int64_t>(kept.size());
  TORCH_CHECK(k > 0, "draw_top_k: a row without a finite logit");
  std::sort(kept.begin(), kept.end(), larger);
  for (auto& [x, token] : kept) x /= temperature;  // now the reference's logits over temperature
  const float top = kept[0].first;
  double mass = 0.0;
  for (const auto& [x, token] : kept) mass += weight_below(x, top);
  const float min_x = min_p > 0.0f ? top + std::log(min_p) : -FLT_MAX;
  double before = 0.0;  // the top-k distribution's mass above a token
  int64_t survivors = 0;
  for (int64_t i = 0; i < k; ++i) {
    const float w = weight_below(kept[i].first, top);
    const bool in_nucleus = i == 0 || before / mass < static_cast<double>(top_p);
    before += w;
    if (in_nucleus && !(kept[i].first < min_x)) kept[survivors++] = kept[i];
  }
  kept.resize(survivors);
  std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  weights.resize(survivors);
  for (int64_t i = 0; i < survivors; ++i) weights[i] = weight_below(kept[i].first, top);
  return kept[inverse_cdf(weights.data(), survivors, u)].second;
}

// logits [R, V] fp32; temperature, top_p, min_p [R] fp32; top_k [R] int64 (> 0); u [R] float64
// at any stride -> [R] int64 tokens.
at::Tensor draw_top_k(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k,
                      const at::Tensor& top_p, const at::Tensor& min_p, const at::Tensor& u) {
  check_rows("draw_top_k", logits, temperature, top_p, min_p);
  const int64_t rows = logits.size(0), n = logits.size(1);
  TORCH_CHECK(top_k.scalar_type() == at::kLong && top_k.is_contiguous() && top_k.numel() == rows,
              "draw_top_k: top_k [R] int64");
  TORCH_CHECK(u.scalar_type() == at::kDouble && u.dim() == 1 && u.size(0) == rows, "draw_top_k: u [R] float64");
  at::Tensor tokens = at::empty({rows}, logits.options().dtype(at::kLong));
  const float* lp = logits.data_ptr<float>();
  const float *tp = temperature.data_ptr<float>(), *pp = top_p.data_ptr<float>(), *mp = min_p.data_ptr<float>();
  const int64_t* kp = top_k.data_ptr<int64_t>();
  const double* up = u.data_ptr<double>();
  const int64_t u_stride = u.stride(0);
  int64_t* out = tokens.data_ptr<int64_t>();
  at::parallel_for(0, rows, ROWS_PER_TASK, [&](int64_t begin, int64_t end) {
    std::vector<std::pair<float, int64_t>> kept;
    std::vector<float> weights, chunk_max, order;
    for (int64_t row = begin; row < end; ++row) {
      TORCH_CHECK(kp[row] > 0, "draw_top_k: a row without a top-k cut");
      out[row] = draw_top_k_row(lp + row * n, n, positive(tp[row]), kp[row], pp[row], mp[row], up[row * u_stride],
                                kept, weights, chunk_max, order);
    }
  });
  return tokens;
}

// The distribution a drafted row is verified against: app/engine/selection/distribution.py's
// row_probs (the reference, which sorts the row for top-k and top-p) in a few passes over the
// row and a sort of a few of its tokens. The nucleus is the tokens whose mass strictly above is
// below top_p x the row's (top-k) mass, as the draws define it. Tokens go in buckets by how far
// they lie below the row's largest logit, so no larger logit is in a later bucket: the buckets
// whose running mass stays below that goal are in the nucleus, those after the one that reaches
// it are out, and only that one's tokens are sorted to find the cut. Ties at a cut are all
// kept (the reference keeps an arbitrary order of them), as the CUDA draws keep them.
constexpr int64_t NUCLEUS_BUCKETS = 256;
constexpr float BUCKET_SPAN = 16.0f;  // logits further below the largest share the last bucket

void filtered_probs_row(const float* __restrict__ logits, int64_t n, float temperature, int64_t top_k, float top_p,
                        float min_p, float* __restrict__ out, float* __restrict__ x, uint8_t* __restrict__ bucket,
                        std::vector<float>& values, std::vector<std::pair<float, int64_t>>& boundary) {
  float top = -FLT_MAX;
  int64_t finite = 0;
  for (int64_t j = 0; j < n; ++j) {
    const bool allowed = finite_bits(logits[j]);
    x[j] = allowed ? logits[j] / temperature : -FLT_MAX;
    finite += allowed;
    top = std::max(top, x[j]);
  }
  TORCH_CHECK(finite > 0, "filtered_probs: a row without a finite logit");
  float floor = -FLT_MAX;  // top-k keeps the logits at or above it
  if (top_k > 0 && top_k < finite) {
    values.clear();
    for (int64_t j = 0; j < n; ++j)
      if (finite_bits(logits[j])) values.push_back(x[j]);
    std::nth_element(values.begin(), values.begin() + (top_k - 1), values.end(), std::greater<float>());
    floor = values[top_k - 1];
  }
  const float min_x = min_p > 0.0f ? top + std::log(min_p) : -FLT_MAX;
  double mass = 0.0;
  for (int64_t j = 0; j < n; ++j) {  // -FLT_MAX, a non-finite logit, is below any floor
    out[j] = x[j] >= floor && x[j] > -FLT_MAX ? weight_below(x[j], top) : 0.0f;
    mass += out[j];
  }
  if (top_p < 1.0f) {
    const float per_unit = NUCLEUS_BUCKETS / BUCKET_SPAN;
    double bucket_mass[NUCLEUS_BUCKETS] = {};
    for (int64_t j = 0; j < n; ++j) {
      bucket[j] = static_cast<uint8_t>(std::min<int64_t>(
          NUCLEUS_BUCKETS - 1, static_cast<int64_t>(std::min(top - x[j], BUCKET_SPAN) * per_unit)));
      bucket_mass[bucket[j]] += out[j];
    }
    const double goal = std::max(static_cast<double>(top_p) * mass, static_cast<double>(FLT_MIN));
    double above = 0.0;
    int64_t cut_bucket = 0;  // top-p keeps the buckets before it, and its logits above cut_above
    for (; cut_bucket < NUCLEUS_BUCKETS && above + bucket_mass[cut_bucket] < goal; ++cut_bucket)
      above += bucket_mass[cut_bucket];
    float cut_above = -FLT_MAX;
    if (cut_bucket < NUCLEUS_BUCKETS) {
      boundary.clear();
      for (int64_t j = 0; j < n; ++j)
        if (bucket[j] == cut_bucket && out[j] > 0.0f) boundary.emplace_back(x[j], j);
      std::sort(boundary.begin(), boundary.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      for (size_t i = 0; i < boundary.size();) {  // a group of equal logits at a time
        const float group = boundary[i].first;
        if (!(above < goal)) {  // the mass above reaches the goal: this group and all below are out
          cut_above = group;
          break;
        }
        for (; i < boundary.size() && boundary[i].first == group; ++i) above += out[boundary[i].second];
      }
    }
    for (int64_t j = 0; j < n; ++j)
      if (bucket[j] > cut_bucket || (bucket[j] == cut_bucket && !(x[j] > cut_above))) out[j] = 0.0f;
  }
  double kept = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    if (x[j] < min_x) out[j] = 0.0f;
    kept += out[j];
  }
  const float scale = static_cast<float>(1.0 / kept);
  for (int64_t j = 0; j < n; ++j) out[j] *= scale;
}

// logits [R, V] fp32; temperature, top_p, min_p [R] fp32; top_k [R] int64 (0: no cut)
// -> [R, V] fp32 probabilities.
at::Tensor filtered_probs(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k,
                          const at::Tensor& top_p, const at::Tensor& min_p) {
  check_rows("filtered_probs", logits, temperature, top_p, min_p);
  const int64_t rows = logits.size(0), n = logits.size(1);
  TORCH_CHECK(top_k.scalar_type() == at::kLong && top_k.is_contiguous() && top_k.numel() == rows,
              "filtered_probs: top_k [R] int64");
  at::Tensor probs = at::empty({rows, n}, logits.options());
  const float* lp = logits.data_ptr<float>();
  const float *tp = temperature.data_ptr<float>(), *pp = top_p.data_ptr<float>(), *mp = min_p.data_ptr<float>();
  const int64_t* kp = top_k.data_ptr<int64_t>();
  float* out = probs.data_ptr<float>();
  at::parallel_for(0, rows, ROWS_PER_TASK, [&](int64_t begin, int64_t end) {
    std::vector<float> x(n), values;
    std::vector<uint8_t> bucket(n);
    std::vector<std::pair<float, int64_t>> boundary;
    for (int64_t row = begin; row < end; ++row)
      filtered_probs_row(lp + row * n, n, positive(tp[row]), kp[row], pp[row], mp[row], out + row * n, x.data(),
                         bucket.data(), values, boundary);
  });
  return probs;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specserve_cpu, m) {
  m.def("draw_top_p_by_rejection(Tensor logits, Tensor temperature, Tensor top_p, Tensor min_p, Tensor u) -> Tensor",
        &draw_top_p_by_rejection);
  m.def("draw_top_k(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor min_p, Tensor u) -> Tensor",
        &draw_top_k);
  m.def("filtered_probs(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor min_p) -> Tensor",
        &filtered_probs);
}
