/* test_hooks.h - test-only hooks, outside the public API (include/kiln.h): `kiln verify
 * --test-fault-node` and the tests use them, nothing else. */
#ifndef KILN_EXEC_TEST_HOOKS_H
#define KILN_EXEC_TEST_HOOKS_H

#include "kiln.h"
#include "ops/provider.h"

/* After the node named `node` runs, its output 0 (on the host) has its elements reversed:
 * the right values in the wrong places, as a kernel with a layout bug would give. The name is
 * copied; NULL turns the hook off. Not to be called while s runs. */
kiln_status kiln_session_set_test_fault(kiln_session *s, const char *node);

/* From now on, sessions asking for provider p->kind get p instead of the built-in table (a
 * test's emulated device: tests/common/emu_device.h); NULL restores the built-in ones. Not to
 * be called while sessions are being created. */
void kiln_test_device_provider(const kiln_provider_i *p);

#endif
