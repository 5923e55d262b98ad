/* external.h - read-only mappings of external-data files (how models over 2 GB keep weights),
 * confined to the model's folder. */
#ifndef KILN_ONNX_EXTERNAL_H
#define KILN_ONNX_EXTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"

typedef struct kiln_mapping kiln_mapping;

/* Maps base_dir/location (once per file; later calls reuse the mapping in *list) and returns
 * its address and length. Fails with KILN_ERR_MODEL when location is absolute, contains "..",
 * or resolves (through symlinks) outside base_dir, and when base_dir is NULL. */
kiln_status kiln_external_map(kiln_mapping **list, const char *base_dir, const char *location,
                              const unsigned char **addr, size_t *len, kiln_err *err);
/* Keeps the read-only mapping [addr, addr + len) (of the model file itself) in *list, which
 * unmaps it when released. False when out of memory (the caller still owns the mapping). */
bool kiln_mapping_adopt(kiln_mapping **list, unsigned char *addr, size_t len);
/* Takes the mapping at addr off the list's hands again (not unmapped). */
void kiln_mapping_forget(kiln_mapping *list, const unsigned char *addr);
void kiln_mappings_release(kiln_mapping *list);
/* When [p, p + n) lies in one of the mappings, drops its whole pages from memory
 * (MADV_DONTNEED: a later read maps them in again from the file) and returns true. */
bool kiln_mappings_drop(kiln_mapping *list, const void *p, size_t n);

#endif
