// A kernel tracer for the GPU machine (no nsys there): preloaded into any of our binaries, it writes
// every kernel's and memcpy's start and end (ns), stream and name to $TRACE_OUT, one tab-separated line
// each, through CUPTI's activity API (kernels inside CUDA graphs included). docs/gpu.md, session 15,
// says how it was built and used there:
//   NV=/opt/torch/.venv/lib/python3.12/site-packages/nvidia
//   gcc -shared -fPIC -O2 -DKV=10 -I$NV/cu13/include xtask/assets/cupti-trace.c -o /tmp/libtrace.so \
//       $(ls $NV/cu13/lib/libcupti.so* | head -1) -Wl,-rpath,$NV/cu13/lib
//   TRACE_OUT=/tmp/trace.tsv LD_PRELOAD=/tmp/libtrace.so /tmp/mtp/bin/scale-bench ...
// KV picks CUPTI's kernel record version (CUpti_ActivityKernel10 with CUDA 13's CUPTI).
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#ifndef KV
#define KV 10
#endif
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
typedef CAT(CUpti_ActivityKernel, KV) Kern;
static FILE* out;
static void CUPTIAPI req(uint8_t** b, size_t* s, size_t* m) {
  *s = 16 << 20; *b = (uint8_t*)aligned_alloc(8, *s); *m = 0;
}
static void CUPTIAPI done(CUcontext c, uint32_t sid, uint8_t* b, size_t s, size_t valid) {
  CUpti_Activity* r = NULL;
  while (cuptiActivityGetNextRecord(b, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      Kern* k = (Kern*)r;
      fprintf(out, "%llu\t%llu\t%u\t%s\n", (unsigned long long)k->start, (unsigned long long)k->end,
              k->streamId, k->name);
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      CUpti_ActivityMemcpy6* m = (CUpti_ActivityMemcpy6*)r;
      fprintf(out, "%llu\t%llu\t%u\tMEMCPY%d_%llu\n", (unsigned long long)m->start, (unsigned long long)m->end,
              m->streamId, m->copyKind, (unsigned long long)m->bytes);
    }
  }
  free(b);
}
__attribute__((constructor)) static void init(void) {
  const char* p = getenv("TRACE_OUT");
  if (!p) return;
  out = fopen(p, "w");
  cuptiActivityRegisterCallbacks(req, done);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
}
__attribute__((destructor)) static void fini(void) {
  if (!out) return;
  cuptiActivityFlushAll(1);
  fclose(out);
}
