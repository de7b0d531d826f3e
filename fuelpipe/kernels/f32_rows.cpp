// f32 linears on the model's own weights, read where they lie: x [M, K] times row-major W [N, K] (no copy).
//
// A fused sibling group (q/k/v, gate/up) is a list of matrices with one K: their outputs are written side
// by side as if the matrices were concatenated along N, with nothing concatenated in memory.
// fuelpipe.plan.rows_linear.reference_rows_linear is the readable statement.
//
// What every path computes, for each output (m, n), with W the row n of its matrix:
//     eight lanes l = 0..7, each one sequential multiply-add chain over k = l, l + 8, l + 16, ... < K8
//     (K8 = K rounded down to a multiple of 8), summed in the fixed tree ((l0 + l4) + (l2 + l6)) +
//     ((l1 + l5) + (l3 + l7)), then the tail k = K8 .. K - 1 chained on in order, then the bias added.
// No path reorders that, so a row's result does not depend on M (a batch row equals the same row decoded
// alone, bit for bit), on which rows share a tile, or on the thread count (threads split output rows).
//
// Loop order: a thread takes a run of output rows; for each tile of R weight rows (R x K floats, in L1)
// it passes every tile of MR rows of x, so each weight byte comes from memory once per call whatever M is.
//
// AVX-512 (several rows of x): two rows of x share one 512-bit register, row 2p in the low eight lanes and row
// 2p + 1 in the high eight, against a weight vector broadcast to both halves. Each half is exactly the
// AVX2 path's eight-lane chain for its row, so the bits are the same, at twice the multiply-adds per
// instruction. x is packed in pairs once per call for it (x_pairs: per pair, K8 / 8 blocks of 16 floats).
//
// Software prefetch: each weight stream is asked for `prefetch_bytes` ahead of where it reads (one request
// per 64-byte line, running on into the stream's next row). The hardware prefetchers restart at every 4 KiB
// page and every call; requests ahead keep more lines in flight through those gaps. The distance is chosen by
// measurement on the CPU at hand (fuelpipe.kernels.path_choice, 0 = none); it never changes a result.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

#include "vector_path.h"

#ifdef FUELPIPE_HAS_AVX2
#include <immintrin.h>
#endif

namespace {

constexpr int kLanes = 8;

std::atomic<int64_t> prefetch_bytes{0};  // set from fuelpipe.kernels.path_choice (set_f32_prefetch)
// Wall nanoseconds spent inside f32_rows_linear since the library loaded (f32_rows_clock_ns): a study of a
// decode step diffs it around the steps to split the step into its linears and the rest, no profiler.
std::atomic<int64_t> rows_clock_ns{0};

// One prefetch per cache line: called at every k step of 8 floats, it asks on every second one.
template <int R>
inline void prefetch_rows(const float* const* w, int64_t k, int64_t ahead) {
#ifdef FUELPIPE_HAS_AVX2
  if (ahead > 0 && (k & 15) == 0)
    for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(w[r] + k) + ahead, _MM_HINT_T0);
#endif
}

// The lanes' fixed summation tree (above), on an array of 8.
inline float tree_sum(const float* l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// One output from its lanes' sum: the tail chained on, the bias added.
inline float finish_sum(float s, const float* w, const float* x, int64_t k8, int64_t K, const float* bias) {
  for (int64_t k = k8; k < K; ++k) s = std::fma(w[k], x[k], s);
  return bias ? s + *bias : s;
}

inline float finish(const float* lanes, const float* w, const float* x, int64_t k8, int64_t K, const float* bias) {
  return finish_sum(tree_sum(lanes), w, x, k8, K, bias);
}

#ifdef FUELPIPE_HAS_AVX2
// The same tree in registers: halves added (l0+l4, l1+l5, l2+l6, l3+l7), then lanes two apart
// ((l0+l4)+(l2+l6), (l1+l5)+(l3+l7)), then those two: tree_sum's additions, operand for operand.
inline float tree_sum_avx2(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
#endif

// The portable path: the same lanes, one at a time.
void dot_scalar(const float* w, const float* x, int64_t K, float* out, const float* bias) {
  const int64_t k8 = K / kLanes * kLanes;
  float lanes[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (k8 > 0) {
    for (int l = 0; l < kLanes; ++l) lanes[l] = w[l] * x[l];
    for (int64_t k = kLanes; k < k8; k += kLanes)
      for (int l = 0; l < kLanes; ++l) lanes[l] = std::fma(w[k + l], x[k + l], lanes[l]);
  }
  *out = finish(lanes, w, x, k8, K, bias);
}

#ifdef FUELPIPE_HAS_AVX2
// R weight rows (any addresses: w[r] is row r) against MR rows of x (stride K): R * MR accumulators (at most
// 12 of the 16 ymm registers), R + MR loads per R * MR multiply-adds. Output (m, r) goes to out[m * ldo + col[r]].
template <int R, int MR>
void rows_tile_avx2(const float* const* w, const float* x, int64_t K, float* out, int64_t ldo, const int64_t* col,
               const float* bias) {
  static_assert(R * MR <= 12, "accumulators must fit the register file");
  const int64_t k8 = K / kLanes * kLanes;
  const int64_t ahead = prefetch_bytes.load(std::memory_order_relaxed);
  __m256 acc[R][MR];
  if (k8 == 0) {
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < MR; ++m) acc[r][m] = _mm256_setzero_ps();
  } else {
    __m256 xv[MR];
    for (int m = 0; m < MR; ++m) xv[m] = _mm256_loadu_ps(x + m * K);
    for (int r = 0; r < R; ++r) {
      const __m256 wv = _mm256_loadu_ps(w[r]);
      for (int m = 0; m < MR; ++m) acc[r][m] = _mm256_mul_ps(wv, xv[m]);
    }
    for (int64_t k = kLanes; k < k8; k += kLanes) {
      prefetch_rows<R>(w, k, ahead);
      if constexpr (MR == 1) {  // a GEMV: each weight vector is used once, so fold it into its multiply-add
        const __m256 x0 = _mm256_loadu_ps(x + k);
        for (int r = 0; r < R; ++r) acc[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(w[r] + k), x0, acc[r][0]);
      } else {  // x's MR vectors and each weight vector loaded once: R + MR loads per R * MR multiply-adds
        for (int m = 0; m < MR; ++m) xv[m] = _mm256_loadu_ps(x + m * K + k);
        for (int r = 0; r < R; ++r) {
          __m256 wv = _mm256_loadu_ps(w[r] + k);
          asm("" : "+x"(wv));  // keep it a register: without this GCC folds x's loads into each FMA instead
          for (int m = 0; m < MR; ++m) acc[r][m] = _mm256_fmadd_ps(wv, xv[m], acc[r][m]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MR; ++m)
      out[m * ldo + col[r]] = finish_sum(tree_sum_avx2(acc[r][m]), w[r], x + m * K, k8, K, bias ? bias + col[r] : nullptr);
}
#endif

#include "f32_rows_avx512.h"  // pairs_tile_avx512: two rows of x per 512-bit register

// R weight rows against all M rows of x, MR rows at a time (MR = 3: a tile of 2 or 1 rows for the rest).
template <int R, int MR>
void rows_against_x(const float* const* w, const float* x, const float* x_pairs, int64_t M, int64_t K, float* out,
                    int64_t ldo, const int64_t* col, const float* bias) {
#ifdef FUELPIPE_HAS_AVX512
  if (x_pairs != nullptr) {  // packed only where the avx512 path runs and M >= 2
    const int64_t k8 = K / kLanes * kLanes, pairs = M / 2;
    int64_t p = 0;
    for (; p + 4 <= pairs; p += 4)
      pairs_tile_avx512<R, 4>(w, x_pairs + p * k8 * 2, x + 2 * p * K, K, out + 2 * p * ldo, ldo, col, bias);
    switch (pairs - p) {
      case 3: pairs_tile_avx512<R, 3>(w, x_pairs + p * k8 * 2, x + 2 * p * K, K, out + 2 * p * ldo, ldo, col, bias); break;
      case 2: pairs_tile_avx512<R, 2>(w, x_pairs + p * k8 * 2, x + 2 * p * K, K, out + 2 * p * ldo, ldo, col, bias); break;
      case 1: pairs_tile_avx512<R, 1>(w, x_pairs + p * k8 * 2, x + 2 * p * K, K, out + 2 * p * ldo, ldo, col, bias); break;
      default: break;
    }
    if (M % 2) rows_tile_avx2<R, 1>(w, x + (M - 1) * K, K, out + (M - 1) * ldo, ldo, col, bias);  // the odd row
    return;
  }
#endif
#ifdef FUELPIPE_HAS_AVX2
  if (fuelpipe_isa::at_least(fuelpipe_isa::Path::avx2)) {
    int64_t m = 0;
    for (; m + MR <= M; m += MR) rows_tile_avx2<R, MR>(w, x + m * K, K, out + m * ldo, ldo, col, bias);
    if (M - m == 2) rows_tile_avx2<R, 2>(w, x + m * K, K, out + m * ldo, ldo, col, bias);
    else if (M - m == 1) rows_tile_avx2<R, 1>(w, x + m * K, K, out + m * ldo, ldo, col, bias);
    return;
  }
#endif
  for (int r = 0; r < R; ++r)
    for (int64_t m = 0; m < M; ++m)
      dot_scalar(w[r], x + m * K, K, out + m * ldo + col[r], bias ? bias + col[r] : nullptr);
}

// The matrices as one list of output rows: global row n lives in matrix part_of(n) at a known address.
struct Rows {
  std::vector<const float*> base;  // each matrix's first row
  std::vector<int64_t> stride;     // each matrix's row stride (floats)
  std::vector<int64_t> first;      // each matrix's first global row, and N at the end
  const float* row(int64_t n) const {
    size_t i = 0;
    while (n >= first[i + 1]) ++i;
    return base[i] + (n - first[i]) * stride[i];
  }
};

// Output rows [n0, n1) against every row of x. The run is cut into kStreams equal stretches walked in
// lockstep, one row of each per tile: a single core keeps several distant memory streams in flight, which
// the hardware prefetchers serve much better than one (measured, SmolLM2 shapes, AMD EPYC, one row of x:
// one stream 40-51 ms for a token's linears on 1 thread, four streams 35, panel-packed weights 34).
constexpr int kStreams = 4;
void rows_block(const Rows& rows, int64_t n0, int64_t n1, const float* x, const float* x_pairs, int64_t M, int64_t K,
                float* out, const float* bias) {
  const int64_t N = rows.first.back();
  const int64_t per = (n1 - n0) / kStreams;
  const float* w[kStreams];
  int64_t col[kStreams];
  for (int64_t i = 0; i < per; ++i) {
    for (int s = 0; s < kStreams; ++s) {
      col[s] = n0 + s * per + i;
      w[s] = rows.row(col[s]);
    }
    if (M == 1) rows_against_x<kStreams, 1>(w, x, nullptr, M, K, out, N, col, bias);
    else rows_against_x<kStreams, 3>(w, x, x_pairs, M, K, out, N, col, bias);
  }
  for (int64_t n = n0 + kStreams * per; n < n1; ++n) {  // the few rows left over
    const float* w1[1] = {rows.row(n)};
    const int64_t c1[1] = {n};
    rows_against_x<1, 1>(w1, x, x_pairs, M, K, out, N, c1, bias);
  }
}

#include "f32_rows_chain.h"  // the prompt recipe: chain_block, one sequential chain per output

// ---- the operators ---------------------------------------------------------------------------------------

// Checks the arguments (naming the operator) and lists the matrices' rows; returns N.
int64_t checked_rows(const char* op, const at::Tensor& x_in, at::TensorList weights, const c10::optional<at::Tensor>& bias,
                     Rows& rows) {
  TORCH_CHECK(!weights.empty(), op, ": no weight matrices given");
  TORCH_CHECK(x_in.device().is_cpu() && x_in.scalar_type() == at::kFloat, op, ": x must be float32 on the CPU, got ",
              x_in.scalar_type(), " on ", x_in.device());
  const int64_t K = weights[0].dim() == 2 ? weights[0].size(1) : -1;
  int64_t N = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const at::Tensor& w = weights[i];
    TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kFloat && w.dim() == 2 && w.size(1) == K && w.size(0) >= 1,
                op, ": weight ", i, " must be float32 [N, ", K, "] on the CPU, got ", w.scalar_type(), " ", w.sizes(),
                " on ", w.device());
    TORCH_CHECK(w.stride(1) == 1 && w.stride(0) >= K, op, ": weight ", i,
                " must have unit stride along in_features and rows at least K apart, got strides ", w.strides());
    rows.base.push_back(w.data_ptr<float>());
    rows.stride.push_back(w.stride(0));
    rows.first.push_back(N);
    N += w.size(0);
  }
  rows.first.push_back(N);
  TORCH_CHECK(K >= 1, op, ": in_features must be at least 1, got ", K);
  TORCH_CHECK(x_in.dim() >= 1 && x_in.size(-1) == K, op, ": x's last dimension must be in_features=", K, ", got shape ",
              x_in.sizes());
  if (bias.has_value()) {
    TORCH_CHECK(bias->device().is_cpu() && bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->size(0) == N,
                op, ": bias must be float32 [", N, "] on the CPU, got ", bias->scalar_type(), " ", bias->sizes());
  }
  return N;
}

// Whether several rows of x take the avx512 tile: its measured choice (fuelpipe.kernels.path_choice), or a
// forced path.
inline bool pairs_path() {
  return static_cast<int>(fuelpipe_isa::path_for(fuelpipe_isa::Measured::f32_rows)) >=
         static_cast<int>(fuelpipe_isa::Path::avx512);
}

// x's rows packed in pairs for the avx512 path: pair p, block j (k = 8j .. 8j + 7) holds row 2p's eight floats
// then row 2p + 1's, [pairs, K8 / 8, 16]. Undefined where that path does not run (M < 2, K < 8, not chosen).
at::Tensor x_pairs(const at::Tensor& x, int64_t M, int64_t K) {
  const int64_t k8 = K / kLanes * kLanes;
  if (M < 2 || k8 == 0 || !pairs_path()) return at::Tensor();
  const int64_t pairs = M / 2;
  return x.view({M, K}).narrow(0, 0, 2 * pairs).narrow(1, 0, k8).reshape({pairs, 2, k8 / kLanes, kLanes})
      .transpose(1, 2).contiguous();  // [pairs, K8 / 8, 2, 8]
}

at::Tensor rows_product(const char* op, bool chain, const at::Tensor& x_in, at::TensorList weights,
                        const c10::optional<at::Tensor>& bias) {
  Rows rows;
  const int64_t N = checked_rows(op, x_in, weights, bias, rows);
  const int64_t K = weights[0].size(1);
  const at::Tensor x = x_in.contiguous();
  auto sizes = x.sizes().vec();
  sizes.back() = N;
  at::Tensor out = at::empty(sizes, x.options());
  const int64_t M = x.numel() / K;
  if (M == 0) return out;
  const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  float* op_out = out.data_ptr<float>();
  // Tasks of at least ~64 KiB of weights each: smaller products run on the calling thread.
  const int64_t grain = std::max<int64_t>(1, (64 * 1024) / (K * 4));
  if (!chain) {
    const float* xp = x.data_ptr<float>();
    at::Tensor pairs = x_pairs(x, M, K);
    const float* pp = pairs.defined() ? pairs.data_ptr<float>() : nullptr;
    at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) { rows_block(rows, n0, n1, xp, pp, M, K, op_out, bp); });
    return out;
  }
  const int64_t ld8 = (M + 7) / 8 * 8;
  at::Tensor xt = at::zeros({K, ld8}, x.options());  // x packed k-major, padded rows zero
  xt.narrow(1, 0, M).copy_(x.view({M, K}).t());
  const float* xtp = xt.data_ptr<float>();
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) { chain_block(rows, n0, n1, xtp, M, ld8, K, op_out, bp); });
  return out;
}

at::Tensor f32_rows_linear(const at::Tensor& x, at::TensorList weights, const c10::optional<at::Tensor>& bias) {
  const auto start = std::chrono::steady_clock::now();
  at::Tensor out = rows_product("f32_rows_linear", false, x, weights, bias);
  rows_clock_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
                              .count(), std::memory_order_relaxed);
  return out;
}

at::Tensor f32_rows_chain_linear(const at::Tensor& x, at::TensorList weights, const c10::optional<at::Tensor>& bias) {
  return rows_product("f32_rows_chain_linear", true, x, weights, bias);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fuelpipe_kernels, m) {
  m.def("f32_rows_linear(Tensor x, Tensor[] weights, Tensor? bias) -> Tensor");
  m.def("f32_rows_chain_linear(Tensor x, Tensor[] weights, Tensor? bias) -> Tensor");
  m.def("set_f32_prefetch(int bytes) -> int");
  m.def("f32_rows_clock_ns() -> int");
  m.def("f32_prefetch_bytes() -> int");
}

TORCH_LIBRARY_IMPL(fuelpipe_kernels, CPU, m) {
  m.impl("f32_rows_linear", f32_rows_linear);
  m.impl("f32_rows_chain_linear", f32_rows_chain_linear);
}

// Sets the f32 rows kernel's prefetch distance in bytes (0: none); returns the distance before.
TORCH_LIBRARY_IMPL(fuelpipe_kernels, CompositeExplicitAutograd, m) {
  m.impl("set_f32_prefetch", [](int64_t bytes) -> int64_t {
    TORCH_CHECK(bytes >= 0 && bytes <= 65536, "set_f32_prefetch: bytes must be in [0, 65536], got ", bytes);
    return prefetch_bytes.exchange(bytes);
  });
  m.impl("f32_rows_clock_ns", []() -> int64_t { return rows_clock_ns.load(std::memory_order_relaxed); });
  m.impl("f32_prefetch_bytes", []() -> int64_t { return prefetch_bytes.load(std::memory_order_relaxed); });
}
