// The f32 rows kernel's prompt recipe (f32_rows_chain_linear); included by f32_rows.cpp inside its anonymous
// namespace, after the Rows list of output rows.
#pragma once

// ---- the prompt recipe: one sequential chain per output, x packed k-major per call ----------------------
//
// For many rows of x (a prompt) the lane recipe re-reads x for every few weight rows. This recipe packs x
// once per call into xt [K, M8] (k-major, rows padded with zeros to a multiple of 8) and computes each
// output as one sequential multiply-add chain over k:
//     y[m, n] = fma(w[n, K-1], x[m, K-1], ... fma(w[n, 1], x[m, 1], w[n, 0] * x[m, 0]))  (+ bias[n])
// (the panel kernel's chain), broadcasting one weight at a time against 8 or 16 rows of x. A plan picks one
// recipe when it is built, so within a plan a row's result still does not depend on M or on the threads.

constexpr int kNr = 6;  // weight rows per tile: 12 accumulators + 2 x vectors + 1 broadcast

inline void store_cols(const float* acc, int64_t count, float* out, int64_t ldo, float bias) {
  for (int64_t j = 0; j < count; ++j) out[j * ldo] = acc[j] + bias;  // acc[j] is row m0 + j of column n
}

// NR weight rows (w[r], any addresses) against 8 * V packed rows of x starting at xt (row stride ld8).
template <int NR, int V>
void chain_tile(const float* const* w, const float* xt, int64_t ld8, int64_t K, float* out, int64_t ldo,
                const int64_t* col, int64_t mcount, const float* bias) {
#ifdef FUELPIPE_HAS_AVX2
  if (fuelpipe_isa::at_least(fuelpipe_isa::Path::avx2)) {
    __m256 acc[NR][V];
    for (int v = 0; v < V; ++v) {
      const __m256 xv = _mm256_loadu_ps(xt + 8 * v);
      for (int r = 0; r < NR; ++r) acc[r][v] = _mm256_mul_ps(_mm256_broadcast_ss(w[r]), xv);
    }
    for (int64_t k = 1; k < K; ++k) {
      __m256 xv[V];
      for (int v = 0; v < V; ++v) xv[v] = _mm256_loadu_ps(xt + k * ld8 + 8 * v);
      for (int r = 0; r < NR; ++r) {
        const __m256 wb = _mm256_broadcast_ss(w[r] + k);
        for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(wb, xv[v], acc[r][v]);
      }
    }
    // All accumulators out first, with no control flow among them: GCC keeps an array of vectors in
    // registers only when nothing indexes it conditionally (else it stores every one every k, ~2x slower).
    alignas(32) float lanes[NR][V][8];
    for (int r = 0; r < NR; ++r)
      for (int v = 0; v < V; ++v) _mm256_store_ps(lanes[r][v], acc[r][v]);
    for (int r = 0; r < NR; ++r)
      for (int v = 0; v < V; ++v) {
        const int64_t count = std::min<int64_t>(8, mcount - 8 * v);
        if (count > 0) store_cols(lanes[r][v], count, out + 8 * v * ldo + col[r], ldo, bias ? bias[col[r]] : 0.0f);
      }
    return;
  }
#endif
  for (int r = 0; r < NR; ++r)
    for (int64_t j = 0; j < std::min<int64_t>(8 * V, mcount); ++j) {
      float s = w[r][0] * xt[j];
      for (int64_t k = 1; k < K; ++k) s = std::fma(w[r][k], xt[k * ld8 + j], s);
      out[j * ldo + col[r]] = bias ? s + bias[col[r]] : s;
    }
}

template <int NR>
void chain_rows(const float* const* w, const float* xt, int64_t M, int64_t ld8, int64_t K, float* out, int64_t ldo,
                const int64_t* col, const float* bias) {
  int64_t m = 0;
  for (; m + 16 <= ld8; m += 16) chain_tile<NR, 2>(w, xt + m, ld8, K, out + m * ldo, ldo, col, M - m, bias);
  if (m < ld8) chain_tile<NR, 1>(w, xt + m, ld8, K, out + m * ldo, ldo, col, M - m, bias);
}

void chain_block(const Rows& rows, int64_t n0, int64_t n1, const float* xt, int64_t M, int64_t ld8, int64_t K,
                 float* out, const float* bias) {
  const int64_t N = rows.first.back();
  const float* w[kNr];
  int64_t col[kNr];
  int64_t n = n0;
  for (; n + kNr <= n1; n += kNr) {
    for (int r = 0; r < kNr; ++r) {
      col[r] = n + r;
      w[r] = rows.row(n + r);
    }
    chain_rows<kNr>(w, xt, M, ld8, K, out, N, col, bias);
  }
  for (; n < n1; ++n) {
    const float* w1[1] = {rows.row(n)};
    const int64_t c1[1] = {n};
    chain_rows<1>(w1, xt, M, ld8, K, out, N, c1, bias);
  }
}
