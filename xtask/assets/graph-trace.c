// A CUDA-graph tracer for the GPU machine: preloaded into any of our binaries, it writes every
// graph instantiation and every executable-graph update (MLX's CUDA backend instantiates a graph
// for a command buffer it has not seen and updates the cached one otherwise, see docs/gpu.md,
// session 38) to $GRAPH_TRACE_OUT.<pid>, one tab-separated line each:
//   start (ns, CLOCK_REALTIME, the clock of our tracing's timestamps)  duration (ns)  function
//   nodes (of the graph instantiated; 0 for an update)  CUresult (non-zero: an update failed)
// through CUPTI's callback API on the driver domain. Built on the device like cupti-trace.c, with
// a stub for the one header the pip CUDA headers lack (only its macros are needed here):
//   mkdir -p /tmp/stub/crt && printf '#define __device_builtin__\n#define __device_builtin_texture_type__\n
//     #define __device_builtin_surface_type__\n#define __cudart_builtin__\n#define __host__\n#define __device__\n
//     #define __align__(n) __attribute__((aligned(n)))\n#define CUDARTAPI\n#define __builtin_align__(a) __align__(a)\n
//     #define __location__(a) __##a\n#define __cuda_align__(n) __align__(n)\n' > /tmp/stub/crt/host_defines.h
//     (one printf command; the line breaks here are only for width)
//   NV=/opt/torch/.venv/lib/python3.12/site-packages/nvidia
//   gcc -shared -fPIC -O2 -I/tmp/stub -I$NV/cu13/include xtask/assets/graph-trace.c -o /tmp/libgraph.so
//       $(ls $NV/cu13/lib/libcupti.so* | head -1) -Wl,-rpath,$NV/cu13/lib -ldl  (one line)
//   GRAPH_TRACE_OUT=/tmp/graphs LD_PRELOAD=/tmp/libgraph.so .../scale-bench ...
#include <cupti.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef CUresult (*GetNodes)(CUgraph, CUgraphNode*, size_t*);
static FILE* out;
static GetNodes get_nodes;
static __thread long long entered;

static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

// Every cuGraphInstantiate* variant's parameters start (CUgraphExec*, CUgraph).
struct InstantiateHead {
  CUgraphExec* exec;
  CUgraph graph;
};

static void CUPTIAPI on_call(void* user, CUpti_CallbackDomain domain, CUpti_CallbackId id,
                             const void* data) {
  (void)user, (void)domain, (void)id;
  const CUpti_CallbackData* d = (const CUpti_CallbackData*)data;
  const char* f = d->functionName;
  if (!f || strncmp(f, "cuGraph", 7) != 0) return;
  int instantiate = strncmp(f, "cuGraphInstantiate", 18) == 0;
  if (!instantiate && strncmp(f, "cuGraphExecUpdate", 17) != 0) return;
  if (d->callbackSite == CUPTI_API_ENTER) {
    entered = now_ns();
    return;
  }
  long long end = now_ns();
  size_t nodes = 0;
  if (instantiate) {
    if (!get_nodes) {
      void* cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
      if (cuda) get_nodes = (GetNodes)dlsym(cuda, "cuGraphGetNodes");
    }
    if (get_nodes) get_nodes(((const struct InstantiateHead*)d->functionParams)->graph, NULL, &nodes);
  }
  int rc = d->functionReturnValue ? *(const int*)d->functionReturnValue : 0;
  fprintf(out, "%lld\t%lld\t%s\t%zu\t%d\n", entered, end - entered, f, nodes, rc);
}

__attribute__((constructor)) static void init(void) {
  const char* p = getenv("GRAPH_TRACE_OUT");
  if (!p) return;
  char path[4096];
  snprintf(path, sizeof path, "%s.%d", p, (int)getpid());
  out = fopen(path, "w");
  if (!out) return;
  setvbuf(out, NULL, _IOFBF, 1 << 20);
  CUpti_SubscriberHandle s;
  if (cuptiSubscribe(&s, on_call, NULL) != CUPTI_SUCCESS ||
      cuptiEnableDomain(1, s, CUPTI_CB_DOMAIN_DRIVER_API) != CUPTI_SUCCESS) {
    fprintf(stderr, "graph-trace: CUPTI callbacks unavailable\n");
  }
}

__attribute__((destructor)) static void fini(void) {
  if (out) fclose(out);
}
