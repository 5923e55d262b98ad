/* cli.h - helpers shared by the kiln tool's commands: errors, sessions, input preparation. */
#ifndef KILN_TOOLS_CLI_H
#define KILN_TOOLS_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln.h"

/* Prints "kiln: MESSAGE" on stderr; returns 1. */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Opens a session, printing the error and returning NULL on failure. */
kiln_session *cli_open_session(const char *path, const kiln_session_options *opt);
const char *cli_kind_name(kiln_value_kind k);

/* One --input NAME=FILE or --shape NAME=DIMS option. */
typedef struct spec {
    char *name;
    char *file;          /* --input */
    int64_t dims[KILN_MAX_RANK];
    int rank;            /* --shape */
} spec;

typedef struct run_args {
    const char *model;
    spec *specs; /* in the order given, n_specs of them */
    int n_specs;
    uint64_t seed;
    const char *out_dir;
    int warmup, runs;
    bool json, stats;
    enum { PROFILE_OFF, PROFILE_COSTLIEST, PROFILE_ALL } profile; /* bench --profile[-all] */
    int threads;             /* --threads: the session's num_threads (0: all cores) */
    kiln_provider_kind provider; /* --provider cpu|cuda */
    double rtol, atol;       /* verify */
    const char *fault_node;  /* verify: testing hook */
} run_args;

/* The provider named cpu or cuda; returns nonzero (after printing why) for another name. */
int cli_parse_provider(const char *name, kiln_provider_kind *out);
/* Parses the options of run ("run"), bench ("bench") or verify ("verify"); on success the caller
 * releases a with cli_free_run_args (on failure nothing is left to release). */
int cli_parse_run_args(int argc, char **argv, const char *cmd, run_args *a);
void cli_free_run_args(run_args *a);
/* The inputs of run number k: the k-th --input/--shape for each input (the last one when it
 * has fewer), random data where only a shape or nothing is given. */
int cli_make_inputs(kiln_session *s, const run_args *a, int k, uint64_t *rng, kiln_value **vals, const char **names);
/* How many runs the --shape/--input options ask for (the most given for one input). */
int cli_run_count(const run_args *a);
/* name with characters outside [A-Za-z0-9._-] replaced by '_' */
void cli_safe_name(const char *name, char *out, size_t size);
void cli_free_values(kiln_value **v, int n);
/* qsort's comparison of doubles, ascending, NaN last. */
int cli_cmp_double(const void *a, const void *b);

#endif
