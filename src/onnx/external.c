/* external.c - mmap of external-data files with path confinement. */
#define _GNU_SOURCE
#include "onnx/external.h"

#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct kiln_mapping {
    kiln_mapping *next;
    char *location;
    unsigned char *addr;
    size_t len;
};

static bool has_dotdot(const char *p)
{
    const char *s = p;
    while (*s) {
        const char *e = strchr(s, '/');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n == 2 && s[0] == '.' && s[1] == '.') return true;
        if (!e) break;
        s = e + 1;
    }
    return false;
}

kiln_status kiln_external_map(kiln_mapping **list, const char *base_dir, const char *location,
                              const unsigned char **addr, size_t *len, kiln_err *err)
{
    for (kiln_mapping *m = *list; m; m = m->next)
        if (m->location && !strcmp(m->location, location)) {
            *addr = m->addr;
            *len = m->len;
            return KILN_OK;
        }
    if (!base_dir)
        return kiln_errf(err, KILN_ERR_MODEL, "external data '%s' but the model has no folder", location);
    if (!*location || location[0] == '/' || has_dotdot(location) || strchr(location, '\\'))
        return kiln_errf(err, KILN_ERR_MODEL, "external data path '%s' leaves the model's folder", location);
    char joined[PATH_MAX], real_base[PATH_MAX], real_file[PATH_MAX];
    if (snprintf(joined, sizeof joined, "%s/%s", base_dir, location) >= (int)sizeof joined)
        return kiln_errf(err, KILN_ERR_MODEL, "external data path too long");
    if (!realpath(base_dir, real_base))
        return kiln_errf(err, KILN_ERR_IO, "cannot resolve model folder '%s'", base_dir);
    if (!realpath(joined, real_file))
        return kiln_errf(err, KILN_ERR_IO, "cannot open external data '%s'", joined);
    size_t bl = strlen(real_base);
    if (strncmp(real_file, real_base, bl) || (real_base[bl - 1] != '/' && real_file[bl] != '/'))
        return kiln_errf(err, KILN_ERR_MODEL, "external data '%s' resolves outside the model's folder", location);
    int fd = open(real_file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kiln_errf(err, KILN_ERR_IO, "cannot open external data '%s'", joined);
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return kiln_errf(err, KILN_ERR_IO, "external data '%s' is not a regular file", joined);
    }
    unsigned char *p = NULL;
    if (st.st_size > 0) {
        p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return kiln_errf(err, KILN_ERR_IO, "cannot map external data '%s'", joined);
        }
    }
    close(fd);
    kiln_mapping *m = calloc(1, sizeof *m);
    char *loc = strdup(location);
    if (!m || !loc) {
        free(m);
        free(loc);
        if (p) munmap(p, (size_t)st.st_size);
        return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    }
    m->location = loc;
    m->addr = p;
    m->len = (size_t)st.st_size;
    m->next = *list;
    *list = m;
    *addr = p;
    *len = m->len;
    return KILN_OK;
}

bool kiln_mapping_adopt(kiln_mapping **list, unsigned char *addr, size_t len)
{
    kiln_mapping *m = calloc(1, sizeof *m);
    if (!m) return false;
    m->addr = addr;
    m->len = len;
    m->next = *list;
    *list = m;
    return true;
}

void kiln_mapping_forget(kiln_mapping *list, const unsigned char *addr)
{
    for (; list; list = list->next)
        if (list->addr == addr) list->addr = NULL;
}

void kiln_mappings_release(kiln_mapping *list)
{
    while (list) {
        kiln_mapping *n = list->next;
        if (list->addr) munmap(list->addr, list->len);
        free(list->location);
        free(list);
        list = n;
    }
}

bool kiln_mappings_drop(kiln_mapping *list, const void *p, size_t n)
{
    uintptr_t lo = (uintptr_t)p, hi = lo + n;
    for (; list; list = list->next) {
        uintptr_t base = (uintptr_t)list->addr;
        if (!list->addr || lo < base || hi > base + list->len) continue;
        uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
        uintptr_t a = (lo + page - 1) & ~(page - 1), b = hi & ~(page - 1); /* whole pages only */
        if (a < b) madvise((void *)a, b - a, MADV_DONTNEED);
        return true;
    }
    return false;
}
