"""_legacy.py - kiln.Session, the small binding the repository's tests and benchmarks use.

    sess = Session("model.onnx")            # or Session(bytes)
    outs = sess.run({"x": np.ones((2, 3), np.float32)})   # dict name -> ndarray

CUDA sessions also take DeviceArray feeds (device pointers, read in place) and, with
device_outputs=True, return DeviceArray outputs that own their device memory.
"""
import ctypes as C
import os

import numpy as np

from . import _lib
from ._errors import KilnError, error

_DTYPES = _lib.DTYPES
_CODES = _lib.CODES
_Options, _Stats, _IoInfo = _lib.Options, _lib.Stats, _lib.IoInfo

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
    return _lib.load_library(path)


def library():
    return _lib.library()


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
            raise error(st, msg)
        self._h = h
        self._lib = lib
        self.inputs = [self._info(lib.kiln_session_input_info, i) for i in range(lib.kiln_session_input_count(h))]
        self.outputs = [self._info(lib.kiln_session_output_info, i) for i in range(lib.kiln_session_output_count(h))]

    def nodes(self):
        """[(name, op_type, provider)] for every node, subgraphs included, in execution order."""
        return _lib.node_list(self._lib, self._h)

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
                        raise error(st, f"cannot wrap device input {name}")
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
                    raise error(st, f"cannot wrap input {name}")
                handles.append(h)
            in_names = (C.c_char_p * max(len(feeds), 1))(*[n.encode() for n in feeds])
            in_vals = (C.c_void_p * max(len(handles), 1))(*[h.value for h in handles])
            out_names = (C.c_char_p * max(len(names), 1))(*[n.encode() for n in names])
            outs = (C.c_void_p * max(len(names), 1))()
            st = lib.kiln_session_run(self._h, len(feeds), in_names, in_vals, len(names), out_names, outs)
            if st:
                raise error(st, lib.kiln_last_error(self._h).decode(errors="replace"))
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
        out["kernels_note"] = out["kernels_note"].decode("utf-8", "replace")
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
