/*
 * dnnl_gemm.c - oneDNN bf16 matmul probe through the already-loaded
 * libdnnl.so.2 (see dnnl_gemm.h). Only types come from oneDNN's header; every
 * function is looked up with dlsym, so orch itself does not link oneDNN.
 */
#include "orchestrator/bench/dnnl_gemm.h"

#include <dlfcn.h>
#include <oneapi/dnnl/dnnl_types.h>
#include <string.h>

#include "orchestrator/core/util.h"

typedef struct dnnl_fns {
    dnnl_status_t (*engine_create)(dnnl_engine_t *, dnnl_engine_kind_t, size_t);
    dnnl_status_t (*engine_destroy)(dnnl_engine_t);
    dnnl_status_t (*stream_create)(dnnl_stream_t *, dnnl_engine_t, unsigned);
    dnnl_status_t (*stream_wait)(dnnl_stream_t);
    dnnl_status_t (*stream_destroy)(dnnl_stream_t);
    dnnl_status_t (*md_init_by_tag)(dnnl_memory_desc_t *, int, const dnnl_dims_t,
                                    dnnl_data_type_t, dnnl_format_tag_t);
    dnnl_status_t (*matmul_desc_init)(dnnl_matmul_desc_t *, const dnnl_memory_desc_t *,
                                      const dnnl_memory_desc_t *,
                                      const dnnl_memory_desc_t *,
                                      const dnnl_memory_desc_t *);
    dnnl_status_t (*pd_create)(dnnl_primitive_desc_t *, const_dnnl_op_desc_t,
                               const_dnnl_primitive_attr_t, dnnl_engine_t,
                               const_dnnl_primitive_desc_t);
    const dnnl_memory_desc_t *(*pd_query_md)(const_dnnl_primitive_desc_t, dnnl_query_t,
                                             int);
    dnnl_status_t (*pd_destroy)(dnnl_primitive_desc_t);
    dnnl_status_t (*prim_create)(dnnl_primitive_t *, const_dnnl_primitive_desc_t);
    dnnl_status_t (*prim_execute)(const_dnnl_primitive_t, dnnl_stream_t, int,
                                  const dnnl_exec_arg_t *);
    dnnl_status_t (*prim_destroy)(dnnl_primitive_t);
    dnnl_status_t (*mem_create)(dnnl_memory_t *, const dnnl_memory_desc_t *,
                                dnnl_engine_t, void *);
    dnnl_status_t (*mem_destroy)(dnnl_memory_t);
    void (*omp_set_num_threads)(int);
} dnnl_fns;

/* Look up every function; 0 on success. */
static int resolve(void *dl, dnnl_fns *f) {
    struct {
        void *slot;
        const char *name;
    } t[] = {
        { &f->engine_create, "dnnl_engine_create" },
        { &f->engine_destroy, "dnnl_engine_destroy" },
        { &f->stream_create, "dnnl_stream_create" },
        { &f->stream_wait, "dnnl_stream_wait" },
        { &f->stream_destroy, "dnnl_stream_destroy" },
        { &f->md_init_by_tag, "dnnl_memory_desc_init_by_tag" },
        { &f->matmul_desc_init, "dnnl_matmul_desc_init" },
        { &f->pd_create, "dnnl_primitive_desc_create" },
        { &f->pd_query_md, "dnnl_primitive_desc_query_md" },
        { &f->pd_destroy, "dnnl_primitive_desc_destroy" },
        { &f->prim_create, "dnnl_primitive_create" },
        { &f->prim_execute, "dnnl_primitive_execute" },
        { &f->prim_destroy, "dnnl_primitive_destroy" },
        { &f->mem_create, "dnnl_memory_create" },
        { &f->mem_destroy, "dnnl_memory_destroy" },
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        void *sym = dlsym(dl, t[i].name);
        if (!sym) return -1;
        memcpy(t[i].slot, &sym, sizeof sym);
    }
    void *omp = dlsym(dl, "omp_set_num_threads");
    memcpy(&f->omp_set_num_threads, &omp, sizeof omp);
    return 0;
}

double dnnl_gemm_bf16_gflops(int threads, int M, int N, int K) {
    void *dl = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!dl) return 0.0;
    dnnl_fns f;
    memset(&f, 0, sizeof f);
    double best = 0.0;
    dnnl_engine_t eng = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t mem[3] = { NULL, NULL, NULL };
    if (resolve(dl, &f) != 0) goto done;
    if (f.omp_set_num_threads && threads > 0) f.omp_set_num_threads(threads);
    if (f.engine_create(&eng, dnnl_cpu, 0) != dnnl_success) goto done;
    if (f.stream_create(&stream, eng, dnnl_stream_default_flags) != dnnl_success)
        goto done;
    dnnl_memory_desc_t src, wei, dst;
    const dnnl_dims_t sd = { M, K }, wd = { K, N }, dd = { M, N };
    if (f.md_init_by_tag(&src, 2, sd, dnnl_bf16, dnnl_ab) != dnnl_success ||
        f.md_init_by_tag(&wei, 2, wd, dnnl_bf16, dnnl_format_tag_any) != dnnl_success ||
        f.md_init_by_tag(&dst, 2, dd, dnnl_f32, dnnl_ab) != dnnl_success)
        goto done;
    dnnl_matmul_desc_t md;
    if (f.matmul_desc_init(&md, &src, &wei, NULL, &dst) != dnnl_success) goto done;
    if (f.pd_create(&pd, &md, NULL, eng, NULL) != dnnl_success) goto done;
    if (f.prim_create(&prim, pd) != dnnl_success) goto done;
    const dnnl_memory_desc_t *wmd = f.pd_query_md(pd, dnnl_query_weights_md, 0);
    if (!wmd) goto done;
    /* DNNL_MEMORY_ALLOCATE: oneDNN owns the buffers; contents do not change
     * the time of a dense product. */
    if (f.mem_create(&mem[0], &src, eng, DNNL_MEMORY_ALLOCATE) != dnnl_success ||
        f.mem_create(&mem[1], wmd, eng, DNNL_MEMORY_ALLOCATE) != dnnl_success ||
        f.mem_create(&mem[2], &dst, eng, DNNL_MEMORY_ALLOCATE) != dnnl_success)
        goto done;
    const dnnl_exec_arg_t args[3] = { { DNNL_ARG_SRC, mem[0] },
                                      { DNNL_ARG_WEIGHTS, mem[1] },
                                      { DNNL_ARG_DST, mem[2] } };
    for (int r = 0; r < 5; r++) {
        double t0 = util_now();
        if (f.prim_execute(prim, stream, 3, args) != dnnl_success) goto done;
        f.stream_wait(stream);
        double dt = util_now() - t0;
        if (r > 0 && dt > 0) { /* r == 0 warms up (JIT, pages) */
            double gf = 2.0 * M * (double)N * K / dt / 1e9;
            if (gf > best) best = gf;
        }
    }
done:
    for (int i = 0; i < 3; i++)
        if (mem[i]) f.mem_destroy(mem[i]);
    if (prim) f.prim_destroy(prim);
    if (pd) f.pd_destroy(pd);
    if (stream) f.stream_destroy(stream);
    if (eng) f.engine_destroy(eng);
    dlclose(dl);
    return best;
}
