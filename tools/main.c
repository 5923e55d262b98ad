/* main.c - the kiln command-line tool. */
#include <stdio.h>
#include <string.h>

#include "kiln.h"

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--version")) {
        printf("kiln %s\n", kiln_version());
        return 0;
    }
    fprintf(stderr, "usage: kiln --version\n");
    return 2;
}
