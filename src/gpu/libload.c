/* libload.c - opening a GPU library at run time (libload.h). */
#include <dlfcn.h>
#include <stdio.h>

#include "gpu/libload.h"

static void load(kiln_gpu_lib *l)
{
    void *h = NULL;
    for (int i = 0; i < l->n_files && !h; i++) {
        h = dlopen(l->files[i], RTLD_NOW | RTLD_LOCAL);
        if (!h && i == 0) snprintf(l->failure, sizeof l->failure, "cannot load %s: %s", l->files[0], dlerror());
    }
    if (!h) return;
    for (int i = 0; i < l->n; i++) {
        *l->slots[i] = dlsym(h, l->names[i]);
        if (!*l->slots[i]) {
            snprintf(l->failure, sizeof l->failure, "%s has no %s", l->files[0], l->names[i]);
            return;
        }
    }
    l->failure[0] = '\0';
}

kiln_status kiln_gpu_lib_open(kiln_gpu_lib *l, kiln_err *err)
{
    pthread_mutex_lock(&l->lock);
    if (!l->tried) {
        l->tried = true;
        load(l);
    }
    pthread_mutex_unlock(&l->lock);
    if (l->failure[0]) return kiln_errf(err, KILN_ERR_UNSUPPORTED, "%s: %s", l->what, l->failure);
    return KILN_OK;
}
