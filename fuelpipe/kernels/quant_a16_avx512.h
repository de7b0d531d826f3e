// The AVX-512 path of the 16-bit-activation products (quant_a16.cpp has the others and the operators): a whole
// 32-element block per 512-bit multiply-add (16 int32 lanes), scaled in 16 f32 lanes, two chains.
#pragma once

#include <cstdint>

#include "quant_common.h"

namespace fuelpipe_quant {

#ifdef FUELPIPE_HAS_AVX512

// 32 int8 weights times 32 int16 activations (element order): 16 int32 lanes summing to the block's dot product.
__attribute__((always_inline)) inline __m512i q8_block_512(const int8_t* qb, const int16_t* xb) {
  const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb)));
  return _mm512_madd_epi16(w, _mm512_loadu_si512(xb));
}
// 16 bytes of 4-bit codes widened twice to 16 bits ([b0..b15, b0..b15]); the upper half shifted right by 4:
// element order (low nibbles are elements 0..15, high nibbles 16..31), so the activations need no permutation.
__attribute__((always_inline)) inline __m512i q4_block_512(const uint8_t* qb, const int16_t* xb, __m512i shifts) {
  const __m512i twice = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qb))));
  const __m512i codes = _mm512_and_si512(_mm512_srlv_epi16(twice, shifts), _mm512_set1_epi16(0x0F));
  return _mm512_madd_epi16(codes, _mm512_loadu_si512(xb));
}
inline __m512i q4_shifts() { return _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1); }

template <typename S>
inline float q8_row_avx512(const int8_t* q, const S* s, int64_t K, int64_t G, const int16_t* xq, const float* dx) {
  const int64_t nb = K / kBlock, per_group = G / kBlock;
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  if (per_group == 1) {
    alignas(32) float sc[kMaxGroups];
    block_scales(s, dx, nb, sc);
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
      _mm_prefetch(reinterpret_cast<const char*>(q + b * kBlock) + kPrefetchBytes, _MM_HINT_T0);
      a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q8_block_512(q + b * kBlock, xq + b * kBlock)), _mm512_set1_ps(sc[b]), a0);
      a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q8_block_512(q + (b + 1) * kBlock, xq + (b + 1) * kBlock)),
                           _mm512_set1_ps(sc[b + 1]), a1);
    }
    if (b < nb) a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q8_block_512(q + b * kBlock, xq + b * kBlock)), _mm512_set1_ps(sc[b]), a0);
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  }
  for (int64_t g = 0, b = 0; g < K / G; ++g) {
    const float sg = to_f32(s[g]);
    for (int64_t j = 0; j < per_group; ++j, ++b) {
      const __m512 part = _mm512_cvtepi32_ps(q8_block_512(q + b * kBlock, xq + b * kBlock));
      if (j & 1) a1 = _mm512_fmadd_ps(part, _mm512_set1_ps(sg * dx[b]), a1);
      else a0 = _mm512_fmadd_ps(part, _mm512_set1_ps(sg * dx[b]), a0);
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

template <typename S>
inline float q4_row_avx512(const uint8_t* q, const S* s, const S* mn, int64_t K, int64_t G, const int16_t* xq, const float* dx,
                    const float* xs) {
  const int64_t nb = K / kBlock, per_group = G / kBlock;
  const __m512i shifts = q4_shifts();
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  if (per_group == 1) {
    alignas(32) float sc[kMaxGroups], mins[kMaxGroups];
    block_scales(s, dx, nb, sc);
    const float* m = row_f32<S>(mn, nb, mins);
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
      _mm_prefetch(reinterpret_cast<const char*>(q + b * (kBlock / 2)) + kPrefetchBytes, _MM_HINT_T0);
      a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q4_block_512(q + b * (kBlock / 2), xq + b * kBlock, shifts)),
                           _mm512_set1_ps(sc[b]), a0);
      a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q4_block_512(q + (b + 1) * (kBlock / 2), xq + (b + 1) * kBlock, shifts)),
                           _mm512_set1_ps(sc[b + 1]), a1);
    }
    if (b < nb)
      a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q4_block_512(q + b * (kBlock / 2), xq + b * kBlock, shifts)),
                           _mm512_set1_ps(sc[b]), a0);
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) + dot_f32(m, xs, nb);
  }
  float macc = 0.f;
  for (int64_t g = 0, b = 0; g < K / G; ++g) {
    const float sg = to_f32(s[g]);
    float group_sum = 0.f;
    for (int64_t j = 0; j < per_group; ++j, ++b) {
      const __m512 part = _mm512_cvtepi32_ps(q4_block_512(q + b * (kBlock / 2), xq + b * kBlock, shifts));
      if (j & 1) a1 = _mm512_fmadd_ps(part, _mm512_set1_ps(sg * dx[b]), a1);
      else a0 = _mm512_fmadd_ps(part, _mm512_set1_ps(sg * dx[b]), a0);
      group_sum += xs[b];
    }
    macc += to_f32(mn[g]) * group_sum;
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) + macc;
}
#endif  // FUELPIPE_HAS_AVX512

}  // namespace fuelpipe_quant
