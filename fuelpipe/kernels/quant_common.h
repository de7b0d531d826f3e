// What the low-bit products share: argument checks (each naming its operator), scale conversion, and the
// f32 dot product. quant_gemv.cpp (f32 activations), quant_a16.cpp (16-bit) and quant_a8.cpp (8-bit) include it.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Half.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "vector_path.h"

#ifdef FUELPIPE_HAS_AVX2
#include <immintrin.h>
#endif

namespace fuelpipe_quant {

using fuelpipe_isa::at_least;
using fuelpipe_isa::Path;

constexpr int64_t kMaxGroups = 4096;  // groups per row (K / G): 131072 inputs at group 32

inline float to_f32(float v) { return v; }
inline float to_f32(c10::Half v) { return static_cast<float>(v); }

#ifdef FUELPIPE_HAS_AVX2
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

// Scales (and mins) of one row as f32: f16 rows are converted 8 at a time with F16C, not one by one.
template <typename S>
const float* row_f32(const S* src, int64_t n, float* buf) {
  if constexpr (std::is_same_v<S, float>) {
    return src;
  } else {
    int64_t i = 0;
#ifdef FUELPIPE_HAS_AVX2
    if (at_least(Path::avx2))
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(buf + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
    for (; i < n; ++i) buf[i] = static_cast<float>(src[i]);
    return buf;
  }
}

inline float dot_f32(const float* a, const float* b, int64_t K) {
#ifdef FUELPIPE_HAS_AVX2
  if (at_least(Path::avx2)) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
      acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), acc1);
    }
    float s = hsum(_mm256_add_ps(acc0, acc1));
    for (; k < K; ++k) s += a[k] * b[k];
    return s;
  }
#endif
  float s = 0.f;
  for (int64_t k = 0; k < K; ++k) s += a[k] * b[k];
  return s;
}

// ---- 16-bit activations: the block every path works in ---------------------------------------------

constexpr int64_t kBlock = 32;

// One block's exact int32 dot product, int8 weights or 4-bit codes against integer activation codes (int16 or
// int8): the scalar paths' statement of what the vector paths' integer part computes.
template <typename Code>
inline int32_t q8_block_scalar(const int8_t* qb, const Code* xb) {
  int32_t t = 0;
  for (int j = 0; j < kBlock; ++j) t += static_cast<int32_t>(qb[j]) * xb[j];
  return t;
}
// 16 bytes of 4-bit codes: byte j holds elements j (low nibble) and j + 16 (high nibble).
template <typename Code>
inline int32_t q4_block_scalar(const uint8_t* qb, const Code* xb) {
  int32_t t = 0;
  for (int j = 0; j < 16; ++j) t += static_cast<int32_t>(qb[j] & 0x0F) * xb[j] + static_cast<int32_t>(qb[j] >> 4) * xb[j + 16];
  return t;
}

// One activation row -> codes xq [K] in -levels..levels, steps dx [K / 32], and xs [K / 32] (dx * sum of the
// block's codes: the block's sum as the kernel sees it, for the 4-bit mins). Per block:
//   dx[b] = max|x[b*32 .. b*32+31]| / levels,  xq[k] = round_half_even(x[k] / dx[b])   (0 where dx = 0)
// which is fuelpipe.quant.formats.quantize_activations, element for element. A non-finite element makes its
// block's dx NaN.
template <typename Code>
void quantize_row_blocks(const float* x, int64_t K, float levels, Code* xq, float* dx, float* xs) {
  for (int64_t b = 0; b < K / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    float amax = 0.f;
    bool finite = true;
    for (int j = 0; j < kBlock; ++j) {
      const float a = std::fabs(xb[j]);
      finite = finite && std::isfinite(a);
      amax = a > amax ? a : amax;
    }
    const float d = finite ? amax / levels : std::numeric_limits<float>::quiet_NaN();
    int32_t total = 0;
    for (int j = 0; j < kBlock; ++j) {
      float r = (d > 0.f) ? std::nearbyint(xb[j] / d) : 0.f;  // round half to even (the default mode)
      r = r > levels ? levels : (r < -levels ? -levels : r);
      xq[b * kBlock + j] = static_cast<Code>(r);
      total += static_cast<int32_t>(r);
    }
    dx[b] = d;
    xs[b] = d * static_cast<float>(total);
  }
}

// Weights are read once per token, straight from DRAM: each row loop asks for the bytes 1 KiB ahead.
// Measured here (AMD EPYC, one process, interleaved): int8 rows 0.87-0.88x the time without it; 256 and
// 512 bytes helped less, 2-4 KiB no more.
constexpr int64_t kPrefetchBytes = 1024;

#ifdef FUELPIPE_HAS_AVX2
// sc[b] = w_scale[b] * dx[b] for the nb blocks of one row (group size 32).
template <typename S>
inline void block_scales(const S* s, const float* dx, int64_t nb, float* sc) {
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    __m256 w;
    if constexpr (std::is_same_v<S, float>) w = _mm256_loadu_ps(s + b);
    else w = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + b)));
    _mm256_storeu_ps(sc + b, _mm256_mul_ps(w, _mm256_loadu_ps(dx + b)));
  }
  for (; b < nb; ++b) sc[b] = to_f32(s[b]) * dx[b];
}

#endif

// ---- argument checks ------------------------------------------------------------------------------

inline void check_common(const char* op, const at::Tensor& x, int64_t K, int64_t N, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu(), op, ": x must be on the CPU, got ", x.device());
  TORCH_CHECK(x.scalar_type() == at::kFloat, op, ": x must be float32 (activations stay f32), got ", x.scalar_type());
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == K, op, ": x's last dimension must be in_features=", K, ", got shape ", x.sizes());
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->size(0) == N, op,
                ": bias must be float32 [", N, "], got ", bias->scalar_type(), " ", bias->sizes());
  }
}

inline void check_scales(const char* op, const at::Tensor& s, int64_t N, int64_t K, int64_t G) {
  TORCH_CHECK(G >= 32 && G % 32 == 0 && K % G == 0, op, ": group size must be a multiple of 32 dividing in_features=", K, ", got ", G);
  TORCH_CHECK(K / G <= kMaxGroups, op, ": at most ", kMaxGroups, " groups per row, got in_features=", K, " / group ", G);
  TORCH_CHECK(s.dim() == 2 && s.size(0) == N && s.size(1) == K / G && s.is_contiguous(), op,
              ": scales must be contiguous [", N, ", ", K / G, "], got ", s.sizes());
  TORCH_CHECK(s.scalar_type() == at::kHalf || s.scalar_type() == at::kFloat, op, ": scales must be float16 or float32, got ", s.scalar_type());
}

inline at::Tensor out_like(const at::Tensor& x, int64_t N) {
  auto sizes = x.sizes().vec();
  sizes.back() = N;
  return at::empty(sizes, x.options());
}

// The shapes of an int8 product's arguments, checked: {N, K, G}.
inline std::array<int64_t, 3> q8_shapes(const char* op, const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales,
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
inline std::array<int64_t, 3> q4_shapes(const char* op, const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales,
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

}  // namespace fuelpipe_quant
