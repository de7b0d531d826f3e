// Weight-only low-bit matrix products for decode: f32 activations times int8, 4-bit or bf16 weights,
// and (the *_a16 operators) int8 or 4-bit weights times activations quantized to 16 bits per block.
//
// Compiled once per machine by fuelpipe.kernels.build (with -march=native, so the AVX2 path is
// taken wherever the CPU has AVX2 and FMA: the AMD EPYC and Intel Xeon machines alike); the scalar
// path is the portable fallback and the readable statement of what every path computes. The
// Python reference (fuelpipe.quant.formats.dequantize + F.linear) is what the tests compare against.
//
// Weight layouts (row n of the weight is output feature n; K = in_features; G = group size, a
// multiple of 32 that divides K):
//   int8: q  int8  [N, K]                 w[n, k] = q[n, k] * scale[n, k / G]
//   int4: q  uint8 [N, K / 2]             per 32-element block of a row, byte j (0..15) holds element j
//                                         in its low nibble and element j + 16 in its high nibble (the
//                                         GGUF Q4_0 / Q4_1 block order, so those files' blocks are
//                                         copied, not re-quantized)
//                                         w[n, k] = code[n, k] * scale[n, k / G] + min[n, k / G]
//   bf16: w  bf16  [N, K]                 w[n, k] = float(w[n, k])
// scale and min are f16 or f32 [N, K / G] (f32 keeps K-quant scales, d * sub-scale, exact).
//
// Each output row is one thread's sequential dot product, so the result does not depend on the
// thread count: a held plan and a fresh build give bit-identical logits.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define FUELPIPE_AVX2 1
#endif

namespace {

inline float to_f32(float v) { return v; }
inline float to_f32(c10::Half v) { return static_cast<float>(v); }

#ifdef FUELPIPE_AVX2
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline __m256 bytes8_u(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)); }
inline __m256 bytes8_s(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
#endif

// ---- one weight row: dequantize into f32 (the form every multi-row product uses) ------------------

template <typename S>
void dequant_row_q8(const int8_t* q, const S* s, int64_t K, int64_t G, float* out) {
  for (int64_t k = 0; k < K; ++k) out[k] = static_cast<float>(q[k]) * to_f32(s[k / G]);
}

template <typename S>
void dequant_row_q4(const uint8_t* q, const S* s, const S* mn, int64_t K, int64_t G, float* out) {
  for (int64_t b = 0; b < K / 32; ++b) {
    const uint8_t* qb = q + b * 16;
    const int64_t g = b * 32 / G;
    const float d = to_f32(s[g]), m = to_f32(mn[g]);
    for (int j = 0; j < 16; ++j) {
      out[b * 32 + j] = static_cast<float>(qb[j] & 0x0F) * d + m;
      out[b * 32 + j + 16] = static_cast<float>(qb[j] >> 4) * d + m;
    }
  }
}

void dequant_row_bf16(const c10::BFloat16* w, int64_t K, float* out) {
  for (int64_t k = 0; k < K; ++k) out[k] = static_cast<float>(w[k]);
}

float dot_f32(const float* a, const float* b, int64_t K) {
#ifdef FUELPIPE_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), acc1);
  }
  float s = hsum(_mm256_add_ps(acc0, acc1));
  for (; k < K; ++k) s += a[k] * b[k];
  return s;
#else
  float s = 0.f;
  for (int64_t k = 0; k < K; ++k) s += a[k] * b[k];
  return s;
#endif
}

// ---- one weight row times one activation row, fused (decode: M == 1) -----------------------------

// Scales (and mins) of one row as f32: f16 rows are converted 8 at a time with F16C, not one by one.
template <typename S>
const float* row_f32(const S* src, int64_t n, float* buf) {
  if constexpr (std::is_same_v<S, float>) {
    return src;
  } else {
    int64_t i = 0;
#ifdef FUELPIPE_AVX2
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(buf + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
    for (; i < n; ++i) buf[i] = static_cast<float>(src[i]);
    return buf;
  }
}

float dot_q8(const int8_t* q, const float* s, const float* x, int64_t K, int64_t G) {
#ifdef FUELPIPE_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (int64_t g = 0; g < K / G; ++g) {
    __m256 ga = _mm256_setzero_ps(), gb = _mm256_setzero_ps();
    for (int64_t k = g * G; k < (g + 1) * G; k += 32) {
      ga = _mm256_fmadd_ps(bytes8_s(q + k), _mm256_loadu_ps(x + k), ga);
      gb = _mm256_fmadd_ps(bytes8_s(q + k + 8), _mm256_loadu_ps(x + k + 8), gb);
      ga = _mm256_fmadd_ps(bytes8_s(q + k + 16), _mm256_loadu_ps(x + k + 16), ga);
      gb = _mm256_fmadd_ps(bytes8_s(q + k + 24), _mm256_loadu_ps(x + k + 24), gb);
    }
    acc = _mm256_fmadd_ps(_mm256_add_ps(ga, gb), _mm256_set1_ps(s[g]), acc);
  }
  return hsum(acc);
#else
  float acc = 0.f;
  for (int64_t g = 0; g < K / G; ++g) {
    float ga = 0.f;
    for (int64_t k = g * G; k < (g + 1) * G; ++k) ga += static_cast<float>(q[k]) * x[k];
    acc += ga * s[g];
  }
  return acc;
#endif
}

// xsum[g] = sum of x over group g: the min term of a whole group is min[g] * xsum[g].
float dot_q4(const uint8_t* q, const float* s, const float* mn, const float* x, const float* xsum, int64_t K, int64_t G) {
#ifdef FUELPIPE_AVX2
  const __m128i low = _mm_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  float macc = 0.f;
  for (int64_t g = 0; g < K / G; ++g) {
    __m256 ga = _mm256_setzero_ps(), gb = _mm256_setzero_ps();
    for (int64_t k = g * G; k < (g + 1) * G; k += 32) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k / 2));
      const __m128i lo = _mm_and_si128(raw, low);                     // elements k .. k+15
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);  // elements k+16 .. k+31
      ga = _mm256_fmadd_ps(bytes8_u(lo), _mm256_loadu_ps(x + k), ga);
      gb = _mm256_fmadd_ps(bytes8_u(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + k + 8), gb);
      ga = _mm256_fmadd_ps(bytes8_u(hi), _mm256_loadu_ps(x + k + 16), ga);
      gb = _mm256_fmadd_ps(bytes8_u(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + k + 24), gb);
    }
    acc = _mm256_fmadd_ps(_mm256_add_ps(ga, gb), _mm256_set1_ps(s[g]), acc);
  }
  return hsum(acc) + dot_f32(mn, xsum, K / G);
#else
  float acc = 0.f;
  for (int64_t g = 0; g < K / G; ++g) {
    float ga = 0.f;
    for (int64_t b = g * G / 32; b < (g + 1) * G / 32; ++b) {
      const uint8_t* qb = q + b * 16;
      for (int j = 0; j < 16; ++j)
        ga += static_cast<float>(qb[j] & 0x0F) * x[b * 32 + j] + static_cast<float>(qb[j] >> 4) * x[b * 32 + j + 16];
    }
    acc += ga * s[g];
  }
  return acc + dot_f32(mn, xsum, K / G);
#endif
}

#ifdef FUELPIPE_AVX2
inline float h2f(const c10::Half* s, int64_t i) { return _cvtsh_ss(reinterpret_cast<const uint16_t*>(s)[i]); }  // F16C
inline float h2f(const float* s, int64_t i) { return s[i]; }

// Group size 32 (every GGUF block, and the default): one scale per block, applied to the block's
// partial sum, with two alternating accumulators and no division in the row loop. Measured 1.25-1.36x
// faster than the general form below on SmolLM2's shapes here (one process, A/B), so decode takes it
// whenever it can.
// One 32-element int8 block times x: its partial sum as 8 lanes (two independent product chains).
__attribute__((always_inline)) inline __m256 q8_block(const int8_t* qb, const float* xb) {
  __m256 p0 = _mm256_mul_ps(bytes8_s(qb), _mm256_loadu_ps(xb));
  __m256 p1 = _mm256_mul_ps(bytes8_s(qb + 8), _mm256_loadu_ps(xb + 8));
  p0 = _mm256_fmadd_ps(bytes8_s(qb + 16), _mm256_loadu_ps(xb + 16), p0);
  p1 = _mm256_fmadd_ps(bytes8_s(qb + 24), _mm256_loadu_ps(xb + 24), p1);
  return _mm256_add_ps(p0, p1);
}

template <typename S>
inline float q8_row32(const int8_t* q, const S* s, const float* x, int64_t nb) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {  // even blocks into a0, odd into a1: two independent chains
    a0 = _mm256_fmadd_ps(q8_block(q + b * 32, x + b * 32), _mm256_set1_ps(h2f(s, b)), a0);
    a1 = _mm256_fmadd_ps(q8_block(q + b * 32 + 32, x + b * 32 + 32), _mm256_set1_ps(h2f(s, b + 1)), a1);
  }
  if (b < nb) a0 = _mm256_fmadd_ps(q8_block(q + b * 32, x + b * 32), _mm256_set1_ps(h2f(s, b)), a0);
  return hsum(_mm256_add_ps(a0, a1));
}
template <typename S>
inline float q4_row32(const uint8_t* q, const S* s, const S* mn, const float* x, const float* xsum, int64_t nb) {
  const __m128i low = _mm_set1_epi8(0x0F);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  float macc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* qb = q + b * 16; const float* xb = x + b * 32;
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qb));
    const __m128i lo = _mm_and_si128(raw, low);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
    __m256 p0 = _mm256_mul_ps(bytes8_u(lo), _mm256_loadu_ps(xb));
    __m256 p1 = _mm256_mul_ps(bytes8_u(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(xb + 8));
    p0 = _mm256_fmadd_ps(bytes8_u(hi), _mm256_loadu_ps(xb + 16), p0);
    p1 = _mm256_fmadd_ps(bytes8_u(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(xb + 24), p1);
    if (b & 1) a1 = _mm256_fmadd_ps(_mm256_add_ps(p0, p1), _mm256_set1_ps(h2f(s, b)), a1);
    else a0 = _mm256_fmadd_ps(_mm256_add_ps(p0, p1), _mm256_set1_ps(h2f(s, b)), a0);
    macc += h2f(mn, b) * xsum[b];
  }
  return hsum(_mm256_add_ps(a0, a1)) + macc;
}
#endif

float dot_bf16(const c10::BFloat16* w, const float* x, int64_t K) {
#ifdef FUELPIPE_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k));
    const __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(raw)), 16));
    const __m256 b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(raw, 1)), 16));
    acc0 = _mm256_fmadd_ps(a, _mm256_loadu_ps(x + k), acc0);
    acc1 = _mm256_fmadd_ps(b, _mm256_loadu_ps(x + k + 8), acc1);
  }
  float s = hsum(_mm256_add_ps(acc0, acc1));
  for (; k < K; ++k) s += static_cast<float>(w[k]) * x[k];
  return s;
#else
  float s = 0.f;
  for (int64_t k = 0; k < K; ++k) s += static_cast<float>(w[k]) * x[k];
  return s;
#endif
}

// ---- the operators ---------------------------------------------------------------------------------

void check_common(const char* op, const at::Tensor& x, int64_t K, int64_t N, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu(), op, ": x must be on the CPU, got ", x.device());
  TORCH_CHECK(x.scalar_type() == at::kFloat, op, ": x must be float32 (activations stay f32), got ", x.scalar_type());
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == K, op, ": x's last dimension must be in_features=", K, ", got shape ", x.sizes());
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->size(0) == N, op,
                ": bias must be float32 [", N, "], got ", bias->scalar_type(), " ", bias->sizes());
  }
}

constexpr int64_t kMaxGroups = 4096;  // groups per row (K / G): 131072 inputs at group 32

void check_scales(const char* op, const at::Tensor& s, int64_t N, int64_t K, int64_t G) {
  TORCH_CHECK(G >= 32 && G % 32 == 0 && K % G == 0, op, ": group size must be a multiple of 32 dividing in_features=", K, ", got ", G);
  TORCH_CHECK(K / G <= kMaxGroups, op, ": at most ", kMaxGroups, " groups per row, got in_features=", K, " / group ", G);
  TORCH_CHECK(s.dim() == 2 && s.size(0) == N && s.size(1) == K / G && s.is_contiguous(), op,
              ": scales must be contiguous [", N, ", ", K / G, "], got ", s.sizes());
  TORCH_CHECK(s.scalar_type() == at::kHalf || s.scalar_type() == at::kFloat, op, ": scales must be float16 or float32, got ", s.scalar_type());
}

at::Tensor out_like(const at::Tensor& x, int64_t N) {
  auto sizes = x.sizes().vec();
  sizes.back() = N;
  return at::empty(sizes, x.options());
}

// The shapes of an int8 product's arguments, checked: {N, K, G}.
std::array<int64_t, 3> q8_shapes(const char* op, const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales,
                                 const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(q.scalar_type() == at::kChar && q.dim() == 2 && q.is_contiguous(), op, ": q must be contiguous int8 [N, K], got ",
              q.scalar_type(), " ", q.sizes());
  const int64_t N = q.size(0), K = q.size(1);
  check_common(op, x, K, N, bias);
  TORCH_CHECK(scales.dim() == 2 && scales.size(1) > 0, op, ": scales must be [N, K / group], got ", scales.sizes());
  const int64_t G = K / scales.size(1);
  check_scales(op, scales, N, K, G);
  return {N, K, G};
}

// The shapes of a 4-bit product's arguments, checked: {N, K, G}.
std::array<int64_t, 3> q4_shapes(const char* op, const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales,
                                 const at::Tensor& mins, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(q.scalar_type() == at::kByte && q.dim() == 2 && q.is_contiguous(), op, ": q must be contiguous uint8 [N, K / 2], got ",
              q.scalar_type(), " ", q.sizes());
  const int64_t N = q.size(0), K = q.size(1) * 2;
  check_common(op, x, K, N, bias);
  TORCH_CHECK(scales.dim() == 2 && scales.size(1) > 0, op, ": scales must be [N, K / group], got ", scales.sizes());
  const int64_t G = K / scales.size(1);
  check_scales(op, scales, N, K, G);
  TORCH_CHECK(mins.sizes() == scales.sizes() && mins.scalar_type() == scales.scalar_type() && mins.is_contiguous(),
              op, ": mins must match scales (", scales.scalar_type(), " ", scales.sizes(), "), got ", mins.scalar_type(), " ",
              mins.sizes());
  return {N, K, G};
}

// Runs row_fn(n, x_rows, M, out) over output rows in parallel; x is [M, K] contiguous.
template <typename RowFn>
at::Tensor run_rows(const at::Tensor& x_in, int64_t N, int64_t K, const c10::optional<at::Tensor>& bias, RowFn row_fn) {
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = out_like(x, N);
  const int64_t M = x.numel() / K;
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float* bp = bias.has_value() ? bias->contiguous().data_ptr<float>() : nullptr;
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> row(M > 1 ? K : 0);
    for (int64_t n = begin; n < end; ++n) {
      row_fn(n, xp, M, op, row.data());
      if (bp) for (int64_t m = 0; m < M; ++m) op[m * N + n] += bp[n];
    }
  });
  return out;
}

// The int8 product for one scale type S (float or c10::Half).
template <typename S>
at::Tensor q8_typed(const at::Tensor& x, const int8_t* qp, const S* sp, const c10::optional<at::Tensor>& bias,
                    int64_t N, int64_t K, int64_t G) {
  const int64_t KG = K / G;
  return run_rows(x, N, K, bias, [&](int64_t n, const float* xp, int64_t M, float* op, float* row) {
    if (M == 1) {
#ifdef FUELPIPE_AVX2
      if (G == 32) { op[n] = q8_row32<S>(qp + n * K, sp + n * KG, xp, KG); return; }
#endif
      float sb[kMaxGroups];
      op[n] = dot_q8(qp + n * K, row_f32<S>(sp + n * KG, KG, sb), xp, K, G);
      return;
    }
    dequant_row_q8<S>(qp + n * K, sp + n * KG, K, G, row);
    for (int64_t m = 0; m < M; ++m) op[m * N + n] = dot_f32(row, xp + m * K, K);
  });
}

// The 4-bit product for one scale type S; xs holds each activation row's sums over each group.
template <typename S>
at::Tensor q4_typed(const at::Tensor& x, const uint8_t* qp, const S* sp, const S* mp, const float* xs,
                    const c10::optional<at::Tensor>& bias, int64_t N, int64_t K, int64_t G) {
  const int64_t KG = K / G;
  return run_rows(x, N, K, bias, [&](int64_t n, const float* xp, int64_t M, float* op, float* row) {
    if (M == 1) {
#ifdef FUELPIPE_AVX2
      if (G == 32) { op[n] = q4_row32<S>(qp + n * (K / 2), sp + n * KG, mp + n * KG, xp, xs, KG); return; }
#endif
      float sb[kMaxGroups], mb[kMaxGroups];
      op[n] = dot_q4(qp + n * (K / 2), row_f32<S>(sp + n * KG, KG, sb), row_f32<S>(mp + n * KG, KG, mb), xp, xs, K, G);
      return;
    }
    dequant_row_q4<S>(qp + n * (K / 2), sp + n * KG, mp + n * KG, K, G, row);
    for (int64_t m = 0; m < M; ++m) op[m * N + n] = dot_f32(row, xp + m * K, K);
  });
}

at::Tensor q8_gemv(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales, const c10::optional<at::Tensor>& bias) {
  const auto shape = q8_shapes("q8_gemv", x, q, scales, bias);
  const int64_t N = shape[0], K = shape[1], G = shape[2];
  const int8_t* qp = q.data_ptr<int8_t>();
  if (scales.scalar_type() == at::kFloat) return q8_typed(x, qp, scales.data_ptr<float>(), bias, N, K, G);
  return q8_typed(x, qp, scales.data_ptr<c10::Half>(), bias, N, K, G);
}

at::Tensor q4_gemv(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales, const at::Tensor& mins,
                   const c10::optional<at::Tensor>& bias) {
  const auto shape = q4_shapes("q4_gemv", x, q, scales, mins, bias);
  const int64_t N = shape[0], K = shape[1], G = shape[2];
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.numel() / K;
  // Sum of each activation row over each group: the mins' share of every output row.
  std::vector<float> xsum(M * (K / G), 0.f);  // [M, K / G]
  const float* xin = xc.data_ptr<float>();
  for (int64_t i = 0; i < M * (K / G); ++i) {
    float t = 0.f;
    for (int64_t j = 0; j < G; ++j) t += xin[i * G + j];
    xsum[i] = t;
  }
  const uint8_t* qp = q.data_ptr<uint8_t>();
  if (scales.scalar_type() == at::kFloat)
    return q4_typed(xc, qp, scales.data_ptr<float>(), mins.data_ptr<float>(), xsum.data(), bias, N, K, G);
  return q4_typed(xc, qp, scales.data_ptr<c10::Half>(), mins.data_ptr<c10::Half>(), xsum.data(), bias, N, K, G);
}

at::Tensor bf16_gemv(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.dim() == 2 && w.is_contiguous(), "bf16_gemv: w must be contiguous bfloat16 [N, K], got ",
              w.scalar_type(), " ", w.sizes());
  const int64_t N = w.size(0), K = w.size(1);
  check_common("bf16_gemv", x, K, N, bias);
  const c10::BFloat16* wp = w.data_ptr<c10::BFloat16>();
  return run_rows(x, N, K, bias, [&](int64_t n, const float* xp, int64_t M, float* op, float* row) {
    if (M == 1) { op[n] = dot_bf16(wp + n * K, xp, K); return; }
    dequant_row_bf16(wp + n * K, K, row);
    for (int64_t m = 0; m < M; ++m) op[m * N + n] = dot_f32(row, xp + m * K, K);
  });
}

// ---- 16-bit activations: integer dot products (activations=int16) ----------------------------------
//
// Each activation row is quantized per 32-element block, symmetrically to 16 bits:
//   dx[b] = max|x[b*32 .. b*32+31]| / 32767,  xq[k] = round_half_even(x[k] / dx[b])   (0 where dx = 0)
// which is fuelpipe.quant.formats.quantize_activations, element for element. A block's products are
// then summed exactly in int32 (int8 or 4-bit codes times int16: at most 32 * 127 * 32767 < 2^31)
// and scaled once: for int8, sum_b w_scale * dx[b] * sum(q * xq); for 4-bit, the same plus
// min * dx[b] * sum(xq). So the result is F.linear(round_trip_activations(x), dequantize(w)) up to
// the order of f32 additions, with one rounding per block instead of one per product; relative to
// f32 activations each element moves by at most half a step, max|x of its block| / 65534.
// Integer products halve the vector work per weight against widening every weight to f32, which is
// what kept the f32-activation kernels below the memory bandwidth (experiments/bench_peers_quant_cpu).
// Every activation row takes the same per-row function, so a row's result does not depend on how
// many rows are in the call (a batch row equals the same row decoded alone, bit for bit).

constexpr int64_t kBlock = 32;

inline float scale_f32(float v) { return v; }
inline float scale_f32(c10::Half v) {
#ifdef FUELPIPE_AVX2
  return _cvtsh_ss(v.x);  // F16C: one instruction
#else
  return static_cast<float>(v);
#endif
}

// Weights are read once per token, straight from DRAM: each row loop asks for the bytes 1 KiB ahead.
// Measured here (AMD EPYC, one process, interleaved): int8 rows 0.87-0.88x the time without it; 256 and
// 512 bytes helped less, 2-4 KiB no more.
constexpr int64_t kPrefetchBytes = 1024;

#ifdef FUELPIPE_AVX2
// sc[b] = w_scale[b] * dx[b] for the nb blocks of one row (group size 32).
template <typename S>
inline void block_scales(const S* s, const float* dx, int64_t nb, float* sc) {
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    __m256 w;
    if constexpr (std::is_same_v<S, float>) w = _mm256_loadu_ps(s + b);
    else w = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + b)));
    _mm256_store_ps(sc + b, _mm256_mul_ps(w, _mm256_loadu_ps(dx + b)));
  }
  for (; b < nb; ++b) sc[b] = scale_f32(s[b]) * dx[b];
}
#endif

// One activation row -> xq [K] int16, dx [K / 32] f32, xs [K / 32] f32 (dx * sum(xq): the block's
// sum as the kernel sees it, for the 4-bit mins). A non-finite element makes its block's dx NaN.
void quantize_row_a16(const float* x, int64_t K, int16_t* xq, float* dx, float* xs) {
  for (int64_t b = 0; b < K / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    float amax = 0.f;
    bool finite = true;
    for (int j = 0; j < kBlock; ++j) {
      const float a = std::fabs(xb[j]);
      finite = finite && std::isfinite(a);
      amax = a > amax ? a : amax;
    }
    const float d = finite ? amax / 32767.f : std::numeric_limits<float>::quiet_NaN();
    int32_t total = 0;
    for (int j = 0; j < kBlock; ++j) {
      float r = (d > 0.f) ? std::nearbyint(xb[j] / d) : 0.f;  // round half to even (the default mode)
      r = r > 32767.f ? 32767.f : (r < -32767.f ? -32767.f : r);
      xq[b * kBlock + j] = static_cast<int16_t>(r);
      total += static_cast<int32_t>(r);
    }
    dx[b] = d;
    xs[b] = d * static_cast<float>(total);
  }
}

#ifdef FUELPIPE_AVX2
// 32 int8 weights times 32 int16 activations: 8 int32 lanes summing to the block's exact dot product.
__attribute__((always_inline)) inline __m256i q8_block_a16(const int8_t* qb, const int16_t* xb) {
  const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qb)));
  const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qb + 16)));
  return _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb))),
                          _mm256_madd_epi16(w1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 16))));
}
// 16 bytes of 4-bit codes (block order: byte j holds elements j and j + 16) times 32 int16 activations
// stored in the order the unpacking produces (permute_for_q4): the 16 bytes go to both 128-bit lanes, the
// upper lane shifted right by 4, so lane 0 holds elements 0..15 and lane 1 elements 16..31 as bytes;
// interleaving with zero bytes then gives int16 elements [0..7 | 16..23] and [8..15 | 24..31].
__attribute__((always_inline)) inline __m256i q4_block_a16(const uint8_t* qb, const int16_t* xb) {
  const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qb)));
  const __m256i codes = _mm256_and_si256(_mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),
                                         _mm256_set1_epi8(0x0F));
  const __m256i zero = _mm256_setzero_si256();
  return _mm256_add_epi32(
      _mm256_madd_epi16(_mm256_unpacklo_epi8(codes, zero), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb))),
      _mm256_madd_epi16(_mm256_unpackhi_epi8(codes, zero), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 16))));
}

// Reorders each 32-element block of int16 activations for q4_block_a16: [0..7, 16..23, 8..15, 24..31].
void permute_for_q4(int16_t* xq, int64_t n) {
  int16_t tmp[kBlock];
  for (int64_t b = 0; b < n / kBlock; ++b) {
    int16_t* x = xq + b * kBlock;
    for (int j = 0; j < 8; ++j) {
      tmp[j] = x[j];
      tmp[8 + j] = x[16 + j];
      tmp[16 + j] = x[8 + j];
      tmp[24 + j] = x[24 + j];
    }
    std::memcpy(x, tmp, sizeof(tmp));
  }
}
#endif

inline int32_t q8_block_a16_scalar(const int8_t* qb, const int16_t* xb) {
  int32_t t = 0;
  for (int j = 0; j < kBlock; ++j) t += static_cast<int32_t>(qb[j]) * xb[j];
  return t;
}
inline int32_t q4_block_a16_scalar(const uint8_t* qb, const int16_t* xb) {
  int32_t t = 0;
  for (int j = 0; j < 16; ++j) t += static_cast<int32_t>(qb[j] & 0x0F) * xb[j] + static_cast<int32_t>(qb[j] >> 4) * xb[j + 16];
  return t;
}

// One weight row (int8 codes q [K], scales s [K / G]) against one quantized activation row.
// Scale of block b: w_scale[b / per_group] * dx[b]. Group size 32 (every GGUF block, the default) takes a
// loop with no group bookkeeping, unrolled by two into independent chains.
template <typename S>
float q8_row_a16(const int8_t* q, const S* s, int64_t K, int64_t G, const int16_t* xq, const float* dx) {
  const int64_t nb = K / kBlock, per_group = G / kBlock;
#ifdef FUELPIPE_AVX2
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  if (per_group == 1) {
    alignas(32) float sc[kMaxGroups];  // block scales: w_scale[b] * dx[b], 8 at a time
    block_scales(s, dx, nb, sc);
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
      _mm_prefetch(reinterpret_cast<const char*>(q + b * kBlock) + kPrefetchBytes, _MM_HINT_T0);
      a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_block_a16(q + b * kBlock, xq + b * kBlock)), _mm256_broadcast_ss(sc + b), a0);
      a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_block_a16(q + (b + 1) * kBlock, xq + (b + 1) * kBlock)),
                           _mm256_broadcast_ss(sc + b + 1), a1);
    }
    if (b < nb)
      a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_block_a16(q + b * kBlock, xq + b * kBlock)), _mm256_broadcast_ss(sc + b), a0);
    return hsum(_mm256_add_ps(a0, a1));
  }
  for (int64_t g = 0, b = 0; g < K / G; ++g) {
    const float sg = scale_f32(s[g]);
    for (int64_t j = 0; j < per_group; ++j, ++b) {
      const __m256 part = _mm256_cvtepi32_ps(q8_block_a16(q + b * kBlock, xq + b * kBlock));
      if (j & 1) a1 = _mm256_fmadd_ps(part, _mm256_set1_ps(sg * dx[b]), a1);
      else a0 = _mm256_fmadd_ps(part, _mm256_set1_ps(sg * dx[b]), a0);
    }
  }
  return hsum(_mm256_add_ps(a0, a1));
#else
  float acc = 0.f;
  for (int64_t g = 0, b = 0; g < K / G; ++g) {
    const float sg = scale_f32(s[g]);
    for (int64_t j = 0; j < per_group; ++j, ++b)
      acc += static_cast<float>(q8_block_a16_scalar(q + b * kBlock, xq + b * kBlock)) * (sg * dx[b]);
  }
  return acc;
#endif
}

template <typename S>
float q4_row_a16(const uint8_t* q, const S* s, const S* mn, int64_t K, int64_t G, const int16_t* xq, const float* dx,
                 const float* xs) {
  const int64_t nb = K / kBlock, per_group = G / kBlock;
  float macc = 0.f;  // the mins' share: min[g] * (sum of the group's quantized activations)
#ifdef FUELPIPE_AVX2
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  if (per_group == 1) {
    alignas(32) float sc[kMaxGroups], mins[kMaxGroups];
    block_scales(s, dx, nb, sc);
    const float* m = row_f32<S>(mn, nb, mins);
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
      _mm_prefetch(reinterpret_cast<const char*>(q + b * (kBlock / 2)) + kPrefetchBytes, _MM_HINT_T0);
      a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_block_a16(q + b * (kBlock / 2), xq + b * kBlock)), _mm256_broadcast_ss(sc + b), a0);
      a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_block_a16(q + (b + 1) * (kBlock / 2), xq + (b + 1) * kBlock)),
                           _mm256_broadcast_ss(sc + b + 1), a1);
    }
    if (b < nb)
      a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_block_a16(q + b * (kBlock / 2), xq + b * kBlock)), _mm256_broadcast_ss(sc + b), a0);
    return hsum(_mm256_add_ps(a0, a1)) + dot_f32(m, xs, nb);
  }
  for (int64_t g = 0, b = 0; g < K / G; ++g) {
    const float sg = scale_f32(s[g]);
    float group_sum = 0.f;
    for (int64_t j = 0; j < per_group; ++j, ++b) {
      const __m256 part = _mm256_cvtepi32_ps(q4_block_a16(q + b * (kBlock / 2), xq + b * kBlock));
      if (j & 1) a1 = _mm256_fmadd_ps(part, _mm256_set1_ps(sg * dx[b]), a1);
      else a0 = _mm256_fmadd_ps(part, _mm256_set1_ps(sg * dx[b]), a0);
      group_sum += xs[b];
    }
    macc += scale_f32(mn[g]) * group_sum;
  }
  return hsum(_mm256_add_ps(a0, a1)) + macc;
#else
  float acc = 0.f;
  for (int64_t g = 0, b = 0; g < K / G; ++g) {
    const float sg = scale_f32(s[g]);
    float group_sum = 0.f;
    for (int64_t j = 0; j < per_group; ++j, ++b) {
      acc += static_cast<float>(q4_block_a16_scalar(q + b * (kBlock / 2), xq + b * kBlock)) * (sg * dx[b]);
      group_sum += xs[b];
    }
    macc += scale_f32(mn[g]) * group_sum;
  }
  return acc + macc;
#endif
}

// Quantizes every activation row, then runs row_fn(n, m, xq_row, dx_row, xs_row) for each output.
// q4_order: lay each block out for q4_block_a16 (the AVX2 4-bit path).
template <typename RowFn>
at::Tensor run_rows_a16(const at::Tensor& x_in, int64_t N, int64_t K, const c10::optional<at::Tensor>& bias, bool q4_order,
                        RowFn row_fn) {
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = out_like(x, N);
  const int64_t M = x.numel() / K, nb = K / kBlock;
  std::vector<int16_t> xq(M * K);
  std::vector<float> dx(M * nb), xs(M * nb);
  const float* xp = x.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) quantize_row_a16(xp + m * K, K, xq.data() + m * K, dx.data() + m * nb, xs.data() + m * nb);
#ifdef FUELPIPE_AVX2
  if (q4_order) permute_for_q4(xq.data(), M * K);
#endif
  float* op = out.data_ptr<float>();
  const float* bp = bias.has_value() ? bias->contiguous().data_ptr<float>() : nullptr;
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n)
      for (int64_t m = 0; m < M; ++m) {
        float v = row_fn(n, xq.data() + m * K, dx.data() + m * nb, xs.data() + m * nb);
        op[m * N + n] = bp ? v + bp[n] : v;
      }
  });
  return out;
}

at::Tensor q8_gemv_a16(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales, const c10::optional<at::Tensor>& bias) {
  const auto shape = q8_shapes("q8_gemv_a16", x, q, scales, bias);
  const int64_t N = shape[0], K = shape[1], G = shape[2], KG = K / G;
  const int8_t* qp = q.data_ptr<int8_t>();
  auto typed = [&](auto* sp) {
    return run_rows_a16(x, N, K, bias, false, [&](int64_t n, const int16_t* xq, const float* dx, const float*) {
      return q8_row_a16(qp + n * K, sp + n * KG, K, G, xq, dx);
    });
  };
  if (scales.scalar_type() == at::kFloat) return typed(scales.data_ptr<float>());
  return typed(scales.data_ptr<c10::Half>());
}

at::Tensor q4_gemv_a16(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales, const at::Tensor& mins,
                       const c10::optional<at::Tensor>& bias) {
  const auto shape = q4_shapes("q4_gemv_a16", x, q, scales, mins, bias);
  const int64_t N = shape[0], K = shape[1], G = shape[2], KG = K / G;
  const uint8_t* qp = q.data_ptr<uint8_t>();
  auto typed = [&](auto* sp, auto* mp) {
    return run_rows_a16(x, N, K, bias, true, [&](int64_t n, const int16_t* xq, const float* dx, const float* xs) {
      return q4_row_a16(qp + n * (K / 2), sp + n * KG, mp + n * KG, K, G, xq, dx, xs);
    });
  };
  if (scales.scalar_type() == at::kFloat) return typed(scales.data_ptr<float>(), mins.data_ptr<float>());
  return typed(scales.data_ptr<c10::Half>(), mins.data_ptr<c10::Half>());
}

bool has_avx2() {
#ifdef FUELPIPE_AVX2
  return true;
#else
  return false;
#endif
}

}  // namespace

TORCH_LIBRARY(fuelpipe_kernels, m) {
  m.def("q8_gemv(Tensor x, Tensor q, Tensor scales, Tensor? bias) -> Tensor");
  m.def("q4_gemv(Tensor x, Tensor q, Tensor scales, Tensor mins, Tensor? bias) -> Tensor");
  m.def("q8_gemv_a16(Tensor x, Tensor q, Tensor scales, Tensor? bias) -> Tensor");
  m.def("q4_gemv_a16(Tensor x, Tensor q, Tensor scales, Tensor mins, Tensor? bias) -> Tensor");
  m.def("bf16_gemv(Tensor x, Tensor w, Tensor? bias) -> Tensor");
  m.def("vector_path() -> str");
}

TORCH_LIBRARY_IMPL(fuelpipe_kernels, CPU, m) {
  m.impl("q8_gemv", q8_gemv);
  m.impl("q4_gemv", q4_gemv);
  m.impl("q8_gemv_a16", q8_gemv_a16);
  m.impl("q4_gemv_a16", q4_gemv_a16);
  m.impl("bf16_gemv", bf16_gemv);
}

TORCH_LIBRARY_IMPL(fuelpipe_kernels, CompositeExplicitAutograd, m) {
  m.impl("vector_path", []() -> std::string { return has_avx2() ? "avx2" : "scalar"; });
}
