// f32 linear layers for decode and batch steps: x [M, K] times a weight packed into column panels.
//
// Packed layout (fuelpipe.plan.panels.pack_panels is the readable statement of it): the weight
// [N, K] is zero-padded to a multiple of 16 output rows and stored as panels [N16 / 16, K, 16]:
// panel p, row k holds w[16p .. 16p + 15, k]. A panel is one contiguous run of K cache lines, so
// a thread streams its panels front to back, and every weight byte is read from memory once per
// call whatever M is (M rows of x stay in L1/L2 while a panel goes by).
//
// What every path computes, for each output (m, n):
//     y[m, n] = fma(w[n, K-1], x[m, K-1], ... fma(w[n, 1], x[m, 1], w[n, 0] * x[m, 0]))  (+ bias[n])
// one sequential chain over k. No path reassociates it, so the result does not depend on M (a
// batch row equals the same row decoded alone, bit for bit), on which rows share a tile, or on the
// thread count (threads split panels, never a sum).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "vector_path.h"

#ifdef FUELPIPE_HAS_AVX2
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kPanel = 16;  // output columns per panel: two 8-lane vectors
constexpr int kMaxRows = 6;     // x rows per tile: 12 accumulators + 2 weight vectors + 1 broadcast
// Software prefetch distance in the one-panel tiles (panel_tile_avx2: 4-6 rows, or a lone tail panel): 2 KiB
// ahead in the panel stream. Such a tile spends ~6 cycles of FMAs per weight line, too slow a stream
// for the hardware prefetcher alone (measured on SmolLM2 shapes, AMD EPYC, 2 threads, interleaved:
// 8 rows 0.85-0.9x the time without it; 1 KiB and 4 KiB within noise of 2). The two-panel tile for
// 1-3 rows (tile2_avx2) streams fast enough without, and lost ~5% with it.
constexpr int64_t kPrefetchFloats = 512;

// Stores one tile row's 16 results (only the ncols < 16 that exist in a tail panel), bias added.
inline void store_row(const float* acc, float* out, const float* bias, int64_t ncols) {
  for (int64_t j = 0; j < ncols; ++j) out[j] = bias ? acc[j] + bias[j] : acc[j];
}

// The scalar path: the chain above, one lane at a time (portable; the AVX2 path matches it).
template <int MR>
void tile_scalar(const float* w, const float* x, int64_t K, float* out, int64_t N, const float* bias, int64_t ncols) {
  for (int m = 0; m < MR; ++m) {
    float acc[kPanel];
    for (int64_t j = 0; j < kPanel; ++j) {
      float s = w[j] * x[m * K];
      for (int64_t k = 1; k < K; ++k) s = std::fma(w[k * kPanel + j], x[m * K + k], s);
      acc[j] = s;
    }
    store_row(acc, out + m * N, bias, ncols);
  }
}

#ifdef FUELPIPE_HAS_AVX2
// MR rows of x against one panel. The accumulators are named registers, not an array: GCC keeps an
// indexed array of vectors on the stack and stores it every iteration (measured 3x slower).
template <int MR>
void panel_tile_avx2(const float* w, const float* x, int64_t K, float* out, int64_t N, const float* bias, int64_t ncols) {
  const __m256 w00 = _mm256_loadu_ps(w), w01 = _mm256_loadu_ps(w + 8);
  __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
#define FP_FIRST(i)                                         \
  if constexpr (MR > i) {                                   \
    const __m256 xb = _mm256_broadcast_ss(x + i * K);       \
    c##i##0 = _mm256_mul_ps(w00, xb);                       \
    c##i##1 = _mm256_mul_ps(w01, xb);                       \
  }
#define FP_NEXT(i)                                          \
  if constexpr (MR > i) {                                   \
    const __m256 xb = _mm256_broadcast_ss(x + i * K + k);   \
    c##i##0 = _mm256_fmadd_ps(w0, xb, c##i##0);             \
    c##i##1 = _mm256_fmadd_ps(w1, xb, c##i##1);             \
  }
  FP_FIRST(0) FP_FIRST(1) FP_FIRST(2) FP_FIRST(3) FP_FIRST(4) FP_FIRST(5)
  for (int64_t k = 1; k < K; ++k) {
    _mm_prefetch(reinterpret_cast<const char*>(w + k * kPanel + kPrefetchFloats), _MM_HINT_T0);
    const __m256 w0 = _mm256_loadu_ps(w + k * kPanel), w1 = _mm256_loadu_ps(w + k * kPanel + 8);
    FP_NEXT(0) FP_NEXT(1) FP_NEXT(2) FP_NEXT(3) FP_NEXT(4) FP_NEXT(5)
  }
#undef FP_FIRST
#undef FP_NEXT
  alignas(32) float acc[kPanel];
#define FP_STORE(i)                                                    \
  if constexpr (MR > i) {                                              \
    _mm256_store_ps(acc, c##i##0);                                     \
    _mm256_store_ps(acc + 8, c##i##1);                                 \
    store_row(acc, out + i * N, bias, ncols);                          \
  }
  FP_STORE(0) FP_STORE(1) FP_STORE(2) FP_STORE(3) FP_STORE(4) FP_STORE(5)
#undef FP_STORE
}
#endif


#ifdef FUELPIPE_HAS_AVX2
// MR (<= 3) rows against two adjacent panels: 4 vectors per row, so a short tile still has 4 * MR
// independent accumulator chains (one panel alone would leave 2 * MR, too few to hide FMA latency).
template <int MR>
void tile2_avx2(const float* w, const float* v, const float* x, int64_t K, float* out, int64_t N, const float* bias,
                int64_t ncols_v) {
  __m256 c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23;
#define T2_FIRST(i)                                                   \
  if constexpr (MR > i) {                                             \
    const __m256 xb = _mm256_broadcast_ss(x + i * K);                 \
    c##i##0 = _mm256_mul_ps(_mm256_loadu_ps(w), xb);                   \
    c##i##1 = _mm256_mul_ps(_mm256_loadu_ps(w + 8), xb);               \
    c##i##2 = _mm256_mul_ps(_mm256_loadu_ps(v), xb);                   \
    c##i##3 = _mm256_mul_ps(_mm256_loadu_ps(v + 8), xb);               \
  }
#define T2_NEXT(i)                                                    \
  if constexpr (MR > i) {                                             \
    const __m256 xb = _mm256_broadcast_ss(x + i * K + k);             \
    c##i##0 = _mm256_fmadd_ps(w0, xb, c##i##0);                       \
    c##i##1 = _mm256_fmadd_ps(w1, xb, c##i##1);                       \
    c##i##2 = _mm256_fmadd_ps(v0, xb, c##i##2);                       \
    c##i##3 = _mm256_fmadd_ps(v1, xb, c##i##3);                       \
  }
  T2_FIRST(0) T2_FIRST(1) T2_FIRST(2)
  for (int64_t k = 1; k < K; ++k) {
    const __m256 w0 = _mm256_loadu_ps(w + k * kPanel), w1 = _mm256_loadu_ps(w + k * kPanel + 8);
    const __m256 v0 = _mm256_loadu_ps(v + k * kPanel), v1 = _mm256_loadu_ps(v + k * kPanel + 8);
    T2_NEXT(0) T2_NEXT(1) T2_NEXT(2)
  }
#undef T2_FIRST
#undef T2_NEXT
  alignas(32) float acc[kPanel];
#define T2_STORE(i)                                                    \
  if constexpr (MR > i) {                                              \
    _mm256_store_ps(acc, c##i##0); _mm256_store_ps(acc + 8, c##i##1);  \
    store_row(acc, out + i * N, bias, kPanel);                         \
    _mm256_store_ps(acc, c##i##2); _mm256_store_ps(acc + 8, c##i##3);  \
    store_row(acc, out + i * N + kPanel, bias ? bias + kPanel : nullptr, ncols_v);  \
  }
  T2_STORE(0) T2_STORE(1) T2_STORE(2)
#undef T2_STORE
}
#endif


template <int MR>
inline void tile(const float* w, const float* x, int64_t K, float* out, int64_t N, const float* bias, int64_t ncols) {
#ifdef FUELPIPE_HAS_AVX2
  if (fuelpipe_isa::at_least(fuelpipe_isa::Path::avx2)) {
    panel_tile_avx2<MR>(w, x, K, out, N, bias, ncols);
    return;
  }
#endif
  tile_scalar<MR>(w, x, K, out, N, bias, ncols);
}

// All M rows of x against one panel, in tiles of up to kMaxRows rows (the panel is re-read from L1/L2).
void panel_rows(const float* w, const float* x, int64_t M, int64_t K, float* out, int64_t N, const float* bias,
                int64_t ncols) {
  int64_t m = 0;
  for (; m + kMaxRows <= M; m += kMaxRows) tile<kMaxRows>(w, x + m * K, K, out + m * N, N, bias, ncols);
  const float* xr = x + m * K;
  float* o = out + m * N;
  switch (M - m) {
    case 5: tile<5>(w, xr, K, o, N, bias, ncols); break;
    case 4: tile<4>(w, xr, K, o, N, bias, ncols); break;
    case 3: tile<3>(w, xr, K, o, N, bias, ncols); break;
    case 2: tile<2>(w, xr, K, o, N, bias, ncols); break;
    case 1: tile<1>(w, xr, K, o, N, bias, ncols); break;
    default: break;
  }
}


// Rows of x against panels p (and p + 1 when pair): full tiles of kMaxRows per panel, a remainder
// of 1-3 rows against both panels at once (measured on SmolLM2's shapes, one row: 24.5 ms for all
// linears against 29-30 ms one panel at a time).
void panel_pair_rows(const float* wp, int64_t p, bool pair, const float* x, int64_t M, int64_t K, float* out, int64_t N,
                     const float* bias) {
  const float* w = wp + p * K * kPanel;
  const int64_t n0 = p * kPanel;
  const int64_t nc0 = std::min(kPanel, N - n0);
  const int64_t nc1 = pair ? std::min(kPanel, N - n0 - kPanel) : 0;
  int64_t m = 0;
  for (; m + kMaxRows <= M; m += kMaxRows) {
    tile<kMaxRows>(w, x + m * K, K, out + m * N + n0, N, bias ? bias + n0 : nullptr, nc0);
    if (pair) tile<kMaxRows>(w + K * kPanel, x + m * K, K, out + m * N + n0 + kPanel, N, bias ? bias + n0 + kPanel : nullptr, nc1);
  }
  int64_t rest = M - m;
#ifdef FUELPIPE_HAS_AVX2
  if (pair && rest > 0 && rest <= 3 && nc0 == kPanel && fuelpipe_isa::at_least(fuelpipe_isa::Path::avx2)) {
    const float* v = w + K * kPanel;
    const float* xr = x + m * K; float* o = out + m * N + n0; const float* b = bias ? bias + n0 : nullptr;
    if (rest == 1) tile2_avx2<1>(w, v, xr, K, o, N, b, nc1);
    else if (rest == 2) tile2_avx2<2>(w, v, xr, K, o, N, b, nc1);
    else tile2_avx2<3>(w, v, xr, K, o, N, b, nc1);
    return;
  }
#endif
  for (int64_t q = p; q < p + (pair ? 2 : 1); ++q) {
    const int64_t nq = q * kPanel;
    panel_rows(wp + q * K * kPanel, x + m * K, rest, K, out + m * N + nq, N, bias ? bias + nq : nullptr, std::min(kPanel, N - nq));
  }
}

at::Tensor f32_panel_linear(const at::Tensor& x_in, const at::Tensor& panels, int64_t N, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(panels.scalar_type() == at::kFloat && panels.dim() == 3 && panels.size(2) == kPanel && panels.is_contiguous(),
              "f32_panel_linear: panels must be contiguous float32 [N16 / 16, K, 16], got ", panels.scalar_type(), " ",
              panels.sizes());
  const int64_t NP = panels.size(0), K = panels.size(1);
  TORCH_CHECK(K >= 1 && N >= 1 && N <= NP * kPanel && N > (NP - 1) * kPanel, "f32_panel_linear: out_features=", N,
              " does not fit ", NP, " panels of ", kPanel);
  // Panels may sit at any float offset: a stored AOTInductor plan holds them as constants of its package, placed
  // where the package puts them (not always on a 32-byte boundary), so every weight load is an unaligned one.
  TORCH_CHECK(x_in.device().is_cpu() && x_in.scalar_type() == at::kFloat, "f32_panel_linear: x must be float32 on the CPU, got ",
              x_in.scalar_type(), " on ", x_in.device());
  TORCH_CHECK(x_in.dim() >= 1 && x_in.size(-1) == K, "f32_panel_linear: x's last dimension must be in_features=", K,
              ", got shape ", x_in.sizes());
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->size(0) == N,
                "f32_panel_linear: bias must be float32 [", N, "], got ", bias->scalar_type(), " ", bias->sizes());
  }
  const at::Tensor x = x_in.contiguous();
  auto sizes = x.sizes().vec();
  sizes.back() = N;
  at::Tensor out = at::empty(sizes, x.options());
  const int64_t M = x.numel() / K;
  if (M == 0) return out;
  const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
  const float* xp = x.data_ptr<float>();
  const float* wp = panels.data_ptr<float>();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  // At least ~64 KiB of weights per task: smaller matrices run on the calling thread.
  const int64_t grain = std::max<int64_t>(1, (64 * 1024) / (K * kPanel * 4));
  const int64_t pairs = (NP + 1) / 2;
  at::parallel_for(0, pairs, std::max<int64_t>(1, grain / 2), [&](int64_t begin, int64_t end) {
    for (int64_t q = begin; q < end; ++q) panel_pair_rows(wp, 2 * q, 2 * q + 1 < NP, xp, M, K, op, N, bp);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fuelpipe_kernels, m) {
  m.def("f32_panel_linear(Tensor x, Tensor panels, int out_features, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(fuelpipe_kernels, CPU, m) {
  m.impl("f32_panel_linear", f32_panel_linear);
}
