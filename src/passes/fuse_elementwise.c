/* fuse_elementwise.c - connected element-wise nodes become one kiln.FusedElementwise node
 * (src/ops/fused.h): the GPU provider runs the group as one kernel, one pass over memory instead
 * of one per node (a bias Add and Gelu's five nodes, a mask's Cast -> Sub -> Mul -> Add, a
 * layer scale and its residual Add).
 *
 * A group grows from its last node (its root, whose output leaves the group) towards the
 * inputs: a producer joins when it is a supported element-wise node of the same graph whose
 * output every reader of which is already in the group, so no value but the root's is needed
 * outside and the rewrite cannot form a cycle. Supported: the float unary ops and Add, Sub,
 * Mul, Div, Pow, Max, Min (two inputs), PRelu on float32/float16/bfloat16; Cast to those types
 * from float, integer or bool; Clip with constant bounds; Where with a bool condition. Scalar
 * constants become immediates of the program. Groups of one node stay as they are. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/arena.h"
#include "core/dtype.h"
#include "ops/eval.h"
#include "ops/fused.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

static bool float_type(const kiln_ir_value *v)
{
    kiln_dtype dt = v ? v->type.dtype : KILN_DTYPE_UNDEFINED;
    return v && v->type.kind == KILN_VALUE_TENSOR && v->type.rank >= 0 && v->type.rank <= KILN_EWP_MAX_RANK &&
           (dt == KILN_DTYPE_FLOAT32 || dt == KILN_DTYPE_FLOAT16 || dt == KILN_DTYPE_BFLOAT16);
}

/* A tensor a Cast in a group may read, or Where take as its condition. */
static bool castable(const kiln_ir_value *v)
{
    if (!v || v->type.kind != KILN_VALUE_TENSOR || v->type.rank < 0 || v->type.rank > KILN_EWP_MAX_RANK) return false;
    switch (v->type.dtype) {
    case KILN_DTYPE_FLOAT32: case KILN_DTYPE_FLOAT16: case KILN_DTYPE_BFLOAT16: case KILN_DTYPE_INT8:
    case KILN_DTYPE_UINT8: case KILN_DTYPE_INT16: case KILN_DTYPE_INT32: case KILN_DTYPE_INT64: case KILN_DTYPE_BOOL:
        return true;
    default: return false;
    }
}

/* A scalar constant (one element) usable as an immediate: float or integer, rank at most r. */
static const kiln_value *immediate(const kiln_ir_value *v, int r)
{
    const kiln_value *t = kiln_ir_constant(v);
    if (!t || v->producer || t->kind != KILN_VALUE_TENSOR || t->numel != 1 || t->rank > r) return NULL;
    kiln_dtype dt = t->dtype;
    return kiln_dtype_is_float(dt) && dt != KILN_DTYPE_FLOAT64 ? t : kiln_dtype_is_int(dt) ? t : NULL;
}

/* Clip's bound i (1: min, 2: max) into *v: absent keeps *v; false when it is not a constant scalar. */
static bool clip_bound(const kiln_node *n, int i, double *v)
{
    if (i >= n->n_in || !n->in[i]) return true;
    const kiln_value *t = kiln_ir_constant(n->in[i]);
    if (!t || t->kind != KILN_VALUE_TENSOR || t->numel != 1 || !kiln_dtype_is_float(t->dtype)) return false;
    *v = kiln_load_f64(t->dtype, t->data, 0);
    return true;
}

/* Whether n can join a group; its instruction's kind, code and params into *ins. */
static bool supported(const kiln_graph *g, const kiln_node *n, kiln_ewp_ins *ins)
{
    if (n->graph != g || *n->domain || n->n_out != 1 || !n->out[0] || !float_type(n->out[0]) || !n->op)
        return false;
    memset(ins, 0, sizeof *ins);
    kiln_dtype dt = n->out[0]->type.dtype;
    const char *op = n->op_type;
    if (!strcmp(op, "Cast")) {
        ins->kind = KILN_EWP_CAST;
        return n->n_in == 1 && castable(n->in[0]);
    }
    if (!strcmp(op, "Clip")) {
        ins->kind = KILN_EWP_CLIP;
        ins->p[0] = -INFINITY, ins->p[1] = INFINITY;
        if (n->opset < 11) {
            ins->p[0] = kiln_attr_float(n, "min", -3.402823e+38f);
            ins->p[1] = kiln_attr_float(n, "max", 3.402823e+38f);
        } else if (!clip_bound(n, 1, &ins->p[0]) || !clip_bound(n, 2, &ins->p[1])) {
            return false;
        }
        return n->n_in >= 1 && float_type(n->in[0]) && n->in[0]->type.dtype == dt;
    }
    if (!strcmp(op, "Where")) {
        ins->kind = KILN_EWP_WHERE;
        return n->n_in == 3 && n->in[0] && n->in[0]->type.dtype == KILN_DTYPE_BOOL && castable(n->in[0]) &&
               float_type(n->in[1]) && float_type(n->in[2]) && n->in[1]->type.dtype == dt && n->in[2]->type.dtype == dt;
    }
    if (n->n_in == 1 && (ins->code = kiln_ops_unary_code(n, ins->p)) >= 0) {
        ins->kind = KILN_EWP_UNARY;
        return float_type(n->in[0]) && n->in[0]->type.dtype == dt;
    }
    if (n->n_in == 2 && strcmp(op, "Mod") && (ins->code = kiln_ops_binary_code(n)) >= 0) {
        ins->kind = KILN_EWP_BINARY;
        /* Pow's exponent may be another float type (or an integer immediate) */
        bool a_ok = float_type(n->in[0]) && n->in[0]->type.dtype == dt;
        bool b_ok = (float_type(n->in[1]) && (n->in[1]->type.dtype == dt || !strcmp(op, "Pow"))) ||
                    immediate(n->in[1], n->out[0]->type.rank);
        return (a_ok || immediate(n->in[0], n->out[0]->type.rank)) && b_ok;
    }
    return false;
}

typedef struct group {
    int members[KILN_EWP_MAX_INS]; /* node indices, ascending (graph order) */
    int n;
    kiln_ewp_ins ins[KILN_EWP_MAX_INS]; /* per member, from supported() */
} group;

/* Whether every reader of v is a node of group gid (and v is no graph output, no capture). */
static bool read_only_by(const kiln_ir_value *v, const int *gid, int id)
{
    if (v->is_output || v->n_captured || !v->n_uses) return false;
    for (int u = 0; u < v->n_uses; u++)
        if (gid[v->uses[u].node->index] != id) return false;
    return true;
}

/* Rewrites group gr (its root the last member) into one kiln.FusedElementwise at the root's
 * place; false (nothing changed) when it does not fit a program. */
static kiln_status rewrite(kiln_graph *g, const group *gr, const int *gid, int id, bool *done, kiln_err *err)
{
    *done = false;
    kiln_node *root = g->nodes[gr->members[gr->n - 1]];
    int out_rank = root->out[0]->type.rank;
    /* pass 1: the program's inputs (values from outside that are not immediates) */
    kiln_ir_value *inputs[KILN_EWP_MAX_IN];
    int n_in = 0, n_imm = 0;
    for (int m = 0; m < gr->n; m++) {
        const kiln_node *n = g->nodes[gr->members[m]];
        int operands = gr->ins[m].kind == KILN_EWP_CLIP ? 1 : n->n_in;
        for (int i = 0; i < operands; i++) {
            kiln_ir_value *v = n->in[i];
            if (!v) return KILN_OK;
            if (v->producer && v->producer->graph == g && gid[v->producer->index] == id) continue;
            if (gr->ins[m].kind != KILN_EWP_CAST && !(gr->ins[m].kind == KILN_EWP_WHERE && i == 0) &&
                immediate(v, out_rank)) {
                n_imm++;
                continue;
            }
            bool seen = false;
            for (int j = 0; j < n_in && !seen; j++) seen = inputs[j] == v;
            if (seen) continue;
            if (n_in == KILN_EWP_MAX_IN) return KILN_OK;
            inputs[n_in++] = v;
        }
    }
    int n_ins = gr->n + n_imm;
    if (n_ins > KILN_EWP_MAX_INS || !n_in) return KILN_OK;
    /* the inputs must give the root's rank (an immediate of higher rank was refused above) */
    int max_rank = 0;
    for (int j = 0; j < n_in; j++) max_rank = inputs[j]->type.rank > max_rank ? inputs[j]->type.rank : max_rank;
    if (max_rank != out_rank) return KILN_OK;

    /* pass 2: the program */
    const char **ops = kiln_arena_calloc(&g->model->arena, (size_t)n_ins, sizeof *ops);
    size_t *op_lens = kiln_arena_calloc(&g->model->arena, (size_t)n_ins, sizeof *op_lens);
    int64_t *args = kiln_arena_calloc(&g->model->arena, (size_t)n_ins * 3, sizeof *args);
    float *params = kiln_arena_calloc(&g->model->arena, (size_t)n_ins * 4, sizeof *params);
    int64_t *dtypes = kiln_arena_calloc(&g->model->arena, (size_t)(n_in + n_ins), sizeof *dtypes);
    kiln_attr *at = kiln_passes_new_attrs(g, 4);
    if (!ops || !op_lens || !args || !params || !dtypes || !at) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    for (int j = 0; j < n_in; j++) dtypes[j] = inputs[j]->type.dtype;
    const kiln_ir_value *result_of[KILN_EWP_MAX_INS]; /* register n_in + k holds member value result_of[k] */
    int k = 0;
    for (int m = 0; m < gr->n; m++) {
        const kiln_node *n = g->nodes[gr->members[m]];
        const kiln_ewp_ins *in = &gr->ins[m];
        int operands = in->kind == KILN_EWP_CLIP ? 1 : n->n_in, reg[3] = {-1, -1, -1};
        for (int i = 0; i < operands; i++) {
            const kiln_ir_value *v = n->in[i];
            for (int j = 0; j < n_in && reg[i] < 0; j++)
                if (inputs[j] == v) reg[i] = j;
            for (int j = 0; j < k && reg[i] < 0; j++)
                if (result_of[j] == v) reg[i] = n_in + j;
            if (reg[i] >= 0) continue;
            /* an immediate: a Constant instruction of the constant's type (float32 for integers) */
            const kiln_value *t = kiln_ir_constant(v);
            ops[k] = "Constant";
            args[3 * k] = args[3 * k + 1] = args[3 * k + 2] = -1;
            params[4 * k] = (float)kiln_load_f64(t->dtype, t->data, 0);
            dtypes[n_in + k] = kiln_dtype_is_float(t->dtype) ? t->dtype : KILN_DTYPE_FLOAT32;
            result_of[k] = NULL;
            reg[i] = n_in + k++;
        }
        ops[k] = n->op_type;
        for (int i = 0; i < 3; i++) args[3 * k + i] = reg[i];
        for (int i = 0; i < 4; i++) params[4 * k + i] = (float)in->p[i];
        dtypes[n_in + k] = n->out[0]->type.dtype;
        result_of[k++] = n->out[0];
    }
    for (int j = 0; j < n_ins; j++) op_lens[j] = strlen(ops[j]);
    at[0] = (kiln_attr){.name = "ops", .type = KILN_ATTR_STRINGS, .n = n_ins, .strings = ops, .string_lens = op_lens};
    at[1] = (kiln_attr){.name = "args", .type = KILN_ATTR_INTS, .n = 3 * n_ins, .ints = args};
    at[2] = (kiln_attr){.name = "params", .type = KILN_ATTR_FLOATS, .n = 4 * n_ins, .floats = params};
    at[3] = (kiln_attr){.name = "dtypes", .type = KILN_ATTR_INTS, .n = n_in + n_ins, .ints = dtypes};

    /* the root becomes the fused node; the other members, now unread, leave the graph */
    KILN_TRY(kiln_node_set_inputs(root, n_in, inputs, err));
    root->domain = "kiln";
    root->op_type = "FusedElementwise";
    root->attrs = at;
    root->n_attrs = 4;
    root->opset = 1;
    KILN_TRY(kiln_node_bind(root, err));
    if (!root->op) return kiln_errf(err, KILN_ERR_RUNTIME, "internal: no kiln.FusedElementwise");
    for (int m = 0; m < gr->n - 1; m++) {
        kiln_node_unlink(g->nodes[gr->members[m]]);
        g->nodes[gr->members[m]] = NULL;
    }
    *done = true;
    return KILN_OK;
}

kiln_status kiln_pass_fuse_elementwise(kiln_graph *g, int *fused, kiln_err *err)
{
    *fused = 0;
    int n_nodes = g->n_nodes;
    int *gid = malloc(((size_t)n_nodes + 1) * sizeof *gid);
    group *gr = malloc(sizeof *gr);
    if (!gid || !gr) {
        free(gid);
        free(gr);
        return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    }
    for (int k = 0; k < n_nodes; k++) gid[k] = -1;
    kiln_status st = KILN_OK;
    for (int r = n_nodes - 1; r >= 0 && !st; r--) {
        kiln_node *root = g->nodes[r];
        kiln_ewp_ins ins;
        if (!root || gid[r] != -1 || !supported(g, root, &ins)) continue;
        int id = r;
        gid[r] = id;
        gr->n = 1;
        gr->members[0] = r;
        gr->ins[0] = ins;
        for (bool grew = true; grew;) {
            grew = false;
            for (int m = 0; m < gr->n; m++) {
                const kiln_node *n = g->nodes[gr->members[m]];
                for (int i = 0; i < n->n_in; i++) {
                    const kiln_ir_value *v = n->in[i];
                    kiln_node *p = v ? v->producer : NULL;
                    if (!p || p->graph != g || gid[p->index] != -1 || gr->n == KILN_EWP_MAX_INS ||
                        !read_only_by(v, gid, id) || !supported(g, p, &ins))
                        continue;
                    gid[p->index] = id;
                    gr->members[gr->n] = p->index;
                    gr->ins[gr->n++] = ins;
                    grew = true;
                }
            }
        }
        if (gr->n < 2) continue;
        /* graph order: producers before readers */
        for (int a = 1; a < gr->n; a++)
            for (int b = a; b > 0 && gr->members[b - 1] > gr->members[b]; b--) {
                int t = gr->members[b];
                gr->members[b] = gr->members[b - 1];
                gr->members[b - 1] = t;
                kiln_ewp_ins ti = gr->ins[b];
                gr->ins[b] = gr->ins[b - 1];
                gr->ins[b - 1] = ti;
            }
        bool done;
        st = rewrite(g, gr, gid, id, &done, err);
        if (!st && done) (*fused)++;
    }
    free(gid);
    free(gr);
    kiln_graph_compact(g);
    return st;
}
