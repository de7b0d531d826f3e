// How the integer-activation products (quant_a16.cpp, quant_a8.cpp) walk a call: every activation row is
// quantized once, then the output rows are shared among the threads, each thread's run walked as kStreams
// stretches in lockstep. The per-row arithmetic is the caller's; this file only orders the work.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "quant_common.h"

namespace fuelpipe_quant {

// A thread's run of output rows is walked as kStreams equal stretches in lockstep, one row of each in turn:
// several distant weight streams in flight, which the hardware prefetchers serve better than one (as
// f32_rows.cpp). Measured on a 2-core Xeon (AVX-512, 480 MiB L3), SmolLM2-135M's 30 layers of linears,
// interleaved in one process: int8 6.5 -> 4.4 ms per token at 2 threads, 12.1 -> 8.6 at 1; 2, 6 and 8
// stretches were slower than 4. A row's result does not depend on the order rows are taken in.
constexpr int kStreams = 4;

// The quantized activation rows of one call: codes [M, K], steps dx [M, K / 32], and the blocks' sums as the
// kernel sees them, xs [M, K / 32] (dx * sum of the block's codes: the 4-bit mins' share).
template <typename Code>
struct QuantizedRows {
  int64_t M, K, nb;
  std::vector<Code> xq;
  std::vector<float> dx, xs;
  const Code* codes(int64_t m) const { return xq.data() + m * K; }
  const float* steps(int64_t m) const { return dx.data() + m * nb; }
  const float* sums(int64_t m) const { return xs.data() + m * nb; }
};

// Quantizes every row of x [M, K] with quantize_row(x_row, K, codes, dx, xs), then runs
// row_fn(n, codes, dx, xs) for each output. Where `tiled`, the kStreams rows a lockstep step visits run as
// one tile: tile_fn(rows[kStreams], codes, dx, xs, scratch, values[kStreams]), scratch 2 * kStreams * K / 32
// floats. The output rows are split among threads in grains of 16.
template <typename Code, typename QuantizeRow, typename RowFn, typename TileFn>
at::Tensor run_quantized_rows(const at::Tensor& x_in, int64_t N, int64_t K, const c10::optional<at::Tensor>& bias,
                    QuantizeRow quantize_row, RowFn row_fn, bool tiled, TileFn tile_fn) {
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = out_like(x, N);
  const int64_t M = x.numel() / K, nb = K / kBlock;
  QuantizedRows<Code> a{M, K, nb, std::vector<Code>(M * K), std::vector<float>(M * nb), std::vector<float>(M * nb)};
  const float* xp = x.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) quantize_row(xp + m * K, K, a.xq.data() + m * K, a.dx.data() + m * nb, a.xs.data() + m * nb);
  float* op = out.data_ptr<float>();
  const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();  // kept alive for the pointer
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  auto one_row = [&](int64_t n) {
    for (int64_t m = 0; m < M; ++m) {
      float v = row_fn(n, a.codes(m), a.steps(m), a.sums(m));
      op[m * N + n] = bp ? v + bp[n] : v;
    }
  };
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    const int64_t per = (end - begin) / kStreams;
    std::vector<float> scratch(tiled ? 2 * kStreams * nb : 0);
    for (int64_t i = 0; i < per; ++i) {
      if (!tiled) {
        for (int s = 0; s < kStreams; ++s) one_row(begin + s * per + i);
        continue;
      }
      int64_t rows[kStreams];
      for (int s = 0; s < kStreams; ++s) rows[s] = begin + s * per + i;
      for (int64_t m = 0; m < M; ++m) {
        float v[kStreams];
        tile_fn(rows, a.codes(m), a.steps(m), a.sums(m), scratch.data(), v);
        for (int s = 0; s < kStreams; ++s) op[m * N + rows[s]] = bp ? v[s] + bp[rows[s]] : v[s];
      }
    }
    for (int64_t n = begin + kStreams * per; n < end; ++n) one_row(n);
  });
  return out;
}

}  // namespace fuelpipe_quant
