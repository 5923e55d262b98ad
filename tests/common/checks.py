"""checks.py - the pass/fail counting the Python tests share: check() records one result and
prints a line for a failure; summary() prints the closing `N passed, N failed` line."""
import os
import sys

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
