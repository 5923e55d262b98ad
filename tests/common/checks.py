"""checks.py - the pass/fail counting the Python tests share: check() records one result and
prints a line for a failure; summary() prints the closing `N passed, N failed` line; close()
compares a run's outputs and run_feeds() a session against the reference feed by feed;
skip_without() ends a test that has no session on its provider."""
import os
import sys

import numpy as np

# the ctypes binding, for every test that imports this module
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

_counts = {"passed": 0, "failed": 0}


def check(name, cond, detail=""):
    if cond:
        _counts["passed"] += 1
    else:
        _counts["failed"] += 1
        print(f"FAIL {name}: {detail}")


def summary(prefix=""):
    """Prints the closing line; returns the exit status (1 when anything failed)."""
    print(f"{prefix}{_counts['passed']} passed, {_counts['failed']} failed")
    return 1 if _counts["failed"] else 0


def close(label, got, want, rtol, atol):
    """One check over a run's outputs (lists) against the reference's: same count, dtypes and
    shapes; non-float outputs equal; float ones within atol + rtol * max(1, max finite |want|),
    NaN matching NaN and an infinity the same infinity."""
    if len(got) != len(want):
        return check(label, False, f"{len(got)} outputs vs {len(want)}")
    for k, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            return check(label, False, f"output {k}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}")
        if not g.size:
            continue
        if not np.issubdtype(w.dtype, np.floating):
            if not np.array_equal(g, w):
                return check(label, False, f"output {k}: {int((g != w).sum())} elements differ")
            continue
        g64, w64 = np.atleast_1d(g.astype(np.float64)), np.atleast_1d(w.astype(np.float64))
        fin = np.isfinite(w64)
        mag = max(1.0, float(np.abs(w64[fin]).max())) if fin.any() else 1.0
        with np.errstate(invalid="ignore"):
            d = np.abs(g64 - w64)
        same = (g64 == w64) | (np.isnan(g64) & np.isnan(w64))  # infinities of one sign, NaNs
        d[same] = 0
        d[np.isnan(d)] = np.inf
        if d.max() > atol + rtol * mag:
            i = np.unravel_index(d.argmax(), d.shape)
            return check(label, False, f"output {k}: max diff {d.max():.3g} at {i}: {g64[i]!r} vs {w64[i]!r} "
                                       f"(allowed {atol + rtol * mag:.3g})")
    return check(label, True)


def run_feeds(name, session, reference, feeds_list, rtol, atol, provider, ort_session=None):
    """Each feed on session (a kiln.Session on `provider`) and on reference: a feed the reference
    refuses must be refused by session too; otherwise session's outputs within rtol / atol of the
    reference's (close), and within twice those of ort_session's (an onnxruntime session, or None)
    where ORT runs the feed."""
    import kiln
    for feeds in feeds_list:
        shapes = " ".join(f"{k}={v.shape}" for k, v in feeds.items())
        label = f"{name} {shapes}"
        try:
            want = reference.run(feeds)
        except kiln.KilnError as e:
            try:
                session.run(feeds)
                check(f"{label} refused like the reference", False, f"reference: {e}; {provider} ran")
            except kiln.KilnError:
                check(f"{label} refused like the reference", True)
            continue
        try:
            got = session.run(feeds)
        except kiln.KilnError as e:
            check(label, False, f"{provider} session failed: {e}")
            continue
        close(f"{label} vs reference", got, want, rtol, atol)
        if ort_session is not None:
            try:
                ow = ort_session.run(None, feeds)
            except Exception:  # noqa: BLE001 - ORT refuses this feed
                continue
            close(f"{label} vs ORT", got, ow, rtol * 2, atol * 2)


def skip_without(provider):
    """True, after printing `SKIP: no <provider> session (why)`, when a one-node session cannot be
    made on provider (no GPU or no driver): that line is then the test's whole output."""
    import kiln
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("Relu", ["X"], ["Y"])], "probe",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    blob = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    try:
        kiln.Session(blob, provider=provider)
    except (kiln.KilnError, OSError) as e:
        print(f"SKIP: no {provider} session ({e})")
        return True
    return False
