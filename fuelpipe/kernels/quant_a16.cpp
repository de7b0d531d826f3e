// Low-bit weights times 16-bit activations (activations=int16): the *_a16 operators, one per weight kind.
//
// Paths (vector_path.h): scalar, avx2 and avx_vnni here, avx512 in quant_a16_avx512.h. They share the
// integer part exactly (the same codes, the same int32 block sums) and differ only in the order of the
// f32 additions that scale and sum the blocks, which kernel_parity's bound covers for any order.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "quant_a16_avx512.h"
#include "quant_common.h"
#include "quant_rows.h"

namespace {

using namespace fuelpipe_quant;


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


// One activation row -> xq [K] int16, dx [K / 32] f32, xs [K / 32] f32 (quantize_row_blocks, quant_common.h).
void quantize_row_a16(const float* x, int64_t K, int16_t* xq, float* dx, float* xs) {
  quantize_row_blocks(x, K, /*levels=*/32767.f, xq, dx, xs);
}

// ---- scalar: one block's exact int32 sum, scaled and added in order ------------------------------

// q8_block_scalar / q4_block_scalar (quant_common.h): one block's exact int32 sum.

// One weight row (int8 codes q [K], scales s [K / G]) against one quantized activation row.
// Scale of block b: w_scale[b / per_group] * dx[b].
template <typename S>
float q8_row_scalar(const int8_t* q, const S* s, int64_t K, int64_t G, const int16_t* xq, const float* dx) {
  const int64_t per_group = G / kBlock;
  float acc = 0.f;
  for (int64_t g = 0, b = 0; g < K / G; ++g) {
    const float sg = to_f32(s[g]);
    for (int64_t j = 0; j < per_group; ++j, ++b)
      acc += static_cast<float>(q8_block_scalar(q + b * kBlock, xq + b * kBlock)) * (sg * dx[b]);
  }
  return acc;
}

// The same for 4-bit codes, plus the mins' share: min[g] * (sum of the group's quantized activations).
template <typename S>
float q4_row_scalar(const uint8_t* q, const S* s, const S* mn, int64_t K, int64_t G, const int16_t* xq, const float* dx,
                    const float* xs) {
  const int64_t per_group = G / kBlock;
  float acc = 0.f, macc = 0.f;
  for (int64_t g = 0, b = 0; g < K / G; ++g) {
    const float sg = to_f32(s[g]);
    float group_sum = 0.f;
    for (int64_t j = 0; j < per_group; ++j, ++b) {
      acc += static_cast<float>(q4_block_scalar(q + b * (kBlock / 2), xq + b * kBlock)) * (sg * dx[b]);
      group_sum += xs[b];
    }
    macc += to_f32(mn[g]) * group_sum;
  }
  return acc + macc;
}

#ifdef FUELPIPE_HAS_AVX2
// ---- avx2 and avx_vnni: a block as 8 int32 lanes, scaled in 8 f32 lanes, two chains (even, odd blocks) ----

// The second half's products added to the first's: AVX-VNNI does it in the multiply (VPDPWSSD), AVX2 with
// a separate add. Integer sums: both give the same bits.
template <bool kVnni>
__attribute__((always_inline)) inline __m256i madd_add(__m256i first, __m256i w1, __m256i x1) {
#ifdef FUELPIPE_HAS_AVX_VNNI
  if constexpr (kVnni) return _mm256_dpwssd_avx_epi32(first, w1, x1);
#endif
  return _mm256_add_epi32(first, _mm256_madd_epi16(w1, x1));
}

// 32 int8 weights times 32 int16 activations: 8 int32 lanes summing to the block's exact dot product.
template <bool kVnni>
__attribute__((always_inline)) inline __m256i q8_block_a16(const int8_t* qb, const int16_t* xb) {
  const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qb)));
  const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qb + 16)));
  return madd_add<kVnni>(_mm256_madd_epi16(w0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb))), w1,
                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 16)));
}
// 16 bytes of 4-bit codes (block order: byte j holds elements j and j + 16) times 32 int16 activations
// stored in the order the unpacking produces (permute_for_q4): the 16 bytes go to both 128-bit lanes, the
// upper lane shifted right by 4, so lane 0 holds elements 0..15 and lane 1 elements 16..31 as bytes;
// interleaving with zero bytes then gives int16 elements [0..7 | 16..23] and [8..15 | 24..31].
template <bool kVnni>
__attribute__((always_inline)) inline __m256i q4_block_a16(const uint8_t* qb, const int16_t* xb) {
  const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qb)));
  const __m256i codes = _mm256_and_si256(_mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),
                                         _mm256_set1_epi8(0x0F));
  const __m256i zero = _mm256_setzero_si256();
  return madd_add<kVnni>(
      _mm256_madd_epi16(_mm256_unpacklo_epi8(codes, zero), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb))),
      _mm256_unpackhi_epi8(codes, zero), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 16)));
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

// Group size 32 (every GGUF block, the default) takes a loop with no group bookkeeping, unrolled by two
// into independent chains; other group sizes alternate the chains block by block.
template <bool kVnni, typename S>
float q8_row_avx2(const int8_t* q, const S* s, int64_t K, int64_t G, const int16_t* xq, const float* dx) {
  const int64_t nb = K / kBlock, per_group = G / kBlock;
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  if (per_group == 1) {
    alignas(32) float sc[kMaxGroups];  // block scales: w_scale[b] * dx[b], 8 at a time
    block_scales(s, dx, nb, sc);
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
      _mm_prefetch(reinterpret_cast<const char*>(q + b * kBlock) + kPrefetchBytes, _MM_HINT_T0);
      a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_block_a16<kVnni>(q + b * kBlock, xq + b * kBlock)), _mm256_broadcast_ss(sc + b), a0);
      a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_block_a16<kVnni>(q + (b + 1) * kBlock, xq + (b + 1) * kBlock)),
                           _mm256_broadcast_ss(sc + b + 1), a1);
    }
    if (b < nb)
      a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_block_a16<kVnni>(q + b * kBlock, xq + b * kBlock)), _mm256_broadcast_ss(sc + b), a0);
    return hsum(_mm256_add_ps(a0, a1));
  }
  for (int64_t g = 0, b = 0; g < K / G; ++g) {
    const float sg = to_f32(s[g]);
    for (int64_t j = 0; j < per_group; ++j, ++b) {
      const __m256 part = _mm256_cvtepi32_ps(q8_block_a16<kVnni>(q + b * kBlock, xq + b * kBlock));
      if (j & 1) a1 = _mm256_fmadd_ps(part, _mm256_set1_ps(sg * dx[b]), a1);
      else a0 = _mm256_fmadd_ps(part, _mm256_set1_ps(sg * dx[b]), a0);
    }
  }
  return hsum(_mm256_add_ps(a0, a1));
}

template <bool kVnni, typename S>
float q4_row_avx2(const uint8_t* q, const S* s, const S* mn, int64_t K, int64_t G, const int16_t* xq, const float* dx,
                  const float* xs) {
  const int64_t nb = K / kBlock, per_group = G / kBlock;
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  if (per_group == 1) {
    alignas(32) float sc[kMaxGroups], mins[kMaxGroups];
    block_scales(s, dx, nb, sc);
    const float* m = row_f32<S>(mn, nb, mins);
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
      _mm_prefetch(reinterpret_cast<const char*>(q + b * (kBlock / 2)) + kPrefetchBytes, _MM_HINT_T0);
      a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_block_a16<kVnni>(q + b * (kBlock / 2), xq + b * kBlock)),
                           _mm256_broadcast_ss(sc + b), a0);
      a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_block_a16<kVnni>(q + (b + 1) * (kBlock / 2), xq + (b + 1) * kBlock)),
                           _mm256_broadcast_ss(sc + b + 1), a1);
    }
    if (b < nb)
      a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_block_a16<kVnni>(q + b * (kBlock / 2), xq + b * kBlock)),
                           _mm256_broadcast_ss(sc + b), a0);
    return hsum(_mm256_add_ps(a0, a1)) + dot_f32(m, xs, nb);
  }
  float macc = 0.f;
  for (int64_t g = 0, b = 0; g < K / G; ++g) {
    const float sg = to_f32(s[g]);
    float group_sum = 0.f;
    for (int64_t j = 0; j < per_group; ++j, ++b) {
      const __m256 part = _mm256_cvtepi32_ps(q4_block_a16<kVnni>(q + b * (kBlock / 2), xq + b * kBlock));
      if (j & 1) a1 = _mm256_fmadd_ps(part, _mm256_set1_ps(sg * dx[b]), a1);
      else a0 = _mm256_fmadd_ps(part, _mm256_set1_ps(sg * dx[b]), a0);
      group_sum += xs[b];
    }
    macc += to_f32(mn[g]) * group_sum;
  }
  return hsum(_mm256_add_ps(a0, a1)) + macc;
}
#include "quant_a16_tiles.h"  // q8_tile_avx2, q4_tile_avx2: several rows at once, the same bits per row
#endif  // FUELPIPE_HAS_AVX2


// ---- the path's row functions, chosen once per call ----------------------------------------------

template <typename S>
float q8_row_a16(Path p, const int8_t* q, const S* s, int64_t K, int64_t G, const int16_t* xq, const float* dx) {
#ifdef FUELPIPE_HAS_AVX512
  if (p == Path::avx512) return q8_row_avx512(q, s, K, G, xq, dx);
#endif
#ifdef FUELPIPE_HAS_AVX_VNNI
  if (p == Path::avx_vnni) return q8_row_avx2<true>(q, s, K, G, xq, dx);
#endif
#ifdef FUELPIPE_HAS_AVX2
  if (p != Path::scalar) return q8_row_avx2<false>(q, s, K, G, xq, dx);
#endif
  return q8_row_scalar(q, s, K, G, xq, dx);
}

template <typename S>
float q4_row_a16(Path p, const uint8_t* q, const S* s, const S* mn, int64_t K, int64_t G, const int16_t* xq,
                 const float* dx, const float* xs) {
#ifdef FUELPIPE_HAS_AVX512
  if (p == Path::avx512) return q4_row_avx512(q, s, mn, K, G, xq, dx, xs);
#endif
#ifdef FUELPIPE_HAS_AVX_VNNI
  if (p == Path::avx_vnni) return q4_row_avx2<true>(q, s, mn, K, G, xq, dx, xs);
#endif
#ifdef FUELPIPE_HAS_AVX2
  if (p != Path::scalar) return q4_row_avx2<false>(q, s, mn, K, G, xq, dx, xs);
#endif
  return q4_row_scalar(q, s, mn, K, G, xq, dx, xs);
}

// The 256-bit 4-bit blocks read their activations in the unpacking's order (permute_for_q4).
inline bool q4_permuted(Path p) { return p == Path::avx2 || p == Path::avx_vnni; }

// Quantizes every activation row (permuted for q4_block_a16 where q4_order: the 256-bit 4-bit paths), then
// runs the rows through run_quantized_rows (quant_rows.h).
template <typename RowFn, typename TileFn>
at::Tensor run_rows_a16(const at::Tensor& x, int64_t N, int64_t K, const c10::optional<at::Tensor>& bias, bool q4_order,
                        RowFn row_fn, bool tiled, TileFn tile_fn) {
  auto quantize = [q4_order](const float* xr, int64_t k, int16_t* xq, float* dx, float* xs) {
    quantize_row_a16(xr, k, xq, dx, xs);
#ifdef FUELPIPE_HAS_AVX2
    if (q4_order) permute_for_q4(xq, k);
#endif
  };
  return run_quantized_rows<int16_t>(x, N, K, bias, quantize, row_fn, tiled, tile_fn);
}

// Whether a product runs its lockstep rows as tiles: the 256-bit paths at group size 32.
inline bool tiles(Path p, int64_t G) { return G == kBlock && (p == Path::avx2 || p == Path::avx_vnni); }

at::Tensor q8_gemv_a16(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales, const c10::optional<at::Tensor>& bias) {
  const auto shape = q8_shapes("q8_gemv_a16", x, q, scales, bias);
  const int64_t N = shape[0], K = shape[1], G = shape[2], KG = K / G;
  const int8_t* qp = q.data_ptr<int8_t>();
  const Path path = fuelpipe_isa::path_for(fuelpipe_isa::Measured::q8_a16);
  auto typed = [&](auto* sp) {
    using S = std::remove_const_t<std::remove_pointer_t<decltype(sp)>>;
    auto tile = [&](const int64_t* rows, const int16_t* xq, const float* dx, const float*, float* scratch, float* v) {
#ifdef FUELPIPE_HAS_AVX2
      const int8_t* qs[kStreams];
      const S* ss[kStreams];
      for (int r = 0; r < kStreams; ++r) qs[r] = qp + rows[r] * K, ss[r] = sp + rows[r] * KG;
#ifdef FUELPIPE_HAS_AVX_VNNI
      if (path == Path::avx_vnni) return q8_tile_avx2<true, S, kStreams>(qs, ss, K, xq, dx, scratch, v);
#endif
      q8_tile_avx2<false, S, kStreams>(qs, ss, K, xq, dx, scratch, v);
#endif
    };
    return run_rows_a16(x, N, K, bias, false, [&](int64_t n, const int16_t* xq, const float* dx, const float*) {
      return q8_row_a16(path, qp + n * K, sp + n * KG, K, G, xq, dx);
    }, tiles(path, G), tile);
  };
  if (scales.scalar_type() == at::kFloat) return typed(scales.data_ptr<float>());
  return typed(scales.data_ptr<c10::Half>());
}

at::Tensor q4_gemv_a16(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales, const at::Tensor& mins,
                       const c10::optional<at::Tensor>& bias) {
  const auto shape = q4_shapes("q4_gemv_a16", x, q, scales, mins, bias);
  const int64_t N = shape[0], K = shape[1], G = shape[2], KG = K / G;
  const uint8_t* qp = q.data_ptr<uint8_t>();
  const Path path = fuelpipe_isa::path_for(fuelpipe_isa::Measured::q4_a16);
  auto typed = [&](auto* sp, auto* mp) {
    using S = std::remove_const_t<std::remove_pointer_t<decltype(sp)>>;
    auto tile = [&](const int64_t* rows, const int16_t* xq, const float* dx, const float* xs, float* scratch, float* v) {
#ifdef FUELPIPE_HAS_AVX2
      const uint8_t* qs[kStreams];
      const S *ss[kStreams], *ms[kStreams];
      for (int r = 0; r < kStreams; ++r) qs[r] = qp + rows[r] * (K / 2), ss[r] = sp + rows[r] * KG, ms[r] = mp + rows[r] * KG;
      float* mins = scratch + kStreams * (K / kBlock);
#ifdef FUELPIPE_HAS_AVX_VNNI
      if (path == Path::avx_vnni) return q4_tile_avx2<true, S, kStreams>(qs, ss, ms, K, xq, dx, xs, scratch, mins, v);
#endif
      q4_tile_avx2<false, S, kStreams>(qs, ss, ms, K, xq, dx, xs, scratch, mins, v);
#endif
    };
    return run_rows_a16(x, N, K, bias, q4_permuted(path), [&](int64_t n, const int16_t* xq, const float* dx, const float* xs) {
      return q4_row_a16(path, qp + n * (K / 2), sp + n * KG, mp + n * KG, K, G, xq, dx, xs);
    }, tiles(path, G), tile);
  };
  if (scales.scalar_type() == at::kFloat) return typed(scales.data_ptr<float>(), mins.data_ptr<float>());
  return typed(scales.data_ptr<c10::Half>(), mins.data_ptr<c10::Half>());
}

}  // namespace

TORCH_LIBRARY_IMPL(fuelpipe_kernels, CPU, m) {
  m.impl("q8_gemv_a16", q8_gemv_a16);
  m.impl("q4_gemv_a16", q4_gemv_a16);
}
