/* verify.h - `kiln verify`: every intermediate value of the served path against the reference. */
#ifndef KILN_TOOLS_VERIFY_H
#define KILN_TOOLS_VERIFY_H

int cmd_verify(int argc, char **argv);

#endif
