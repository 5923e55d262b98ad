/* test_semantics.c - the shared ONNX-semantics helpers (ops/semantics.h, and the window geometry
 * of ops/nn_internal.h that uses them) against expectations worked out by hand from the ONNX
 * spec, Python's slice.indices() and numpy's broadcasting. */
#include <stdint.h>
#include <string.h>

#include "ops/nn_internal.h"
#include "ops/semantics.h"
#include "ops/util.h"
#include "unit.h"

/* ---- nodes with attributes, built on the stack ---- */

static kiln_node node(const char *op_type, int opset, kiln_attr *attrs, int n_attrs)
{
    kiln_node n;
    memset(&n, 0, sizeof n);
    n.op_type = op_type;
    n.domain = "";
    n.opset = opset;
    n.attrs = attrs;
    n.n_attrs = n_attrs;
    return n;
}

static kiln_attr attr_int(const char *name, int64_t v)
{
    kiln_attr a;
    memset(&a, 0, sizeof a);
    a.name = name, a.type = KILN_ATTR_INT, a.i = v;
    return a;
}

static kiln_attr attr_ints(const char *name, const int64_t *v, int n)
{
    kiln_attr a;
    memset(&a, 0, sizeof a);
    a.name = name, a.type = KILN_ATTR_INTS, a.ints = v, a.n = n;
    return a;
}

static kiln_attr attr_string(const char *name, const char *s)
{
    kiln_attr a;
    memset(&a, 0, sizeof a);
    a.name = name, a.type = KILN_ATTR_STRING, a.s = s, a.s_len = strlen(s);
    return a;
}

/* A 1-D int64 tensor viewing v[0..n) (rank 2 [1, n] with two_d). */
static kiln_value ints_tensor(int64_t *v, int n, bool two_d)
{
    kiln_value t;
    memset(&t, 0, sizeof t);
    t.kind = KILN_VALUE_TENSOR, t.dtype = KILN_DTYPE_INT64;
    t.rank = two_d ? 2 : 1;
    if (two_d) t.dims[0] = 1;
    t.dims[t.rank - 1] = n;
    t.numel = n, t.nbytes = (size_t)n * sizeof *v, t.data = n ? v : NULL;
    return t;
}

/* ---- Slice ---- */

static void check_slice(int64_t d, int64_t s, int64_t e, int64_t step, int64_t first, int64_t count)
{
    int64_t f = -99, c = -99;
    kiln_slice_clamp(d, s, e, step, &f, &c);
    CHECK(c == count);
    if (count) CHECK(f == first);
}

/* Expectations are Python's slice(s, e, step).indices(d): its start and len(range(...)). */
static void test_slice(void)
{
    const int64_t MAX = INT64_MAX, MIN = INT64_MIN;
    check_slice(5, 1, 4, 1, 1, 3);
    check_slice(5, -2, MAX, 1, 3, 2);      /* negative start, "to the end" */
    check_slice(5, -100, 100, 1, 0, 5);    /* both far out of range: the whole dim */
    check_slice(5, 100, -100, -1, 4, 5);   /* reversed, clamped to [-1, d-1] */
    check_slice(5, MAX, MIN, -1, 4, 5);    /* x[::-1] as exporters write it */
    check_slice(5, -1, -6, -2, 4, 3);      /* 4, 2, 0 */
    check_slice(5, -5, -6, -1, 0, 1);      /* end below -d clamps to -1: element 0 only */
    check_slice(5, -10, 2, -1, -1, 0);     /* start below -d with a negative step: empty */
    check_slice(5, 3, 1, 1, 3, 0);         /* empty forward */
    check_slice(5, 0, 5, 2, 0, 3);         /* 0, 2, 4 */
    check_slice(5, 0, 5, 3, 0, 2);         /* 0, 3 */
    check_slice(5, 0, 5, MAX, 0, 1);       /* a huge step takes the first element */
    check_slice(5, 4, -100, MIN, 4, 1);    /* INT64_MIN step: one element, no overflow */
    check_slice(7, -3, -1, 1, 4, 2);
    check_slice(7, -1, -3, -1, 6, 2);
    check_slice(7, 2, 2, 1, 2, 0);
    check_slice(7, 6, 0, -4, 6, 2);        /* 6, 2 */
    check_slice(0, 0, 10, 1, 0, 0);        /* empty dim */
    check_slice(0, -1, -10, -1, -1, 0);
}

/* ---- SAME padding and window geometry ---- */

static void check_same_pads(int64_t total, int64_t up_b, int64_t up_e, int64_t low_b, int64_t low_e)
{
    int64_t b, e;
    kiln_same_pads(total, true, &b, &e);
    CHECK(b == up_b && e == up_e);
    kiln_same_pads(total, false, &b, &e);
    CHECK(b == low_b && e == low_e);
}

/* One spatial dim through kiln_nn_geom_resolve: output size and pads. */
static void check_window(int auto_pad, int64_t in, int64_t k, int64_t stride, int64_t dil, const int64_t *pads,
                         bool ceil_mode, int64_t out, int64_t pad_b, int64_t pad_e)
{
    kiln_nn_geom g;
    memset(&g, 0, sizeof g);
    g.nsp = 1, g.auto_pad = auto_pad, g.ceil_mode = ceil_mode;
    g.strides[0] = stride, g.dilations[0] = dil, g.kernel[0] = k;
    if (pads) g.pads[0] = pads[0], g.pads[1] = pads[1];
    int64_t o = -1;
    CHECK(kiln_nn_geom_resolve(&g, &in, &o));
    CHECK(o == out);
    CHECK(g.pads[0] == pad_b && g.pads[1] == pad_e);
}

/* ONNX Conv/Pool: SAME gives out = ceil(in / stride) and total = (out - 1) * stride +
 * (k - 1) * dilation + 1 - in (at least 0), SAME_UPPER putting the odd one at the end;
 * VALID out = ceil((in - (k - 1) * dilation) / stride); explicit pads
 * out = floor((in + pads - (k - 1) * dilation - 1) / stride) + 1. */
static void test_auto_pad(void)
{
    check_same_pads(0, 0, 0, 0, 0);
    check_same_pads(1, 0, 1, 1, 0);
    check_same_pads(4, 2, 2, 2, 2);
    check_same_pads(5, 2, 3, 3, 2);
    /* ConvTranspose: an output_shape smaller than the full result gives a negative total,
     * split with floor division as the spec's formulas in Python do */
    check_same_pads(-3, -2, -1, -1, -2);
    check_same_pads(-1, -1, 0, 0, -1);

    /* in, k, stride, dilation -> out, pads (SAME_UPPER, then SAME_LOWER) */
    check_window(NN_PAD_SAME_UPPER, 7, 3, 2, 1, NULL, false, 4, 1, 1);  /* total 2 */
    check_window(NN_PAD_SAME_UPPER, 8, 3, 2, 1, NULL, false, 4, 0, 1);  /* total 1: odd one at the end */
    check_window(NN_PAD_SAME_LOWER, 8, 3, 2, 1, NULL, false, 4, 1, 0);  /* ... at the beginning */
    check_window(NN_PAD_SAME_UPPER, 7, 3, 1, 2, NULL, false, 7, 2, 2);  /* dilated extent 5, total 4 */
    check_window(NN_PAD_SAME_UPPER, 6, 4, 1, 1, NULL, false, 6, 1, 2);  /* total 3 */
    check_window(NN_PAD_SAME_LOWER, 6, 4, 1, 1, NULL, false, 6, 2, 1);
    check_window(NN_PAD_SAME_UPPER, 9, 2, 2, 3, NULL, false, 5, 1, 2);  /* extent 4, total 3 */
    check_window(NN_PAD_SAME_LOWER, 9, 2, 2, 3, NULL, false, 5, 2, 1);
    check_window(NN_PAD_SAME_UPPER, 5, 2, 3, 3, NULL, false, 2, 1, 1);  /* extent 4, total 2 */
    check_window(NN_PAD_SAME_UPPER, 1, 5, 2, 1, NULL, false, 1, 2, 2);  /* kernel larger than the input */
    check_window(NN_PAD_SAME_LOWER, 10, 1, 4, 1, NULL, false, 3, 0, 0); /* total -1 clamps to 0 */
    /* VALID: no padding */
    check_window(NN_PAD_VALID, 7, 3, 2, 1, NULL, false, 3, 0, 0);
    check_window(NN_PAD_VALID, 9, 2, 2, 3, NULL, false, 3, 0, 0);       /* ceil((9 - 3) / 2) */
    check_window(NN_PAD_VALID, 10, 3, 3, 2, NULL, false, 2, 0, 0);      /* ceil((10 - 4) / 3) */
    /* NOTSET: the pads as given, floor or ceil mode */
    const int64_t p11[2] = {1, 1}, p00[2] = {0, 0}, p01[2] = {0, 1};
    check_window(NN_PAD_NOTSET, 7, 3, 2, 1, p11, false, 4, 1, 1);
    check_window(NN_PAD_NOTSET, 6, 3, 2, 1, p00, false, 2, 0, 0);
    check_window(NN_PAD_NOTSET, 6, 3, 2, 1, p00, true, 3, 0, 0);  /* last window starts at 4 < 6 */
    /* ceil((5 + 1 - 2 - 1) / 2) + 1 = 3: the third window starts at 4, inside the input */
    check_window(NN_PAD_NOTSET, 5, 2, 2, 2, p01, true, 3, 0, 1);
    /* ceil((4 + 1 - 2 - 1) / 2) + 1 = 2, and a window starting at 2 is inside the input */
    check_window(NN_PAD_NOTSET, 4, 2, 2, 2, p01, true, 2, 0, 1);
    /* in 4, k 3, stride 2, end pad 2: ceil((4 + 2 - 3) / 2) + 1 = 3, but the third window would
     * start at 4, in the end padding: dropped (the onnx reference and ONNX Runtime agree) */
    const int64_t p02[2] = {0, 2};
    check_window(NN_PAD_NOTSET, 4, 3, 2, 1, p02, true, 2, 0, 2);

    /* a window that cannot fit is refused */
    kiln_nn_geom g;
    memset(&g, 0, sizeof g);
    g.nsp = 1, g.auto_pad = NN_PAD_VALID, g.strides[0] = g.dilations[0] = 1, g.kernel[0] = 4;
    int64_t in = 3, out;
    CHECK(!kiln_nn_geom_resolve(&g, &in, &out));
}

/* ---- broadcasting ---- */

/* kiln_bcast_strides of in (rank ir) to out (rank orank): every output element must read the
 * element numpy's broadcasting reads (index idx[k] along an input dim of size d > 1, 0 where
 * d == 1 or the dim is missing), and the strides along broadcast dims of the output are 0. */
static void check_bcast(int orank, const int64_t *od, int ir, const int64_t *id)
{
    int64_t st[KILN_MAX_RANK], in_st[KILN_MAX_RANK];
    kiln_bcast_strides(orank, od, ir, id, st);
    kiln_strides(ir, id, in_st);
    int64_t numel = 1;
    for (int k = 0; k < orank; k++) numel *= od[k];
    int64_t idx[KILN_MAX_RANK] = {0};
    for (int64_t i = 0; i < numel; i++) {
        int64_t off = 0, want = 0;
        for (int k = 0; k < orank; k++) {
            off += idx[k] * st[k];
            int j = k - (orank - ir);
            if (j >= 0 && id[j] != 1) want += idx[k] * in_st[j];
        }
        CHECK(off == want);
        kiln_nn_index_next(orank, od, idx);
    }
    for (int k = 0; k < orank; k++) {
        int j = k - (orank - ir);
        if (od[k] != 1 && (j < 0 || id[j] == 1)) CHECK(st[k] == 0);
    }
}

static void test_broadcast(void)
{
    /* numpy: np.broadcast_to(np.zeros((3, 1)), (2, 3, 4)).strides / 8 == (0, 1, 0) */
    const int64_t o1[] = {2, 3, 4}, i1[] = {3, 1};
    int64_t st[KILN_MAX_RANK];
    kiln_bcast_strides(3, o1, 2, i1, st);
    CHECK(st[0] == 0 && st[1] == 1 && st[2] == 0);
    check_bcast(3, o1, 2, i1);
    const int64_t o2[] = {2, 1, 4}, i2[] = {1, 1, 4};
    check_bcast(3, o2, 3, i2);
    const int64_t o3[] = {5};
    check_bcast(1, o3, 0, NULL); /* a scalar */
    const int64_t o4[] = {3, 4}, i4[] = {3, 4};
    kiln_bcast_strides(2, o4, 2, i4, st);
    CHECK(st[0] == 4 && st[1] == 1);
    const int64_t o5[] = {2, 3, 4, 5}, i5[] = {3, 1, 5};
    check_bcast(4, o5, 3, i5);

    CHECK(kiln_bcasts_to(2, i1, 3, o1));
    const int64_t v4[] = {4}, v23[] = {2, 3}, v1234[] = {1, 2, 3, 4};
    CHECK(kiln_bcasts_to(1, v4, 3, o1));
    CHECK(!kiln_bcasts_to(2, v23, 3, o1)); /* right-aligned: 2 vs 3 */
    CHECK(!kiln_bcasts_to(4, v1234, 3, o1));
    CHECK(kiln_bcasts_to(0, NULL, 3, o1));
    CHECK(!kiln_bcasts_to(1, v4, 0, NULL));
}

/* Opset < 7 broadcast: B aligned at `axis` of A with broadcast=1, PRelu's slope on axis 1. */
static void test_legacy_bcast(void)
{
    int pad = -1;
    kiln_attr a1[] = {attr_int("broadcast", 1), attr_int("axis", 1)};
    kiln_node n = node("Add", 6, a1, 2);
    CHECK(kiln_legacy_bcast_pad(&n, 6, 4, 1, &pad) && pad == 2); /* [N, C, H, W] + [C] */
    CHECK(kiln_legacy_bcast_pad(&n, 6, 4, 2, &pad) && pad == 1); /* + [C, H] */
    CHECK(kiln_legacy_bcast_pad(&n, 7, 4, 1, &pad) && pad == 0); /* numpy rules from opset 7 */
    kiln_attr a2[] = {attr_int("broadcast", 1), attr_int("axis", -3)};
    n = node("Mul", 6, a2, 2);
    CHECK(kiln_legacy_bcast_pad(&n, 6, 4, 1, &pad) && pad == 2);
    kiln_attr a3[] = {attr_int("broadcast", 1), attr_int("axis", 3)};
    n = node("Sub", 6, a3, 2);
    CHECK(!kiln_legacy_bcast_pad(&n, 6, 4, 2, &pad)); /* axis + rank_b > rank_a */
    kiln_attr a4[] = {attr_int("broadcast", 1), attr_int("axis", -5)};
    n = node("Sub", 6, a4, 2);
    CHECK(!kiln_legacy_bcast_pad(&n, 6, 4, 1, &pad));
    kiln_attr a5[] = {attr_int("broadcast", 1)};
    n = node("Add", 6, a5, 1);
    CHECK(kiln_legacy_bcast_pad(&n, 6, 4, 1, &pad) && pad == 0); /* no axis: trailing */
    n = node("PRelu", 6, NULL, 0);
    CHECK(kiln_legacy_bcast_pad(&n, 6, 4, 1, &pad) && pad == 2); /* slope along channels */
    CHECK(kiln_legacy_bcast_pad(&n, 6, 4, 2, &pad) && pad == 0);
    CHECK(kiln_legacy_bcast_pad(&n, 9, 4, 1, &pad) && pad == 0);

    /* [C] padded by 2 reads as [C, 1, 1] against [N, C, H, W] */
    const int64_t c[] = {3}, y[] = {2, 3, 4, 5};
    int64_t dims[KILN_MAX_RANK], st[KILN_MAX_RANK];
    int r = kiln_legacy_bcast_dims(1, c, 2, dims);
    CHECK(r == 3 && dims[0] == 3 && dims[1] == 1 && dims[2] == 1);
    kiln_bcast_strides(4, y, r, dims, st);
    CHECK(st[0] == 0 && st[1] == 1 && st[2] == 0 && st[3] == 0);
    CHECK(kiln_legacy_bcast_dims(0, NULL, 0, dims) == 0);
}

/* ---- reductions ---- */

static bool mask_is(const bool *m, int rank, unsigned bits)
{
    for (int k = 0; k < rank; k++)
        if (m[k] != ((bits >> k) & 1)) return false;
    return true;
}

static void test_reduce_axes(void)
{
    bool m[KILN_MAX_RANK];
    char msg[128];
    CHECK(!kiln_reduce_axes_from_input(&(kiln_node){.op_type = "ReduceSum"}, 12));
    CHECK(kiln_reduce_axes_from_input(&(kiln_node){.op_type = "ReduceSum"}, 13));
    CHECK(!kiln_reduce_axes_from_input(&(kiln_node){.op_type = "ReduceMean"}, 17));
    CHECK(kiln_reduce_axes_from_input(&(kiln_node){.op_type = "ReduceMean"}, 18));
    CHECK(kiln_reduce_op_of(&(kiln_node){.op_type = "ReduceLogSumExp"}) == KILN_REDUCE_LOGSUMEXP);
    CHECK(kiln_reduce_op_of(&(kiln_node){.op_type = "ReduceSumSquare"}) == KILN_REDUCE_SUMSQ);
    CHECK(kiln_reduce_op_of(&(kiln_node){.op_type = "ReduceL1"}) == KILN_REDUCE_L1);

    /* attribute axes (ReduceMean before 18): negative axes count from the end */
    const int64_t ax[] = {-1, 0};
    kiln_attr a1[] = {attr_ints("axes", ax, 2)};
    kiln_node n = node("ReduceMean", 13, a1, 1);
    CHECK(kiln_reduce_axes(&n, 13, NULL, 3, m, msg, sizeof msg) && mask_is(m, 3, 0x5));
    n = node("ReduceMean", 13, NULL, 0);
    CHECK(kiln_reduce_axes(&n, 13, NULL, 3, m, msg, sizeof msg) && mask_is(m, 3, 0x7)); /* none: all */
    /* noop_with_empty_axes means nothing where the axes are an attribute */
    kiln_attr a2[] = {attr_int("noop_with_empty_axes", 1)};
    n = node("ReduceMax", 13, a2, 1);
    CHECK(kiln_reduce_axes(&n, 13, NULL, 3, m, msg, sizeof msg) && mask_is(m, 3, 0x7));
    /* ... and keeps every axis where they come from input 1 and it is absent or empty */
    CHECK(kiln_reduce_axes(&n, 18, NULL, 3, m, msg, sizeof msg) && mask_is(m, 3, 0x0));
    kiln_value empty = ints_tensor(NULL, 0, false);
    CHECK(kiln_reduce_axes(&n, 18, &empty, 3, m, msg, sizeof msg) && mask_is(m, 3, 0x0));
    n = node("ReduceSum", 13, NULL, 0);
    CHECK(kiln_reduce_axes(&n, 13, &empty, 3, m, msg, sizeof msg) && mask_is(m, 3, 0x7));
    CHECK(kiln_reduce_axes(&n, 13, NULL, 0, m, msg, sizeof msg)); /* a scalar input */

    /* input axes (ReduceSum from 13): the attribute is not read any more */
    int64_t in1[] = {1}, in2[] = {-3, 2}, bad[] = {3}, rep[] = {0, -3};
    kiln_node s = node("ReduceSum", 13, a1, 1);
    kiln_value t = ints_tensor(in1, 1, false);
    CHECK(kiln_reduce_axes(&s, 13, &t, 3, m, msg, sizeof msg) && mask_is(m, 3, 0x2));
    t = ints_tensor(in2, 2, false);
    CHECK(kiln_reduce_axes(&s, 13, &t, 3, m, msg, sizeof msg) && mask_is(m, 3, 0x5));
    /* ... but is before */
    CHECK(kiln_reduce_axes(&s, 11, &t, 3, m, msg, sizeof msg) && mask_is(m, 3, 0x5));

    /* invalid axes */
    t = ints_tensor(bad, 1, false);
    CHECK(!kiln_reduce_axes(&s, 13, &t, 3, m, msg, sizeof msg) && strstr(msg, "out of range"));
    t = ints_tensor(rep, 2, false);
    CHECK(!kiln_reduce_axes(&s, 13, &t, 3, m, msg, sizeof msg) && strstr(msg, "repeated"));
    CHECK(!kiln_reduce_axes(&s, 13, &t, 3, m, NULL, 0)); /* no message wanted */
    t = ints_tensor(in1, 1, true);
    CHECK(!kiln_reduce_axes(&s, 13, &t, 3, m, msg, sizeof msg)); /* 2-D axes */
    t = ints_tensor(in2, 2, false);
    CHECK(!kiln_reduce_axes(&s, 13, &t, 1, m, msg, sizeof msg)); /* more axes than dims */
    t.dtype = KILN_DTYPE_FLOAT64;
    CHECK(!kiln_reduce_axes(&s, 13, &t, 3, m, msg, sizeof msg));
    const int64_t attr_bad[] = {0, 0};
    kiln_attr a3[] = {attr_ints("axes", attr_bad, 2)};
    n = node("ReduceProd", 11, a3, 1);
    CHECK(!kiln_reduce_axes(&n, 11, NULL, 2, m, msg, sizeof msg));
}

static void test_scatter_reduction(void)
{
    kiln_node n = node("ScatterElements", 18, NULL, 0);
    CHECK(kiln_scatter_reduction_of(&n) == KILN_SCATTER_NONE);
    const char *names[] = {"none", "add", "mul", "max", "min"};
    for (int k = 0; k < 5; k++) {
        kiln_attr a[] = {attr_string("reduction", names[k])};
        n = node("ScatterND", 18, a, 1);
        CHECK(kiln_scatter_reduction_of(&n) == k);
    }
    kiln_attr a[] = {attr_string("reduction", "sum")};
    n = node("ScatterND", 18, a, 1);
    CHECK(kiln_scatter_reduction_of(&n) == -1);
    CHECK(KILN_SCATTER_ADD == 1 && KILN_SCATTER_MIN == 4);
}

int main(void)
{
    test_slice();
    test_auto_pad();
    test_broadcast();
    test_legacy_bcast();
    test_reduce_axes();
    test_scatter_reduction();
    return unit_report("test_semantics");
}
