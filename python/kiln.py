"""Minimal ctypes binding of kiln's C API (include/kiln.h) for tests and benchmarks.

    sess = Session("model.onnx")            # or Session(bytes)
    outs = sess.run({"x": np.ones((2, 3), np.float32)})   # dict name -> ndarray

CUDA sessions also take DeviceArray feeds (device pointers, read in place) and, with
device_outputs=True, return DeviceArray outputs that own their device memory.
"""
import ctypes as C
import os

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))

_DTYPES = {
    1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
    9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64,
    14: np.complex64, 15: np.complex128,
}
_CODES = {np.dtype(v): k for k, v in _DTYPES.items()}


class KilnError(RuntimeError):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class _IoInfo(C.Structure):
    _fields_ = [("name", C.c_char_p), ("kind", C.c_int), ("dtype", C.c_int), ("rank", C.c_int),
                ("dims", C.POINTER(C.c_int64)), ("dim_names", C.POINTER(C.c_char_p))]


class _Options(C.Structure):
    _fields_ = [("provider", C.c_int), ("num_threads", C.c_int), ("allow_unsupported", C.c_bool),
                ("plan_cache_size", C.c_int), ("unoptimized", C.c_bool),
                ("device_id", C.c_int), ("device_outputs", C.c_bool)]


class _Stats(C.Structure):
    _fields_ = [("compilations", C.c_int64), ("runs", C.c_int64), ("plan_cache_hits", C.c_int64),
                ("plan_cache_misses", C.c_int64), ("plan_cache_entries", C.c_int), ("plan_cache_capacity", C.c_int),
                ("arena_peak_bytes", C.c_int64), ("arena_last_bytes", C.c_int64),
                ("lower_bound_last_bytes", C.c_int64), ("heap_fallbacks", C.c_int64), ("bind_plan_ns", C.c_int64),
                ("run_ns", C.c_int64), ("nodes_gpu", C.c_int), ("nodes_cpu", C.c_int),
                ("node_runs_gpu", C.c_int64), ("node_runs_cpu", C.c_int64), ("device_mallocs", C.c_int64),
                ("copies_to_device", C.c_int64), ("copies_to_host", C.c_int64), ("graphs_captured", C.c_int64),
                ("graphs_replayed", C.c_int64), ("graphs_note", C.c_char * 192)]

PROVIDERS = {"cpu": 0, "cuda": 1}


class DeviceArray:
    """A tensor in GPU memory: `ptr` (an int device pointer), shape and numpy dtype. As a feed it
    is borrowed (keep it alive during the run); as an output of a device_outputs session it owns
    its memory, released when the object goes."""

    def __init__(self, ptr, shape, dtype, _value=None, _lib=None):
        self.ptr, self.shape, self.dtype = ptr, tuple(shape), np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self._value, self._lib = _value, _lib

    def __del__(self):
        if self._value:
            self._lib.kiln_value_free(self._value)
            self._value = None


def _load_library(path=None):
    path = path or os.environ.get("KILN_LIB") or os.path.join(_HERE, "..", "build", "libkiln.so")
    lib = C.CDLL(path)
    P = C.c_void_p
    lib.kiln_session_create.argtypes = [C.c_char_p, C.POINTER(_Options), C.POINTER(P)]
    lib.kiln_session_create_from_memory.argtypes = [C.c_char_p, C.c_size_t, C.c_char_p, C.POINTER(_Options),
                                                    C.POINTER(P)]
    lib.kiln_session_free.argtypes = [P]
    lib.kiln_last_error.argtypes = [P]
    lib.kiln_last_error.restype = C.c_char_p
    lib.kiln_session_options_default.restype = _Options
    for f in ("kiln_session_input_count", "kiln_session_output_count"):
        getattr(lib, f).argtypes = [P]
    for f in ("kiln_session_input_info", "kiln_session_output_info"):
        getattr(lib, f).argtypes = [P, C.c_int, C.POINTER(_IoInfo)]
    lib.kiln_session_run.argtypes = [P, C.c_int, C.POINTER(C.c_char_p), C.POINTER(P), C.c_int,
                                     C.POINTER(C.c_char_p), C.POINTER(P)]
    lib.kiln_session_stats_get.argtypes = [P, C.POINTER(_Stats)]
    lib.kiln_value_wrap_tensor.argtypes = [C.c_int, C.c_int, C.POINTER(C.c_int64), P, C.c_size_t, C.POINTER(P)]
    lib.kiln_value_wrap_device_tensor.argtypes = lib.kiln_value_wrap_tensor.argtypes
    lib.kiln_value_on_device.argtypes = [P]
    lib.kiln_value_on_device.restype = C.c_bool
    lib.kiln_value_free.argtypes = [P]
    for f, res in (("kiln_value_kind_of", C.c_int), ("kiln_value_dtype", C.c_int), ("kiln_value_rank", C.c_int),
                   ("kiln_value_dims", C.POINTER(C.c_int64)), ("kiln_value_data", P),
                   ("kiln_value_nbytes", C.c_size_t)):
        getattr(lib, f).argtypes = [P]
        getattr(lib, f).restype = res
    return lib


_lib = None


def library():
    global _lib
    if _lib is None:
        _lib = _load_library()
    return _lib


class Session:
    def __init__(self, model, allow_unsupported=False, plan_cache_size=None, unoptimized=False, num_threads=0,
                 provider="cpu", device_id=0, device_outputs=False):
        self._h = None
        lib = library()
        opt = lib.kiln_session_options_default()
        opt.provider = PROVIDERS[provider]
        opt.device_id = device_id
        opt.device_outputs = device_outputs
        opt.allow_unsupported = allow_unsupported
        opt.unoptimized = unoptimized
        opt.num_threads = num_threads
        if plan_cache_size is not None:
            opt.plan_cache_size = plan_cache_size
        h = C.c_void_p()
        if isinstance(model, (bytes, bytearray)):
            st = lib.kiln_session_create_from_memory(bytes(model), len(model), None, C.byref(opt), C.byref(h))
        else:
            st = lib.kiln_session_create(os.fsencode(model), C.byref(opt), C.byref(h))
        if st:
            msg = lib.kiln_last_error(h).decode(errors="replace")
            lib.kiln_session_free(h)
            raise KilnError(st, msg)
        self._h = h
        self._lib = lib
        self.inputs = [self._info(lib.kiln_session_input_info, i) for i in range(lib.kiln_session_input_count(h))]
        self.outputs = [self._info(lib.kiln_session_output_info, i) for i in range(lib.kiln_session_output_count(h))]

    def _info(self, fn, i):
        io = _IoInfo()
        fn(self._h, i, C.byref(io))
        dims = None
        if io.rank >= 0:
            dims = [io.dims[k] if io.dims[k] >= 0 else io.dim_names[k].decode() for k in range(io.rank)]
        return {"name": io.name.decode(), "dtype": io.dtype, "shape": dims}

    def run(self, feeds, output_names=None):
        lib = self._lib
        names = output_names or [o["name"] for o in self.outputs]
        arrays, handles = [], []
        try:
            for name, arr in feeds.items():
                if isinstance(arr, DeviceArray):
                    code = _CODES.get(arr.dtype)
                    dims = (C.c_int64 * max(len(arr.shape), 1))(*arr.shape)
                    h = C.c_void_p()
                    st = lib.kiln_value_wrap_device_tensor(code or 0, len(arr.shape), dims, C.c_void_p(arr.ptr),
                                                           arr.nbytes, C.byref(h))
                    if st:
                        raise KilnError(st, f"cannot wrap device input {name}")
                    handles.append(h)
                    continue
                a = np.ascontiguousarray(arr).reshape(np.shape(arr))
                code = _CODES.get(a.dtype)
                if code is None:
                    raise TypeError(f"unsupported dtype {a.dtype}")
                arrays.append(a)
                dims = (C.c_int64 * max(a.ndim, 1))(*a.shape)
                h = C.c_void_p()
                st = lib.kiln_value_wrap_tensor(code, a.ndim, dims, a.ctypes.data_as(C.c_void_p), a.nbytes, C.byref(h))
                if st:
                    raise KilnError(st, f"cannot wrap input {name}")
                handles.append(h)
            in_names = (C.c_char_p * max(len(feeds), 1))(*[n.encode() for n in feeds])
            in_vals = (C.c_void_p * max(len(handles), 1))(*[h.value for h in handles])
            out_names = (C.c_char_p * max(len(names), 1))(*[n.encode() for n in names])
            outs = (C.c_void_p * max(len(names), 1))()
            st = lib.kiln_session_run(self._h, len(feeds), in_names, in_vals, len(names), out_names, outs)
            if st:
                raise KilnError(st, lib.kiln_last_error(self._h).decode(errors="replace"))
            result = []
            for j in range(len(names)):
                if lib.kiln_value_on_device(outs[j]):
                    result.append(self._device_output(outs[j]))
                    continue
                result.append(self._to_numpy(outs[j]))
                lib.kiln_value_free(outs[j])
            return result
        finally:
            for h in handles:
                lib.kiln_value_free(h)

    def stats(self):
        st = _Stats()
        self._lib.kiln_session_stats_get(self._h, C.byref(st))
        out = {name: getattr(st, name) for name, _ in _Stats._fields_}
        out["graphs_note"] = out["graphs_note"].decode("utf-8", "replace")
        return out

    def _device_output(self, v):
        lib = self._lib
        dims = lib.kiln_value_dims(v)
        shape = tuple(dims[k] for k in range(lib.kiln_value_rank(v)))
        return DeviceArray(lib.kiln_value_data(v) or 0, shape, _DTYPES[lib.kiln_value_dtype(v)], v, lib)

    def _to_numpy(self, v):
        lib = self._lib
        if lib.kiln_value_kind_of(v) != 1:
            raise TypeError("only tensor outputs are converted")
        dt = _DTYPES.get(lib.kiln_value_dtype(v))
        if dt is None:
            raise TypeError(f"dtype code {lib.kiln_value_dtype(v)} not converted")
        rank = lib.kiln_value_rank(v)
        dims = lib.kiln_value_dims(v)
        shape = tuple(dims[k] for k in range(rank))
        n = lib.kiln_value_nbytes(v)
        buf = C.string_at(lib.kiln_value_data(v), n) if n else b""
        return np.frombuffer(buf, dtype=dt).reshape(shape).copy()

    def close(self):
        if self._h:
            self._lib.kiln_session_free(self._h)
            self._h = None

    def __del__(self):
        self.close()
