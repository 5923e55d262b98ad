/* libload.h - opening a GPU library at run time (cuBLAS, cuDNN), once per process: the first
 * of several file names that loads, and its entry points resolved by name. */
#ifndef KILN_GPU_LIBLOAD_H
#define KILN_GPU_LIBLOAD_H

#include <pthread.h>
#include <stdbool.h>

#include "core/error.h"

/* A library and what kiln takes from it; static, one per library (blas_load.c, dnn_load.c). */
typedef struct kiln_gpu_lib {
    const char *what;               /* for messages: "CUDA provider", "cuDNN" */
    const char *const *files;       /* [n_files] tried in turn with dlopen */
    int n_files;
    const char *const *names;       /* [n] entry points */
    void **const *slots;            /* [n] where each entry point's address is stored */
    int n;
    pthread_mutex_t lock;           /* PTHREAD_MUTEX_INITIALIZER */
    bool tried;
    char failure[512];              /* empty once open */
} kiln_gpu_lib;

/* Opens l on the first call and resolves its names (thread-safe); later calls report the same
 * outcome: KILN_OK, or KILN_ERR_UNSUPPORTED with dlerror's words and the first file's name. */
kiln_status kiln_gpu_lib_open(kiln_gpu_lib *l, kiln_err *err);

#endif
