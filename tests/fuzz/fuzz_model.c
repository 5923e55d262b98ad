/* fuzz_model.c - libFuzzer target: hostile model bytes through loading, inference, planning and
 * one run with small generated inputs; nothing may crash, whatever the bytes. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"

enum { MAX_INPUTS = 16, MAX_ELEMS = 4096, SYMBOLIC_DIM = 2 };

/* A small tensor for graph input i of s (zeros, or "" strings), or NULL if kiln cannot be fed
 * this kind of input here (sequences, optionals, unknown dtypes, too many elements). */
static kiln_value *make_input(const kiln_session *s, int i)
{
    kiln_io_info info;
    if (kiln_session_input_info(s, i, &info) != KILN_OK || info.kind != KILN_VALUE_TENSOR)
        return NULL;
    kiln_dtype dt = info.dtype == KILN_DTYPE_UNDEFINED ? KILN_DTYPE_FLOAT32 : info.dtype;
    if (kiln_dtype_size(dt) == 0)
        return NULL;
    int rank = info.rank < 0 ? 1 : info.rank;
    if (rank > KILN_MAX_RANK)
        return NULL;
    int64_t dims[KILN_MAX_RANK];
    int64_t numel = 1;
    for (int d = 0; d < rank; d++) {
        dims[d] = info.rank < 0 || info.dims[d] < 0 ? SYMBOLIC_DIM : info.dims[d];
        if (dims[d] > MAX_ELEMS)
            return NULL;
        numel *= dims[d];
        if (numel > MAX_ELEMS)
            return NULL;
    }
    kiln_value *v = NULL;
    size_t nbytes = (size_t)numel * kiln_dtype_size(dt);
    if (dt == KILN_DTYPE_STRING) {
        const char *strs[MAX_ELEMS];
        for (int64_t k = 0; k < numel; k++)
            strs[k] = "";
        kiln_value_create_tensor(dt, rank, dims, strs, nbytes, &v);
    } else {
        kiln_value_create_tensor(dt, rank, dims, NULL, nbytes, &v);
    }
    return v;
}

static void run_once(kiln_session *s)
{
    int n_in = kiln_session_input_count(s), n_out = kiln_session_output_count(s);
    if (n_in < 0 || n_in > MAX_INPUTS || n_out < 0 || n_out > MAX_INPUTS)
        return;
    const char *in_names[MAX_INPUTS], *out_names[MAX_INPUTS];
    kiln_value *inputs[MAX_INPUTS] = {0}, *outputs[MAX_INPUTS] = {0};
    int k = 0;
    for (int i = 0; i < n_in; i++) {
        kiln_io_info info;
        kiln_value *v = make_input(s, i);
        if (!v || kiln_session_input_info(s, i, &info) != KILN_OK) {
            kiln_value_free(v);
            continue;  /* left out: the run reports the missing input unless an initializer has it */
        }
        in_names[k] = info.name;
        inputs[k++] = v;
    }
    for (int j = 0; j < n_out; j++) {
        kiln_io_info info;
        if (kiln_session_output_info(s, j, &info) != KILN_OK)
            return;
        out_names[j] = info.name;
    }
    kiln_session_run(s, k, in_names, (const kiln_value *const *)inputs, n_out, out_names, outputs);
    /* and once more, to exercise the cached plan */
    for (int j = 0; j < n_out; j++) {
        kiln_value_free(outputs[j]);
        outputs[j] = NULL;
    }
    kiln_session_run(s, k, in_names, (const kiln_value *const *)inputs, n_out, out_names, outputs);
    for (int j = 0; j < n_out; j++)
        kiln_value_free(outputs[j]);
    for (int i = 0; i < k; i++)
        kiln_value_free(inputs[i]);
}

/* Touches every accessor a tool would use, so that what loading left behind is read too. */
static void inspect(const kiln_session *s)
{
    kiln_io_info info;
    for (int i = 0; i < kiln_session_input_count(s); i++)
        kiln_session_input_info(s, i, &info);
    for (int i = 0; i < kiln_session_output_count(s); i++)
        kiln_session_output_info(s, i, &info);
    for (int i = 0; i < kiln_session_node_count(s); i++) {
        const char *name, *domain, *op;
        bool ok;
        kiln_session_node(s, i, &name, &domain, &op, &ok);
    }
    for (int i = 0; i < kiln_session_opset_count(s); i++) {
        const char *domain;
        int64_t version;
        kiln_session_opset(s, i, &domain, &version);
    }
    (void)kiln_session_initializer_bytes(s);
}

/* A model may ask for more memory than exists: kiln must then report KILN_ERR_NOMEM, which it
 * can only do if AddressSanitizer's allocator returns NULL instead of stopping the process. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1";
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int pass = 0; pass < 2; pass++) {
        kiln_session_options opt = kiln_session_options_default();
        opt.allow_unsupported = pass == 1;
        kiln_session *s = NULL;
        kiln_status st = kiln_session_create_from_memory(data, size, NULL, &opt, &s);
        (void)kiln_last_error(s);
        if (st == KILN_OK) {
            inspect(s);
            run_once(s);
            (void)kiln_last_error(s);
        }
        kiln_session_free(s);
        if (st == KILN_OK && pass == 0)
            break;  /* allow_unsupported would only repeat the same work */
    }
    return 0;
}
