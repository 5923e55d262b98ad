/* target.h - a region of a file compiled for an instruction set beyond the build's baseline
 * (x86-64 GCC or clang; the file guards the region and chooses at run time whether to call it):
 *     KILN_TARGET_BEGIN("avx512f")
 *     #include "cpu/avx512_util.h"   (intrinsic helpers go inside the region)
 *     ... functions ...
 *     KILN_TARGET_END */
#ifndef KILN_CPU_TARGET_H
#define KILN_CPU_TARGET_H

#define KILN_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define KILN_TARGET_BEGIN(isa) KILN_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define KILN_TARGET_END KILN_PRAGMA(clang attribute pop)
#else
#define KILN_TARGET_BEGIN(isa) KILN_PRAGMA(GCC push_options) KILN_PRAGMA(GCC target(isa))
#define KILN_TARGET_END KILN_PRAGMA(GCC pop_options)
#endif

#endif
