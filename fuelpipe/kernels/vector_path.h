// Which vector path fuelpipe's kernels take: one choice per process, made at run time from the CPU's flags
// among the paths this build compiled, and forceable (tests, benchmarks) through set_vector_path.
//
// The paths, lowest first; each kernel has the paths listed for it and takes the highest it has at or
// below the chosen one (a kernel without an AVX-512 path runs its AVX2 path under "avx512"):
//   scalar    portable C++; the readable statement of what every path computes
//   avx2      AVX2 + FMA + F16C, 8 f32 lanes: every kernel
//   avx_vnni  AVX-VNNI (256-bit VPDPWSSD): the 16-bit-activation products fuse a block's two halves
//   avx512    AVX-512 F/BW/VL, 16 lanes: the 16-bit-activation products take a whole block per instruction
// AVX-512 VNNI adds nothing over avx512 there: a 32-element block is one 512-bit multiply-add whose
// int32 result is scaled on its own (per-block activation scales), so there is no second product to fuse.
// AMX tiles are not used: AMX-INT8 multiplies 8-bit operands only (the default activations are 16-bit; the
// opt-in 8-bit ones of quant_a8.cpp have only scalar and avx2 paths so far), and a decode step is one row,
// where a 16-row tile would do 1/16 useful work.
//
// A path is compiled only when the compiler targets it (the library is built per machine with
// -march=native) and offered only when the CPU reports it, so a CPU without a path gets the next one down.
#pragma once

#include <atomic>
#include <string>
#include <vector>

namespace fuelpipe_isa {

enum class Path : int { scalar = 0, avx2 = 1, avx_vnni = 2, avx512 = 3 };
constexpr int kPaths = 4;
inline const char* const kNames[kPaths] = {"scalar", "avx2", "avx_vnni", "avx512"};

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define FUELPIPE_HAS_AVX2 1
#endif
#if defined(FUELPIPE_HAS_AVX2) && defined(__AVXVNNI__)
#define FUELPIPE_HAS_AVX_VNNI 1
#endif
#if defined(FUELPIPE_HAS_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define FUELPIPE_HAS_AVX512 1
#endif

// Compiled into this build and reported by this CPU.
inline bool runnable(Path p) {
  __builtin_cpu_init();
  switch (p) {
    case Path::scalar:
      return true;
    case Path::avx2:
#ifdef FUELPIPE_HAS_AVX2
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
      return false;
#endif
    case Path::avx_vnni:
#ifdef FUELPIPE_HAS_AVX_VNNI
      return runnable(Path::avx2) && __builtin_cpu_supports("avxvnni");
#else
      return false;
#endif
    case Path::avx512:
#ifdef FUELPIPE_HAS_AVX512
      return runnable(Path::avx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
#else
      return false;
#endif
  }
  return false;
}

inline Path best() {
  for (int i = kPaths - 1; i > 0; --i)
    if (runnable(static_cast<Path>(i))) return static_cast<Path>(i);
  return Path::scalar;
}

// One choice for the whole library (an inline variable: one object across its translation units).
inline std::atomic<int> chosen{-1};

inline Path current() {
  int c = chosen.load(std::memory_order_relaxed);
  if (c < 0) {
    c = static_cast<int>(best());
    chosen.store(c, std::memory_order_relaxed);
  }
  return static_cast<Path>(c);
}

// True when the chosen path is p or above: a kernel runs its code for p.
inline bool at_least(Path p) { return static_cast<int>(current()) >= static_cast<int>(p); }

// Kernels with several vector paths above avx2 take the one measured fastest on this CPU
// (fuelpipe.kernels.build measures once per machine and build), never above the chosen path; a forced
// path (set_vector_path with a name) is taken as it is, so tests and benchmarks run exactly that path.
enum class Measured : int { q8_a16 = 0, q4_a16 = 1, f32_rows = 2 };  // f32_rows: its several-rows tile
constexpr int kMeasured = 3;
inline const char* const kMeasuredNames[kMeasured] = {"q8_gemv_a16", "q4_gemv_a16", "f32_rows_linear"};
inline std::atomic<int> measured_best[kMeasured] = {-1, -1, -1};
inline std::atomic<bool> forced{false};

inline Path path_for(Measured kernel) {
  const int c = static_cast<int>(current());
  const int m = measured_best[static_cast<int>(kernel)].load(std::memory_order_relaxed);
  return static_cast<Path>(!forced.load(std::memory_order_relaxed) && m >= 0 && m < c ? m : c);
}

inline std::vector<std::string> runnable_names() {
  std::vector<std::string> out;
  for (int i = 0; i < kPaths; ++i)
    if (runnable(static_cast<Path>(i))) out.emplace_back(kNames[i]);
  return out;
}

}  // namespace fuelpipe_isa
