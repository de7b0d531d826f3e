// The f32 rows kernel's AVX-512 tile for several rows of x; included by f32_rows.cpp inside its anonymous
// namespace, after kLanes, finish_sum(), tree_sum_avx2() and prefetch_rows() (its summation order: f32_rows.cpp's header comment).
#pragma once

#ifdef FUELPIPE_HAS_AVX512
// R weight rows against P pairs of x rows (xp: the packed pairs, pair p at xp + p * k8 * 2): R * P zmm
// accumulators, each lane half one row's eight-lane chain. Output (row, r) goes to out[row * ldo + col[r]].
template <int R, int P>
void pairs_tile_avx512(const float* const* w, const float* xp, const float* x, int64_t K, float* out, int64_t ldo,
                       const int64_t* col, const float* bias) {
  static_assert(R * P <= 24, "accumulators must fit the register file");
  const int64_t k8 = K / kLanes * kLanes;
  const int64_t ahead = prefetch_bytes.load(std::memory_order_relaxed);
  auto both_halves = [](const float* p) {  // eight floats in both 256-bit halves (AVX-512F only)
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(p))));
  };
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r) {
    const __m512 wv = both_halves(w[r]);
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_mul_ps(wv, _mm512_loadu_ps(xp + p * k8 * 2));
  }
  for (int64_t k = kLanes; k < k8; k += kLanes) {
    prefetch_rows<R>(w, k, ahead);
    __m512 xv[P];
    for (int p = 0; p < P; ++p) xv[p] = _mm512_loadu_ps(xp + p * k8 * 2 + 2 * k);
    for (int r = 0; r < R; ++r) {
      const __m512 wv = both_halves(w[r] + k);
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(wv, xv[p], acc[r][p]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) {
      const __m256 half[2] = {_mm512_castps512_ps256(acc[r][p]),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r][p]), 1))};
      for (int h = 0; h < 2; ++h) {
        const int64_t m = 2 * p + h;
        out[m * ldo + col[r]] = finish_sum(tree_sum_avx2(half[h]), w[r], x + m * K, k8, K, bias ? bias + col[r] : nullptr);
      }
    }
}
#endif
