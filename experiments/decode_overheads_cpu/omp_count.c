// LD_PRELOAD shim: counts libgomp parallel regions (GOMP_parallel*) and can time empty ones.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
static atomic_long regions;
typedef void (*gomp_fn)(void (*)(void*), void*, unsigned, unsigned);
void GOMP_parallel(void (*fn)(void*), void* data, unsigned n, unsigned flags) {
  static gomp_fn real; if (!real) real = (gomp_fn)dlsym(RTLD_NEXT, "GOMP_parallel");
  atomic_fetch_add(&regions, 1); real(fn, data, n, flags);
}
long fuelpipe_omp_regions(void) { return atomic_load(&regions); }
static void empty(void* d) { (void)d; }
void fuelpipe_omp_empty(long count) { for (long i = 0; i < count; ++i) GOMP_parallel(empty, 0, 0, 0); }
