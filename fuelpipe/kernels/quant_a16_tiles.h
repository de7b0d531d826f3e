// Several weight rows at once on the 256-bit paths (avx2, avx_vnni) of the 16-bit-activation products,
// group size 32: included by quant_a16.cpp after its one-row functions, whose arithmetic these repeat.
//
// A tile takes R weight rows against one activation row. Each block's activations are loaded once for the
// R rows, and the R rows' chains are independent, so the core overlaps R rows' block work where one row
// waits on its own two chains. Per row the arithmetic is exactly q8_row_avx2 / q4_row_avx2's (group 32):
// block b's int32 sum scaled by sc[b] into chain b % 2 in block order, then hsum(chain 0 + chain 1) (+ the
// mins' dot product for 4-bit), so a row's result is the same bits whether it runs in a tile or alone,
// whatever rows share its tile, and whatever M or the thread count are.
#pragma once

#ifdef FUELPIPE_HAS_AVX2

// The chains of R rows over nb blocks: block b's int32 sum (block_sum(r, b, x0, x1), x0 / x1 the block's two
// halves of activations, loaded once for the R rows) scaled by sc[r * nb + b] into chain b % 2 of row r.
template <int R, typename BlockSum>
__attribute__((always_inline)) inline void tile_chains(const int16_t* xq, int64_t nb, const float* sc, __m256 (&acc)[R][2],
                                                       BlockSum block_sum) {
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * kBlock));
    const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * kBlock + 16));
    const int chain = static_cast<int>(b & 1);
    for (int r = 0; r < R; ++r) {
      const __m256i sum = block_sum(r, b, chain == 0, x0, x1);
      acc[r][chain] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_broadcast_ss(sc + r * nb + b), acc[r][chain]);
    }
  }
}

// R int8 rows q[r] [K] with scales s[r] [K / 32] against xq [K] (dx [K / 32]) -> out[r]. sc: R * K / 32 floats.
template <bool kVnni, typename S, int R>
void q8_tile_avx2(const int8_t* const* q, const S* const* s, int64_t K, const int16_t* xq, const float* dx, float* sc,
                  float* out) {
  const int64_t nb = K / kBlock;
  for (int r = 0; r < R; ++r) block_scales(s[r], dx, nb, sc + r * nb);
  __m256 acc[R][2];
  tile_chains<R>(xq, nb, sc, acc, [&](int r, int64_t b, bool prefetch, __m256i x0, __m256i x1) {
    const int8_t* qb = q[r] + b * kBlock;
    if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(qb) + kPrefetchBytes, _MM_HINT_T0);
    const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qb)));
    const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qb + 16)));
    return madd_add<kVnni>(_mm256_madd_epi16(w0, x0), w1, x1);
  });
  for (int r = 0; r < R; ++r) out[r] = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
}

// R 4-bit rows q[r] [K / 2] with scales s[r] and mins mn[r] [K / 32] against xq (permuted for q4_block_a16),
// dx and xs [K / 32] -> out[r]. sc and mins: R * K / 32 floats each.
template <bool kVnni, typename S, int R>
void q4_tile_avx2(const uint8_t* const* q, const S* const* s, const S* const* mn, int64_t K, const int16_t* xq,
                  const float* dx, const float* xs, float* sc, float* mins, float* out) {
  const int64_t nb = K / kBlock;
  const float* m[R];
  for (int r = 0; r < R; ++r) {
    block_scales(s[r], dx, nb, sc + r * nb);
    m[r] = row_f32<S>(mn[r], nb, mins + r * nb);
  }
  const __m256i shifts = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4), low = _mm256_set1_epi8(0x0F);
  const __m256i zero = _mm256_setzero_si256();
  __m256 acc[R][2];
  tile_chains<R>(xq, nb, sc, acc, [&](int r, int64_t b, bool prefetch, __m256i x0, __m256i x1) {
    const uint8_t* qb = q[r] + b * (kBlock / 2);
    if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(qb) + kPrefetchBytes, _MM_HINT_T0);
    const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qb)));
    const __m256i codes = _mm256_and_si256(_mm256_srlv_epi32(both, shifts), low);
    return madd_add<kVnni>(_mm256_madd_epi16(_mm256_unpacklo_epi8(codes, zero), x0), _mm256_unpackhi_epi8(codes, zero), x1);
  });
  for (int r = 0; r < R; ++r) out[r] = hsum(_mm256_add_ps(acc[r][0], acc[r][1])) + dot_f32(m[r], xs, nb);
}

#endif  // FUELPIPE_HAS_AVX2
