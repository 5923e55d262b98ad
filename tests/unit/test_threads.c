/* test_threads.c - one session run from 8 threads at once with random shapes while 200 other
 * sessions are created, run and destroyed in random interleavings; every result must equal a
 * single-threaded run. Run under ThreadSanitizer by scripts/test.sh. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"
#include "modelgen.h"
#include "unit.h"

enum { FLOAT = 1, THREADS = 8, CALLS_PER_THREAD = 150, SESSIONS = 200 };

/* Y = Relu(X @ W + X @ W) over X [N, 4] and W [4, M]: symbolic N and M */
static unsigned char *model_bytes(size_t *len)
{
    mg_model *m = mg_new(13);
    mg_input(m, "X", FLOAT, 2, (int64_t[]){-1, 4}, (const char *[]){"N", NULL});
    mg_input(m, "W", FLOAT, 2, (int64_t[]){4, -1}, (const char *[]){NULL, "M"});
    mg_node(m, "MatMul", "", (const char *[]){"X", "W", NULL}, (const char *[]){"P", NULL});
    mg_node(m, "Add", "", (const char *[]){"P", "P", NULL}, (const char *[]){"S", NULL});
    mg_node(m, "Relu", "", (const char *[]){"S", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    unsigned char *buf = mg_serialize(m, len);
    mg_free(m);
    return buf;
}

static unsigned char *g_model;
static size_t g_len;
static kiln_session *g_shared;

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Runs the model for shape (n, m) with deterministic data; 0 on success and result in y. */
static int run_once(kiln_session *s, int n, int m, float *y)
{
    float x[64 * 4], w[4 * 64];
    for (int i = 0; i < n * 4; i++) x[i] = (float)((i * 7 + n) % 11) - 5.0f;
    for (int i = 0; i < 4 * m; i++) w[i] = (float)((i * 3 + m) % 5) - 2.0f;
    kiln_value *in[2], *out = NULL;
    kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 2, (int64_t[]){n, 4}, x, (size_t)n * 4 * sizeof(float), &in[0]);
    kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 2, (int64_t[]){4, m}, w, (size_t)m * 4 * sizeof(float), &in[1]);
    const char *names[] = {"X", "W"}, *outs[] = {"Y"};
    int rc = kiln_session_run(s, 2, names, (const kiln_value *const *)in, 1, outs, &out) != KILN_OK;
    if (!rc) memcpy(y, kiln_value_data(out), (size_t)n * m * sizeof(float));
    kiln_value_free(out);
    kiln_value_free(in[0]);
    kiln_value_free(in[1]);
    return rc;
}

/* expected results, computed single-threaded before the threads start: [n][m] -> values */
static float g_expected[17][17][16 * 16];

static void *worker(void *arg)
{
    uint64_t seed = 0x9e3779b97f4a7c15ull * (uintptr_t)arg + 1;
    int *bad = calloc(1, sizeof *bad);
    for (int i = 0; i < CALLS_PER_THREAD; i++) {
        int n = 1 + (int)(rnd(&seed) % 16), m = 1 + (int)(rnd(&seed) % 16);
        float y[16 * 16];
        if (run_once(g_shared, n, m, y) || memcmp(y, g_expected[n][m], (size_t)n * m * sizeof(float))) (*bad)++;
    }
    return bad;
}

int main(void)
{
    g_model = model_bytes(&g_len);
    CHECK(kiln_session_create_from_memory(g_model, g_len, NULL, NULL, &g_shared) == KILN_OK);
    for (int n = 1; n <= 16; n++)
        for (int m = 1; m <= 16; m++) CHECK(run_once(g_shared, n, m, g_expected[n][m]) == 0);
    pthread_t th[THREADS];
    for (uintptr_t t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void *)t);
    /* meanwhile: sessions created, run and destroyed in a random interleaving */
    kiln_session *live[8] = {0};
    uint64_t seed = 12345;
    for (int i = 0; i < SESSIONS; i++) {
        int slot = (int)(rnd(&seed) % 8);
        kiln_session_free(live[slot]);
        live[slot] = NULL;
        CHECK(kiln_session_create_from_memory(g_model, g_len, NULL, NULL, &live[slot]) == KILN_OK);
        int other = (int)(rnd(&seed) % 8);
        if (live[other]) {
            float y[16 * 16];
            int n = 1 + i % 16, m = 1 + (i / 16) % 16;
            CHECK(run_once(live[other], n, m, y) == 0 && !memcmp(y, g_expected[n][m], (size_t)n * m * sizeof(float)));
        }
    }
    for (int i = 0; i < 8; i++) kiln_session_free(live[i]);
    int bad = 0;
    for (int t = 0; t < THREADS; t++) {
        void *r;
        pthread_join(th[t], &r);
        bad += *(int *)r;
        free(r);
    }
    CHECK(bad == 0);
    kiln_session_stats st;
    kiln_session_stats_get(g_shared, &st);
    CHECK(st.compilations == 1 && st.runs == 16 * 16 + THREADS * CALLS_PER_THREAD);
    kiln_session_free(g_shared);
    free(g_model);
    return unit_report("test_threads");
}
