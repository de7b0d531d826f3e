// Weight-only low-bit matrix products for decode: f32 activations times int8, 4-bit or bf16 weights
// (the 16-bit-activation products are in quant_a16.cpp). This file also defines the library and its
// vector-path operators (vector_path.h).
//
// Paths: scalar (the portable fallback and the readable statement of what every path computes) and avx2,
// taken at run time as vector_path.h chooses. The Python reference (fuelpipe.quant.formats.dequantize +
// F.linear) is what the tests compare against.
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

#include "quant_common.h"

namespace {

using namespace fuelpipe_quant;

// The index of a path this build and CPU run, by name; -1 if none.
int path_index(const std::string& name) {
  for (int i = 0; i < fuelpipe_isa::kPaths; ++i)
    if (name == fuelpipe_isa::kNames[i] && fuelpipe_isa::runnable(static_cast<fuelpipe_isa::Path>(i))) return i;
  return -1;
}

// Records the path measured fastest for a kernel with several (vector_path.h: Measured); "" forgets it.
void set_measured_path(const std::string& kernel, const std::string& name) {
  for (int k = 0; k < fuelpipe_isa::kMeasured; ++k) {
    if (kernel != fuelpipe_isa::kMeasuredNames[k]) continue;
    const int i = name.empty() ? -1 : path_index(name);
    TORCH_CHECK(name.empty() || i >= 0, "measured path for ", kernel, " must be one this CPU runs, got '", name, "'");
    fuelpipe_isa::measured_best[k].store(i);
    return;
  }
  TORCH_CHECK(false, "no measured path choice for kernel '", kernel, "'");
}

// The path a kernel takes now: its measured path for a Measured kernel, else the chosen path.
std::string kernel_path(const std::string& kernel) {
  for (int k = 0; k < fuelpipe_isa::kMeasured; ++k)
    if (kernel == fuelpipe_isa::kMeasuredNames[k])
      return fuelpipe_isa::kNames[static_cast<int>(fuelpipe_isa::path_for(static_cast<fuelpipe_isa::Measured>(k)))];
  return fuelpipe_isa::kNames[static_cast<int>(fuelpipe_isa::current())];
}

// Forces a path by name ("auto": the best this CPU runs, each measured kernel on its measured path); returns
// the setting before (a path's name, or "auto"), so restoring it restores the measured choices too. A name this
// build or CPU cannot run is refused, naming the value and the choices.
std::string set_vector_path(const std::string& name) {
  const std::string before =
      fuelpipe_isa::forced.load() ? fuelpipe_isa::kNames[static_cast<int>(fuelpipe_isa::current())] : "auto";
  if (name == "auto") {
    fuelpipe_isa::chosen.store(static_cast<int>(fuelpipe_isa::best()));
    fuelpipe_isa::forced.store(false);
    return before;
  }
  const int i = path_index(name);
  if (i >= 0) {
    fuelpipe_isa::chosen.store(i);
    fuelpipe_isa::forced.store(true);
    return before;
  }
  std::string choices;
  for (const auto& n : fuelpipe_isa::runnable_names()) choices += (choices.empty() ? "" : ", ") + n;
  TORCH_CHECK(false, "vector path must be one of [auto, ", choices, "] on this CPU and build, got '", name, "'");
  return before;
}

#ifdef FUELPIPE_HAS_AVX2
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

// ---- one weight row times one activation row, fused (decode: M == 1) -----------------------------

float dot_q8(const int8_t* q, const float* s, const float* x, int64_t K, int64_t G) {
#ifdef FUELPIPE_HAS_AVX2
  if (at_least(Path::avx2)) {
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
  }
#endif
  float acc = 0.f;
  for (int64_t g = 0; g < K / G; ++g) {
    float ga = 0.f;
    for (int64_t k = g * G; k < (g + 1) * G; ++k) ga += static_cast<float>(q[k]) * x[k];
    acc += ga * s[g];
  }
  return acc;
}

// xsum[g] = sum of x over group g: the min term of a whole group is min[g] * xsum[g].
float dot_q4(const uint8_t* q, const float* s, const float* mn, const float* x, const float* xsum, int64_t K, int64_t G) {
#ifdef FUELPIPE_HAS_AVX2
  if (at_least(Path::avx2)) {
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
  }
#endif
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
}

#ifdef FUELPIPE_HAS_AVX2
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
#ifdef FUELPIPE_HAS_AVX2
  if (at_least(Path::avx2)) {
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
  }
#endif
  float s = 0.f;
  for (int64_t k = 0; k < K; ++k) s += static_cast<float>(w[k]) * x[k];
  return s;
}

// ---- the operators ---------------------------------------------------------------------------------

// Runs row_fn(n, x_rows, M, out) over output rows in parallel; x is [M, K] contiguous.
template <typename RowFn>
at::Tensor run_rows(const at::Tensor& x_in, int64_t N, int64_t K, const c10::optional<at::Tensor>& bias, RowFn row_fn) {
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = out_like(x, N);
  const int64_t M = x.numel() / K;
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();  // kept alive for the pointer
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
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
#ifdef FUELPIPE_HAS_AVX2
      if (G == 32 && at_least(Path::avx2)) { op[n] = q8_row32<S>(qp + n * K, sp + n * KG, xp, KG); return; }
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
#ifdef FUELPIPE_HAS_AVX2
      if (G == 32 && at_least(Path::avx2)) { op[n] = q4_row32<S>(qp + n * (K / 2), sp + n * KG, mp + n * KG, xp, xs, KG); return; }
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

}  // namespace

TORCH_LIBRARY(fuelpipe_kernels, m) {
  m.def("q8_gemv(Tensor x, Tensor q, Tensor scales, Tensor? bias) -> Tensor");
  m.def("q4_gemv(Tensor x, Tensor q, Tensor scales, Tensor mins, Tensor? bias) -> Tensor");
  m.def("q8_gemv_a16(Tensor x, Tensor q, Tensor scales, Tensor? bias) -> Tensor");
  m.def("q4_gemv_a16(Tensor x, Tensor q, Tensor scales, Tensor mins, Tensor? bias) -> Tensor");
  m.def("q8_gemv_a8(Tensor x, Tensor q, Tensor scales, Tensor? bias) -> Tensor");
  m.def("q4_gemv_a8(Tensor x, Tensor q, Tensor scales, Tensor mins, Tensor? bias) -> Tensor");
  m.def("bf16_gemv(Tensor x, Tensor w, Tensor? bias) -> Tensor");
  m.def("vector_path() -> str");
  m.def("vector_paths() -> str[]");
  m.def("set_vector_path(str path) -> str");
  m.def("set_measured_path(str kernel, str path) -> ()");
  m.def("kernel_path(str kernel) -> str");
}

TORCH_LIBRARY_IMPL(fuelpipe_kernels, CPU, m) {
  m.impl("q8_gemv", q8_gemv);
  m.impl("q4_gemv", q4_gemv);
  m.impl("bf16_gemv", bf16_gemv);
}

TORCH_LIBRARY_IMPL(fuelpipe_kernels, CompositeExplicitAutograd, m) {
  m.impl("vector_path", []() -> std::string { return fuelpipe_isa::kNames[static_cast<int>(fuelpipe_isa::current())]; });
  m.impl("vector_paths", []() -> std::vector<std::string> { return fuelpipe_isa::runnable_names(); });
  m.impl("set_vector_path", set_vector_path);
  m.impl("set_measured_path", set_measured_path);
  m.impl("kernel_path", kernel_path);
}
