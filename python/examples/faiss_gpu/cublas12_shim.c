/* libcublas.so.12 for a process that has only cuBLAS 13: the eight functions FAISS's GPU
 * wheel (faiss-gpu-cu12 1.9.0.0) calls, each forwarding to the same function of
 * libcublas.so.13 (path in $CUBLAS13, else found by the loader). Their signatures and the
 * enumerations they take did not change between cuBLAS 12 and 13. Built by prepare.sh with a
 * version script, since FAISS binds the symbols at version `libcublas.so.12`. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int status;
static void *lib;

static void *sym(const char *name) {
    if (!lib) {
        const char *path = getenv("CUBLAS13");
        lib = dlopen(path ? path : "libcublas.so.13", RTLD_NOW | RTLD_GLOBAL);
        if (!lib) {
            fprintf(stderr, "cublas12 shim: %s\n", dlerror());
            abort();
        }
    }
    void *f = dlsym(lib, name);
    if (!f) {
        fprintf(stderr, "cublas12 shim: libcublas.so.13 has no %s\n", name);
        abort();
    }
    return f;
}

#define FORWARD(name, params, args)                                                          \
    status name params {                                                                     \
        static status(*f) params;                                                            \
        if (!f) f = (status(*) params)sym(#name);                                            \
        return f args;                                                                       \
    }

FORWARD(cublasCreate_v2, (void **h), (h))
FORWARD(cublasDestroy_v2, (void *h), (h))
FORWARD(cublasSetStream_v2, (void *h, void *s), (h, s))
FORWARD(cublasGetMathMode, (void *h, int *m), (h, m))
FORWARD(cublasSetMathMode, (void *h, int m), (h, m))
FORWARD(cublasSgemmEx,
        (void *h, int ta, int tb, int m, int n, int k, const float *alpha, const void *a, int at,
         int lda, const void *b, int bt, int ldb, const float *beta, void *c, int ct, int ldc),
        (h, ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ct, ldc))
FORWARD(cublasGemmEx,
        (void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *a, int at,
         int lda, const void *b, int bt, int ldb, const void *beta, void *c, int ct, int ldc,
         int compute, int algo),
        (h, ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ct, ldc, compute, algo))
FORWARD(cublasGemmStridedBatchedEx,
        (void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *a, int at,
         int lda, long long sa, const void *b, int bt, int ldb, long long sb, const void *beta,
         void *c, int ct, int ldc, long long sc, int batch, int compute, int algo),
        (h, ta, tb, m, n, k, alpha, a, at, lda, sa, b, bt, ldb, sb, beta, c, ct, ldc, sc, batch,
         compute, algo))
