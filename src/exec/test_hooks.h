/* test_hooks.h - test-only hooks of a session, outside the public API (include/kiln.h):
 * `kiln verify --test-fault-node` and the tests that check verify use them, nothing else. */
#ifndef KILN_EXEC_TEST_HOOKS_H
#define KILN_EXEC_TEST_HOOKS_H

#include "kiln.h"

/* After the node named `node` runs, its output 0 (on the host) has its elements reversed:
 * the right values in the wrong places, as a kernel with a layout bug would give. The name is
 * copied; NULL turns the hook off. Not to be called while s runs. */
kiln_status kiln_session_set_test_fault(kiln_session *s, const char *node);

#endif
