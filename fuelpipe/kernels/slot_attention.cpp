// Attention of a batch step read straight from the batch-slot KV buffers: no gathered copy.
//
// The readable statement is fuelpipe.kv.slot_attention.slot_attention: gather each row's slot
// (k_buf[slot_ids[b]]), zero the slots no query of the row may attend, then scaled-dot-product
// attention under the additive mask, a query head h reading KV head h / (H / Hkv). This kernel
// computes that function without the gather: row b's queries read k_buf / v_buf at slot
// slot_ids[b] in place, and a key whose mask entry is -inf for a query is skipped for that query,
// never read. A masked slot may hold anything (a recycled slot's NaN poison, another sequence's old
// rows) and cannot reach the output. A query with no attendable key gives 0, as the reference does.
// One difference, with several queries per row (T > 1) only: a slot one query attends and another
// masks reaches the reference's masked query as 0 * -inf weight, so a NaN there poisons that query
// in the reference and not here (decode steps have T = 1).
//
// Per (row, query head, query position), in order: s_j = dot(q, k_j) * scale + mask_j over the
// attendable keys j, p_j = exp(s_j - max s), out = sum_j p_j v_j / sum_j p_j. A row's result reads
// only its own slot, query and mask row, so it does not depend on the other rows of the step or on
// the thread count (threads split (row, KV head) pairs, never a sum).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "vector_path.h"

#ifdef FUELPIPE_HAS_AVX2
#include <immintrin.h>
#endif

namespace {

using fuelpipe_isa::at_least;
using fuelpipe_isa::Path;

inline float dot(const float* a, const float* b, int64_t n) {
#ifdef FUELPIPE_HAS_AVX2
  if (at_least(Path::avx2)) {
    int64_t d = 0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; d + 16 <= n; d += 16) {
      acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d + 8), _mm256_loadu_ps(b + d + 8), acc1);
    }
    for (; d + 8 <= n; d += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc0);
    const __m256 acc = _mm256_add_ps(acc0, acc1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float s = _mm_cvtss_f32(h);
    for (; d < n; ++d) s += a[d] * b[d];
    return s;
  }
#endif
  float s = 0.0f;
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

inline void axpy(float alpha, const float* x, float* y, int64_t n) {
  int64_t d = 0;
#ifdef FUELPIPE_HAS_AVX2
  if (at_least(Path::avx2)) {
    const __m256 a = _mm256_set1_ps(alpha);
    for (; d + 8 <= n; d += 8) _mm256_storeu_ps(y + d, _mm256_fmadd_ps(a, _mm256_loadu_ps(x + d), _mm256_loadu_ps(y + d)));
  }
#endif
  for (; d < n; ++d) y[d] += alpha * x[d];
}

at::Tensor slot_attention(const at::Tensor& q_in, const at::Tensor& k_buf, const at::Tensor& v_buf,
                          const at::Tensor& slot_ids_in, const at::Tensor& mask, double scale) {
  TORCH_CHECK(q_in.dim() == 4 && k_buf.dim() == 4 && v_buf.dim() == 4,
              "slot_attention: q [B, H, T, D], k_buf and v_buf [N, Hkv, S, D] must be 4-d, got ", q_in.sizes(), ", ",
              k_buf.sizes(), ", ", v_buf.sizes());
  for (const at::Tensor* t : {&q_in, &k_buf, &v_buf, &mask}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat,
                "slot_attention: q, k_buf, v_buf and mask must be float32 on the CPU, got ", t->scalar_type(), " on ",
                t->device());
  }
  const int64_t B = q_in.size(0), H = q_in.size(1), T = q_in.size(2), D = q_in.size(3);
  const int64_t N = k_buf.size(0), Hkv = k_buf.size(1), S = k_buf.size(2), Dv = v_buf.size(3);
  TORCH_CHECK(k_buf.size(3) == D && v_buf.size(0) == N && v_buf.size(1) == Hkv && v_buf.size(2) == S,
              "slot_attention: k_buf must be [N, Hkv, S, ", D, "] and v_buf [N, Hkv, S, Dv] alike, got ", k_buf.sizes(),
              " and ", v_buf.sizes());
  TORCH_CHECK(Hkv >= 1 && H % Hkv == 0, "slot_attention: query heads ", H, " must be a multiple of KV heads ", Hkv);
  TORCH_CHECK(k_buf.stride(3) == 1 && v_buf.stride(3) == 1, "slot_attention: k_buf and v_buf need a contiguous last dim");
  TORCH_CHECK(slot_ids_in.device().is_cpu() && slot_ids_in.dim() == 1 && slot_ids_in.size(0) == B &&
                  slot_ids_in.scalar_type() == at::kLong,
              "slot_attention: slot_ids must be int64 [", B, "] on the CPU, got ", slot_ids_in.scalar_type(), " ",
              slot_ids_in.sizes(), " on ", slot_ids_in.device());
  TORCH_CHECK(mask.dim() == 4 && (mask.size(0) == B || mask.size(0) == 1) && mask.size(1) == 1 &&
                  (mask.size(2) == T || mask.size(2) == 1) && mask.size(3) == S,
              "slot_attention: mask must be [B or 1, 1, T or 1, ", S, "], got ", mask.sizes());
  const at::Tensor q = q_in.contiguous();
  const at::Tensor slot_ids = slot_ids_in.contiguous();
  const int64_t* slots = slot_ids.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(slots[b] >= 0 && slots[b] < N, "slot_attention: slot_ids[", b, "]=", slots[b], " is outside [0, ", N, ")");
  }
  at::Tensor out = at::empty({B, H, T, Dv}, q.options());
  if (out.numel() == 0) return out;
  const int64_t mb = mask.size(0) == 1 ? 0 : mask.stride(0), mt = mask.size(2) == 1 ? 0 : mask.stride(2),
                ms = mask.stride(3);
  const int64_t group = H / Hkv;
  const float* qp = q.data_ptr<float>();
  const float* kp = k_buf.data_ptr<float>();
  const float* vp = v_buf.data_ptr<float>();
  const float* mp = mask.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const float sc = static_cast<float>(scale);
  // One task per (row, KV head): its `group` query heads share every key and value load.
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> score(group * S);  // [group, live keys]
    std::vector<int64_t> live(S);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / Hkv, g = task % Hkv;
      const float* kb = kp + slots[b] * k_buf.stride(0) + g * k_buf.stride(1);
      const float* vb = vp + slots[b] * v_buf.stride(0) + g * v_buf.stride(1);
      for (int64_t t = 0; t < T; ++t) {
        const float* m = mp + b * mb + t * mt;
        int64_t n = 0;
        for (int64_t j = 0; j < S; ++j)
          if (m[j * ms] != neg_inf) live[n++] = j;
        const float* q0 = qp + ((b * H + g * group) * T + t) * D;  // head h of the group at q0 + h * T * D
        float* o0 = op + ((b * H + g * group) * T + t) * Dv;
        for (int64_t h = 0; h < group; ++h)
          for (int64_t d = 0; d < Dv; ++d) o0[h * T * Dv + d] = 0.0f;
        if (n == 0) continue;  // nothing attendable: 0, as the reference
        for (int64_t i = 0; i < n; ++i) {
          const float* kj = kb + live[i] * k_buf.stride(2);
          const float add = m[live[i] * ms];
          for (int64_t h = 0; h < group; ++h) score[h * n + i] = dot(q0 + h * T * D, kj, D) * sc + add;
        }
        for (int64_t h = 0; h < group; ++h) {
          float* sh = score.data() + h * n;
          float top = neg_inf;
          for (int64_t i = 0; i < n; ++i) top = std::max(top, sh[i]);
          float total = 0.0f;
          for (int64_t i = 0; i < n; ++i) {
            sh[i] = std::exp(sh[i] - top);
            total += sh[i];
          }
          const float inv = 1.0f / total;
          for (int64_t i = 0; i < n; ++i) sh[i] *= inv;
        }
        for (int64_t i = 0; i < n; ++i) {
          const float* vj = vb + live[i] * v_buf.stride(2);
          for (int64_t h = 0; h < group; ++h) axpy(score[h * n + i], vj, o0 + h * T * Dv, Dv);
        }
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fuelpipe_kernels, m) {
  m.def("slot_attention(Tensor q, Tensor k_buf, Tensor v_buf, Tensor slot_ids, Tensor mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(fuelpipe_kernels, CPU, m) {
  m.impl("slot_attention", slot_attention);
}
