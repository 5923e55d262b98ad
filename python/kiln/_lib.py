"""_lib.py - loads libkiln and declares the C API of include/kiln.h for ctypes.

The library is looked for in this order: $KILN_LIB (an explicit choice: the in-repo tests and
benchmarks point it at a build), the libkiln.so bundled in this package folder (pip install .),
then the build trees of a repository checkout (build/, build-python/)."""
import ctypes as C
import os
import threading

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_LIBNAME = "libkiln.so"

# kiln_dtype codes (ONNX TensorProto.DataType) <-> numpy
DTYPES = {
    1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
    9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64,
    14: np.complex64, 15: np.complex128,
}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}
# ONNX Runtime's NodeArg.type strings
ORT_TYPES = {
    0: "undefined", 1: "float", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    8: "string", 9: "bool", 10: "float16", 11: "double", 12: "uint32", 13: "uint64", 14: "complex64",
    15: "complex128", 16: "bfloat16", 17: "float8e4m3fn", 18: "float8e4m3fnuz", 19: "float8e5m2",
    20: "float8e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4e2m1", 24: "float8e8m0", 25: "uint2", 26: "int2",
}

VALUE_TENSOR, VALUE_SEQUENCE, VALUE_OPTIONAL = 1, 2, 3
PROVIDER_CPU, PROVIDER_CUDA = 0, 1
STATUS_NAMES = {0: "KILN_OK", 1: "KILN_ERR_INVALID_ARG", 2: "KILN_ERR_MODEL", 3: "KILN_ERR_UNSUPPORTED",
                4: "KILN_ERR_SHAPE", 5: "KILN_ERR_NOMEM", 6: "KILN_ERR_IO", 7: "KILN_ERR_RUNTIME"}


class IoInfo(C.Structure):
    _fields_ = [("name", C.c_char_p), ("kind", C.c_int), ("dtype", C.c_int), ("rank", C.c_int),
                ("dims", C.POINTER(C.c_int64)), ("dim_names", C.POINTER(C.c_char_p))]


class Options(C.Structure):
    _fields_ = [("provider", C.c_int), ("num_threads", C.c_int), ("allow_unsupported", C.c_bool),
                ("plan_cache_size", C.c_int), ("unoptimized", C.c_bool),
                ("device_id", C.c_int), ("device_outputs", C.c_bool)]


class Stats(C.Structure):
    _fields_ = [("compilations", C.c_int64), ("runs", C.c_int64), ("plan_cache_hits", C.c_int64),
                ("plan_cache_misses", C.c_int64), ("plan_cache_entries", C.c_int), ("plan_cache_capacity", C.c_int),
                ("arena_peak_bytes", C.c_int64), ("arena_last_bytes", C.c_int64),
                ("lower_bound_last_bytes", C.c_int64), ("heap_fallbacks", C.c_int64), ("bind_plan_ns", C.c_int64),
                ("run_ns", C.c_int64), ("nodes_gpu", C.c_int), ("nodes_cpu", C.c_int),
                ("node_runs_gpu", C.c_int64), ("node_runs_cpu", C.c_int64), ("device_mallocs", C.c_int64),
                ("copies_to_device", C.c_int64), ("copies_to_host", C.c_int64), ("graphs_captured", C.c_int64),
                ("graphs_replayed", C.c_int64), ("graphs_note", C.c_char * 192),
                ("nodes_fallback", C.c_int), ("device_bytes_peak", C.c_int64),
                ("kernels_generated", C.c_int), ("kernels_from_cache", C.c_int), ("kernels_note", C.c_char * 192)]


class NodeEvent(C.Structure):
    _fields_ = [("node", C.c_int), ("node_name", C.c_char_p), ("op_type", C.c_char_p),
                ("n_inputs", C.c_int), ("input_names", C.POINTER(C.c_char_p)), ("inputs", C.POINTER(C.c_void_p)),
                ("n_outputs", C.c_int), ("output_names", C.POINTER(C.c_char_p)), ("outputs", C.POINTER(C.c_void_p)),
                ("ms", C.c_double)]


MAX_RANK = 16


class TensorDesc(C.Structure):
    _fields_ = [("dtype", C.c_int), ("rank", C.c_int), ("dims", C.c_int64 * MAX_RANK), ("data", C.c_void_p),
                ("nbytes", C.c_size_t)]


class OutputBinding(C.Structure):
    _fields_ = [("on_device", C.c_bool), ("storage", C.c_void_p)]


class GeneratorParams(C.Structure):  # kiln_generator_params
    _fields_ = [("max_length", C.c_int64), ("batch_size", C.c_int), ("do_sample", C.c_int),
                ("temperature", C.c_double), ("top_k", C.c_int), ("top_p", C.c_double),
                ("seed", C.c_uint64), ("provider", C.c_int), ("num_threads", C.c_int)]


OBSERVER_FN = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(NodeEvent))


def candidates():
    """Paths tried for libkiln.so, in order."""
    out = []
    if os.environ.get("KILN_LIB"):
        out.append(os.environ["KILN_LIB"])
    out.append(os.path.join(_HERE, _LIBNAME))
    repo = os.path.normpath(os.path.join(_HERE, "..", ".."))
    out += [os.path.join(repo, b, _LIBNAME) for b in ("build", "build-python")]
    return out


def _declare(lib):
    P, I, I64, S, B = C.c_void_p, C.c_int, C.c_int64, C.c_char_p, C.c_bool
    PP = C.POINTER(P)
    sigs = {
        "kiln_version": (S, []),
        "kiln_status_name": (S, [I]),
        "kiln_dtype_size": (C.c_size_t, [I]),
        "kiln_provider_available": (B, [I]),
        "kiln_session_options_default": (Options, []),
        "kiln_session_create": (I, [S, C.POINTER(Options), PP]),
        "kiln_session_create_from_memory": (I, [C.c_char_p, C.c_size_t, S, C.POINTER(Options), PP]),
        "kiln_session_free": (None, [P]),
        "kiln_last_error": (S, [P]),
        "kiln_last_error_copy": (None, [P, C.c_char_p, C.c_size_t]),
        "kiln_session_input_count": (I, [P]),
        "kiln_session_output_count": (I, [P]),
        "kiln_session_input_info": (I, [P, I, C.POINTER(IoInfo)]),
        "kiln_session_output_info": (I, [P, I, C.POINTER(IoInfo)]),
        "kiln_session_run": (I, [P, I, C.POINTER(S), PP, I, C.POINTER(S), PP]),
        "kiln_session_run_observed": (I, [P, I, C.POINTER(S), PP, I, C.POINTER(S), PP, OBSERVER_FN, P]),
        "kiln_session_run_tensors": (I, [P, I, C.POINTER(S), C.POINTER(TensorDesc), I, C.POINTER(S), PP,
                                         C.POINTER(TensorDesc)]),
        "kiln_session_run_with_outputs": (I, [P, I, C.POINTER(S), PP, I, C.POINTER(S), C.POINTER(OutputBinding),
                                              PP]),
        "kiln_session_stats_get": (I, [P, C.POINTER(Stats)]),
        "kiln_session_ir_version": (I64, [P]),
        "kiln_session_opset_count": (I, [P]),
        "kiln_session_opset": (I, [P, I, C.POINTER(S), C.POINTER(I64)]),
        "kiln_session_model_string": (S, [P, S]),
        "kiln_session_model_version": (I64, [P]),
        "kiln_session_metadata_count": (I, [P]),
        "kiln_session_metadata": (I, [P, I, C.POINTER(S), C.POINTER(S)]),
        "kiln_session_node_count": (I, [P]),
        "kiln_session_node": (I, [P, I, C.POINTER(S), C.POINTER(S), C.POINTER(S), C.POINTER(B)]),
        "kiln_session_node_placement": (I, [P, I, C.POINTER(S), C.POINTER(S)]),
        "kiln_session_node_fallback": (B, [P, I]),
        "kiln_value_create_tensor": (I, [I, I, C.POINTER(I64), P, C.c_size_t, PP]),
        "kiln_value_wrap_tensor": (I, [I, I, C.POINTER(I64), P, C.c_size_t, PP]),
        "kiln_value_wrap_device_tensor": (I, [I, I, C.POINTER(I64), P, C.c_size_t, PP]),
        "kiln_value_on_device": (B, [P]),
        "kiln_value_clone": (I, [P, PP]),
        "kiln_value_free": (None, [P]),
        "kiln_value_kind_of": (I, [P]),
        "kiln_value_dtype": (I, [P]),
        "kiln_value_rank": (I, [P]),
        "kiln_value_dims": (C.POINTER(I64), [P]),
        "kiln_value_numel": (I64, [P]),
        "kiln_value_nbytes": (C.c_size_t, [P]),
        "kiln_value_data": (P, [P]),
        "kiln_value_sequence_length": (I64, [P]),
        "kiln_value_sequence_at": (P, [P, I64]),
        "kiln_value_optional_get": (P, [P]),
        "kiln_genai_model_open": (I, [S, C.POINTER(Options), PP]),
        "kiln_genai_model_last_error": (S, [P]),
        "kiln_genai_model_free": (None, [P]),
        "kiln_generator_params_default": (GeneratorParams, []),
        "kiln_generator_create": (I, [S, C.POINTER(GeneratorParams), PP]),
        "kiln_generator_create_from": (I, [P, C.POINTER(GeneratorParams), PP]),
        "kiln_generator_append_tokens": (I, [P, I, C.POINTER(I64), C.POINTER(I64)]),
        "kiln_generator_generate_next": (I, [P]),
        "kiln_generator_get_next_tokens": (I, [P, C.POINTER(C.POINTER(I64)), C.POINTER(I)]),
        "kiln_generator_get_logits": (I, [P, C.POINTER(C.POINTER(C.c_float)), C.POINTER(I64)]),
        "kiln_generator_get_sequence": (C.POINTER(I64), [P, I, C.POINTER(I64)]),
        "kiln_generator_is_done": (B, [P]),
        "kiln_generator_session_stats": (I, [P, C.POINTER(Stats)]),
        "kiln_generator_last_error": (S, [P]),
        "kiln_generator_free": (None, [P]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    # The run path's entry without argtypes (a second handle on the same library): ctypes then
    # converts nothing, which saves about 0.6 us a call; its caller passes exactly the C types
    # (a c_void_p session, Python ints for the counts, ctypes arrays for the pointers).
    lib.fast_run_tensors = C.CDLL(lib._name).kiln_session_run_tensors
    lib.fast_run_tensors.restype = C.c_int
    return lib


def load_library(path=None):
    """Opens libkiln (path, else the first of candidates() that exists) with its signatures declared."""
    tried = [path] if path else candidates()
    for p in tried:
        if p and os.path.exists(p):
            return _declare(C.CDLL(p))
    raise OSError("libkiln.so not found; tried: " + ", ".join(t for t in tried if t)
                  + " (pip install . from the repository, or set KILN_LIB)")


_lib = None
_lock = threading.Lock()


def library():
    """The process's libkiln (loaded on first use)."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                _lib = load_library()
    return _lib


def node_list(lib, h):
    """[(name, op_type, provider)] for every node of session h, subgraphs included, in
    execution order."""
    out = []
    for i in range(lib.kiln_session_node_count(h)):
        name, dom, op, prov, why = C.c_char_p(), C.c_char_p(), C.c_char_p(), C.c_char_p(), C.c_char_p()
        sup = C.c_bool()
        lib.kiln_session_node(h, i, C.byref(name), C.byref(dom), C.byref(op), C.byref(sup))
        lib.kiln_session_node_placement(h, i, C.byref(prov), C.byref(why))
        out.append((name.value.decode(), op.value.decode(), (prov.value or b"cpu").decode()))
    return out
