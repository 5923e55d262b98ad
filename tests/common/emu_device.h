/* emu_device.h - an emulated device provider for the tests: it lets the device half of the
 * executor (partitioning, copies between host and device memory, device arenas, device
 * outputs) run on any CPU, in CI. Installed with kiln_test_device_provider (exec/test_hooks.h),
 * it answers sessions created for KILN_PROVIDER_CUDA. */
#ifndef KILN_TESTS_EMU_DEVICE_H
#define KILN_TESTS_EMU_DEVICE_H

#include "ops/provider.h"

typedef enum emu_device_mode {
    EMU_DEVICE_ALL,   /* every node with a numeric-tensor signature on the device */
    EMU_DEVICE_SPLIT, /* about half of those (by a hash of the node's name): many boundaries */
} emu_device_mode;

extern const kiln_provider_i emu_device;

/* Which nodes emu_device takes in sessions compiled from now on (default EMU_DEVICE_ALL). */
void emu_device_set_mode(emu_device_mode m);

#endif
