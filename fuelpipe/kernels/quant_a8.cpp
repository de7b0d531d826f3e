// Low-bit weights times 8-bit activations (weights.activations=int8): q8_gemv_a8 and q4_gemv_a8.
//
// Each activation row is quantized per 32-element block, symmetrically to 8 bits:
//   dx[b] = max|x[b*32 .. b*32+31]| / 127,  xq[k] = round_half_even(x[k] / dx[b])   (0 where dx = 0)
// which is fuelpipe.quant.formats.quantize_activations(x, bits=8), element for element (a block with a
// non-finite element gets a NaN step). A block's products are summed exactly in int32 and scaled once, as in
// quant_a16.cpp: for int8, sum_b w_scale * dx[b] * sum(q * xq); for 4-bit, the same plus min * dx[b] *
// sum(xq). So the result is F.linear(round_trip_activations(x, bits=8), dequantize(w)) up to the order of the
// f32 additions; relative to f32 activations each element moves by at most max|x of its block| / 254.
//
// Why a second integer form: at one byte per activation, AVX2's VPMADDUBSW multiplies 32 pairs of bytes per
// instruction, and 4-bit codes go into it as they are unpacked, with no widening to 16 bits. The 16-bit form
// needs two VPMADDWD and two widenings per block. The 8-bit products are exact in 16 bits: a 4-bit pair is at
// most 2 * 15 * 127, an int8 pair 2 * 128 * 127 (int8 weights enter as |w| times x with w's sign), both below
// 2^15, so VPMADDUBSW never saturates.
//
// Paths (vector_path.h): scalar and avx2; avx_vnni and avx512 run the avx2 code. Every row takes the same
// function in a tile of kStreams rows or alone, so a row's bits do not depend on the thread count, the
// number of activation rows, or which rows share its tile.
#include <ATen/core/Tensor.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "quant_common.h"
#include "quant_rows.h"

namespace fuelpipe_a8 {

using namespace fuelpipe_quant;

// One activation row -> xq [K] int8, dx [K / 32], xs [K / 32] (quantize_row_blocks, quant_common.h).
void quantize_row_a8(const float* x, int64_t K, int8_t* xq, float* dx, float* xs) {
  quantize_row_blocks(x, K, /*levels=*/127.f, xq, dx, xs);
}

// sc[b] = w_scale[b / per_group] * dx[b] for the nb blocks of one row.
template <typename S>
void row_block_scales(const S* s, const float* dx, int64_t nb, int64_t per_group, float* sc) {
#ifdef FUELPIPE_HAS_AVX2
  if (per_group == 1 && at_least(Path::avx2)) return block_scales(s, dx, nb, sc);
#endif
  for (int64_t b = 0; b < nb; ++b) sc[b] = to_f32(s[b / per_group]) * dx[b];
}

// The 4-bit mins' share of one row, in order: sum_g min[g] * (the group's xs, summed in block order).
template <typename S>
float mins_share_in_order(const S* mn, const float* xs, int64_t nb, int64_t per_group) {
  float macc = 0.f;
  for (int64_t g = 0, b = 0; g < nb / per_group; ++g) {
    float group_sum = 0.f;
    for (int64_t j = 0; j < per_group; ++j, ++b) group_sum += xs[b];
    macc += to_f32(mn[g]) * group_sum;
  }
  return macc;
}

// The same on the vector path: one f32 dot product at group size 32.
template <typename S>
float mins_share(const S* mn, const float* xs, int64_t nb, int64_t per_group, float* buf) {
  if (per_group == 1) return dot_f32(row_f32<S>(mn, nb, buf), xs, nb);
  return mins_share_in_order(mn, xs, nb, per_group);
}

// ---- scalar: the readable statement of every path ---------------------------------------------------

template <typename S>
float q8_row_scalar(const int8_t* q, const S* s, int64_t K, int64_t G, const int8_t* xq, const float* dx) {
  const int64_t per_group = G / kBlock;
  float acc = 0.f;
  for (int64_t b = 0; b < K / kBlock; ++b)
    acc += static_cast<float>(q8_block_scalar(q + b * kBlock, xq + b * kBlock)) * (to_f32(s[b / per_group]) * dx[b]);
  return acc;
}

template <typename S>
float q4_row_scalar(const uint8_t* q, const S* s, const S* mn, int64_t K, int64_t G, const int8_t* xq, const float* dx,
                    const float* xs) {
  const int64_t per_group = G / kBlock, nb = K / kBlock;
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b)
    acc += static_cast<float>(q4_block_scalar(q + b * (kBlock / 2), xq + b * kBlock)) * (to_f32(s[b / per_group]) * dx[b]);
  return acc + mins_share_in_order(mn, xs, nb, per_group);
}

#ifdef FUELPIPE_HAS_AVX2
// ---- avx2: R weight rows against one activation row, the activations loaded once per block ----------
//
// A row's f32 work is the same whatever R: block (or pair) i's int32 lanes, as f32, times its scales, into
// chain i % 2 in order; then hsum(chain 0 + chain 1). So a row has the same bits in a tile or alone.

inline __m256i sum_pairs_to_i32(__m256i products16) { return _mm256_madd_epi16(products16, _mm256_set1_epi16(1)); }

// 32 int8 weights times 32 int8 activations -> 8 int32 lanes summing to the block's exact dot product.
inline __m256i q8_block_avx2(__m256i w, __m256i x) {
  return sum_pairs_to_i32(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)));
}

// [sc[0] x 4 | sc[1] x 4]: a pair of blocks' scales for the lanes q4_pair_avx2 returns.
inline __m256 pair_scales(const float* sc) {
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_broadcast_ss(sc)), _mm_broadcast_ss(sc + 1), 1);
}

// Two blocks' 4-bit codes (32 bytes) against their activations in pair order (permute_pairs_for_q4):
// lo = [block 0's elements 0..15 | block 1's 0..15], hi = the same for elements 16..31. Lanes 0..3 of the
// result sum block 0, lanes 4..7 block 1. A 16-bit lane adds two pairs: at most 4 * 15 * 127.
inline __m256i q4_pair_avx2(const uint8_t* qb, __m256i lo, __m256i hi) {
  const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb)), mask = _mm256_set1_epi8(0x0F);
  const __m256i c_lo = _mm256_and_si256(codes, mask), c_hi = _mm256_and_si256(_mm256_srli_epi16(codes, 4), mask);
  return sum_pairs_to_i32(_mm256_add_epi16(_mm256_maddubs_epi16(c_lo, lo), _mm256_maddubs_epi16(c_hi, hi)));
}

// One block's 4-bit codes (an odd row's last block) against its activations in block order.
inline __m256i q4_block_avx2(const uint8_t* qb, __m256i x) {
  const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qb)));
  const __m256i codes = _mm256_and_si256(_mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),
                                         _mm256_set1_epi8(0x0F));  // [elements 0..15 | 16..31]
  return sum_pairs_to_i32(_mm256_maddubs_epi16(codes, x));
}

// Each pair of blocks (b, b + 1) of an int8 activation row as [b's 0..15, b+1's 0..15, b's 16..31, b+1's
// 16..31] for q4_pair_avx2; a last odd block stays in block order.
void permute_pairs_for_q4(int8_t* xq, int64_t K) {
  int8_t tmp[2 * kBlock];
  for (int64_t b = 0; b + 2 <= K / kBlock; b += 2) {
    int8_t* x = xq + b * kBlock;
    std::memcpy(tmp, x, 16);
    std::memcpy(tmp + 16, x + kBlock, 16);
    std::memcpy(tmp + 32, x + 16, 16);
    std::memcpy(tmp + 48, x + kBlock + 16, 16);
    std::memcpy(x, tmp, sizeof(tmp));
  }
}

inline __m256i load32(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// R int8 rows q[r] [K] (scales s[r] [K / G]) against xq [K] -> out[r]. sc: R * K / 32 floats.
template <typename S, int R>
void q8_tile_avx2(const int8_t* const* q, const S* const* s, int64_t K, int64_t G, const int8_t* xq, const float* dx,
                  float* sc, float* out) {
  const int64_t nb = K / kBlock;
  for (int r = 0; r < R; ++r) row_block_scales(s[r], dx, nb, G / kBlock, sc + r * nb);
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i x = load32(xq + b * kBlock);
    const int chain = static_cast<int>(b & 1);
    for (int r = 0; r < R; ++r) {
      const int8_t* qb = q[r] + b * kBlock;
      if (chain == 0) _mm_prefetch(reinterpret_cast<const char*>(qb) + kPrefetchBytes, _MM_HINT_T0);
      const __m256 part = _mm256_cvtepi32_ps(q8_block_avx2(load32(qb), x));
      acc[r][chain] = _mm256_fmadd_ps(part, _mm256_broadcast_ss(sc + r * nb + b), acc[r][chain]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
}

// R 4-bit rows q[r] [K / 2] (scales s[r], mins mn[r] [K / G]) against xq in pair order -> out[r].
// sc and mins: R * K / 32 floats each.
template <typename S, int R>
void q4_tile_avx2(const uint8_t* const* q, const S* const* s, const S* const* mn, int64_t K, int64_t G, const int8_t* xq,
                  const float* dx, const float* xs, float* sc, float* mins, float* out) {
  const int64_t nb = K / kBlock, per_group = G / kBlock;
  for (int r = 0; r < R; ++r) row_block_scales(s[r], dx, nb, per_group, sc + r * nb);
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    const __m256i lo = load32(xq + b * kBlock), hi = load32(xq + b * kBlock + kBlock);
    const int chain = static_cast<int>((b >> 1) & 1);
    for (int r = 0; r < R; ++r) {
      const uint8_t* qb = q[r] + b * (kBlock / 2);
      if (chain == 0) _mm_prefetch(reinterpret_cast<const char*>(qb) + kPrefetchBytes, _MM_HINT_T0);
      const __m256 part = _mm256_cvtepi32_ps(q4_pair_avx2(qb, lo, hi));
      acc[r][chain] = _mm256_fmadd_ps(part, pair_scales(sc + r * nb + b), acc[r][chain]);
    }
  }
  if (b < nb) {
    const __m256i x = load32(xq + b * kBlock);
    for (int r = 0; r < R; ++r) {
      const __m256 part = _mm256_cvtepi32_ps(q4_block_avx2(q[r] + b * (kBlock / 2), x));
      acc[r][0] = _mm256_fmadd_ps(part, _mm256_broadcast_ss(sc + r * nb + b), acc[r][0]);
    }
  }
  for (int r = 0; r < R; ++r)
    out[r] = hsum(_mm256_add_ps(acc[r][0], acc[r][1])) + mins_share(mn[r], xs, nb, per_group, mins + r * nb);
}
#endif  // FUELPIPE_HAS_AVX2

// ---- the operators ------------------------------------------------------------------------------

// A thread's scratch for the rows it takes alone (a run's last rows): grown once, never per row.
inline float* row_scratch(int64_t n) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  return buf.data();
}

inline bool vector_rows() {
#ifdef FUELPIPE_HAS_AVX2
  return at_least(Path::avx2);
#else
  return false;
#endif
}

at::Tensor q8_gemv_a8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales, const c10::optional<at::Tensor>& bias) {
  const auto shape = q8_shapes("q8_gemv_a8", x, q, scales, bias);
  const int64_t N = shape[0], K = shape[1], G = shape[2], KG = K / G;
  const int8_t* qp = q.data_ptr<int8_t>();
  const bool vec = vector_rows();
  auto typed = [&](auto* sp) {
    using S = std::remove_const_t<std::remove_pointer_t<decltype(sp)>>;
    auto row = [&](int64_t n, const int8_t* xq, const float* dx, const float*) -> float {
#ifdef FUELPIPE_HAS_AVX2
      if (vec) {
        const int8_t* qs[1] = {qp + n * K};
        const S* ss[1] = {sp + n * KG};
        float v;
        q8_tile_avx2<S, 1>(qs, ss, K, G, xq, dx, row_scratch(K / kBlock), &v);
        return v;
      }
#endif
      return q8_row_scalar(qp + n * K, sp + n * KG, K, G, xq, dx);
    };
    auto tile = [&](const int64_t* rows, const int8_t* xq, const float* dx, const float*, float* scratch, float* v) {
#ifdef FUELPIPE_HAS_AVX2
      const int8_t* qs[kStreams];
      const S* ss[kStreams];
      for (int r = 0; r < kStreams; ++r) qs[r] = qp + rows[r] * K, ss[r] = sp + rows[r] * KG;
      q8_tile_avx2<S, kStreams>(qs, ss, K, G, xq, dx, scratch, v);
#endif
    };
    return run_quantized_rows<int8_t>(x, N, K, bias, quantize_row_a8, row, vec, tile);
  };
  if (scales.scalar_type() == at::kFloat) return typed(scales.data_ptr<float>());
  return typed(scales.data_ptr<c10::Half>());
}

at::Tensor q4_gemv_a8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales, const at::Tensor& mins,
                      const c10::optional<at::Tensor>& bias) {
  const auto shape = q4_shapes("q4_gemv_a8", x, q, scales, mins, bias);
  const int64_t N = shape[0], K = shape[1], G = shape[2], KG = K / G, nb = K / kBlock;
  const uint8_t* qp = q.data_ptr<uint8_t>();
  const bool vec = vector_rows();
  auto quantize = [vec](const float* xr, int64_t k, int8_t* xq, float* dx, float* xs) {
    quantize_row_a8(xr, k, xq, dx, xs);
#ifdef FUELPIPE_HAS_AVX2
    if (vec) permute_pairs_for_q4(xq, k);
#endif
  };
  auto typed = [&](auto* sp, auto* mp) {
    using S = std::remove_const_t<std::remove_pointer_t<decltype(sp)>>;
    auto row = [&](int64_t n, const int8_t* xq, const float* dx, const float* xs) -> float {
#ifdef FUELPIPE_HAS_AVX2
      if (vec) {
        const uint8_t* qs[1] = {qp + n * (K / 2)};
        const S *ss[1] = {sp + n * KG}, *ms[1] = {mp + n * KG};
        float* scratch = row_scratch(2 * nb);
        float v;
        q4_tile_avx2<S, 1>(qs, ss, ms, K, G, xq, dx, xs, scratch, scratch + nb, &v);
        return v;
      }
#endif
      return q4_row_scalar(qp + n * (K / 2), sp + n * KG, mp + n * KG, K, G, xq, dx, xs);
    };
    auto tile = [&](const int64_t* rows, const int8_t* xq, const float* dx, const float* xs, float* scratch, float* v) {
#ifdef FUELPIPE_HAS_AVX2
      const uint8_t* qs[kStreams];
      const S *ss[kStreams], *ms[kStreams];
      for (int r = 0; r < kStreams; ++r) qs[r] = qp + rows[r] * (K / 2), ss[r] = sp + rows[r] * KG, ms[r] = mp + rows[r] * KG;
      q4_tile_avx2<S, kStreams>(qs, ss, ms, K, G, xq, dx, xs, scratch, scratch + kStreams * nb, v);
#endif
    };
    return run_quantized_rows<int8_t>(x, N, K, bias, quantize, row, vec, tile);
  };
  if (scales.scalar_type() == at::kFloat) return typed(scales.data_ptr<float>(), mins.data_ptr<float>());
  return typed(scales.data_ptr<c10::Half>(), mins.data_ptr<c10::Half>());
}

}  // namespace fuelpipe_a8

TORCH_LIBRARY_IMPL(fuelpipe_kernels, CPU, m) {
  m.impl("q8_gemv_a8", fuelpipe_a8::q8_gemv_a8);
  m.impl("q4_gemv_a8", fuelpipe_a8::q4_gemv_a8);
}
