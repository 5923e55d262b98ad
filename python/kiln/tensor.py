"""tensor.py - kiln tensors in Python: OrtValue (ONNX Runtime's name) holding one kiln_value,
numpy views of kiln's buffers without a copy, and DLPack export and import on the CPU and on
CUDA GPUs.

A numpy array given to kiln is wrapped (kiln_value_wrap_tensor borrows its memory) when it is
C-contiguous, aligned and in native byte order; otherwise one contiguous copy is made. Tensor
outputs come back as numpy arrays over the buffer kiln allocated for them: the array keeps the
kiln_value alive and the value is freed when the last view of it goes.

GPU tensors: an OrtValue may hold device memory (kiln_value_on_device): an output a CUDA
session handed out in device memory (IOBinding), a tensor imported through DLPack from torch or
cupy (borrowed in place), or memory ortvalue_from_numpy(a, "cuda") allocated. Such values
export through DLPack in place (kDLCUDA and the device id); numpy() copies them to the host."""
import ctypes as C
import threading

import numpy as np

from . import _cuda, _lib
from ._errors import error, invalid

# ---- numpy <-> kiln_value ----


class _Owner:
    """Frees one kiln_value when the last numpy view of its buffer is gone."""
    __slots__ = ("v", "lib")

    def __init__(self, v, lib):
        self.v, self.lib = v, lib

    def __del__(self):
        if self.v:
            self.lib.kiln_value_free(self.v)
            self.v = None


def _dims(shape):
    return (C.c_int64 * (len(shape) or 1))(*shape)


def prepare_array(a):
    """numpy array kiln can borrow: `a` itself when contiguous, aligned and native; else a copy."""
    if type(a) is not np.ndarray:
        a = np.asarray(a)
    f = a.flags
    if not (f.c_contiguous and f.aligned) or not a.dtype.isnative:
        a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("="))
    return a


def wrap_array(lib, a):
    """(kiln_value handle owned by the caller, array it borrows). Strings are copied."""
    code = _lib.CODES.get(a.dtype)
    h = C.c_void_p()
    if code is not None:
        st = lib.kiln_value_wrap_tensor(code, a.ndim, _dims(a.shape), a.ctypes.data, a.nbytes, C.byref(h))
    elif a.dtype.kind in "UOS":
        items = [s if isinstance(s, bytes) else str(s).encode() for s in a.reshape(-1).tolist()]
        ptrs = (C.c_char_p * (len(items) or 1))(*items)
        st = lib.kiln_value_create_tensor(8, a.ndim, _dims(a.shape), ptrs, len(items) * C.sizeof(C.c_char_p),
                                          C.byref(h))
    else:
        raise invalid(f"numpy dtype {a.dtype} has no kiln element type")
    if st:
        raise error(st, f"cannot make a kiln tensor of {a.dtype} {list(a.shape)}")
    return h.value, a


def value_to_python(lib, v, owner):
    """The Python form of kiln_value v: a numpy array over its buffer for a tensor (owner keeps v
    alive), a list for a sequence, None or the held value for an optional. Borrowed items of
    sequences and optionals share the owner of the value they belong to."""
    kind = lib.kiln_value_kind_of(v)
    if kind == _lib.VALUE_TENSOR:
        return tensor_to_numpy(lib, v, owner)
    if kind == _lib.VALUE_SEQUENCE:
        return [value_to_python(lib, lib.kiln_value_sequence_at(v, i), owner)
                for i in range(lib.kiln_value_sequence_length(v))]
    if kind == _lib.VALUE_OPTIONAL:
        inner = lib.kiln_value_optional_get(v)
        return None if not inner else value_to_python(lib, inner, owner)
    raise error(7, f"kiln value of kind {kind} has no Python form")


def tensor_to_numpy(lib, v, owner):
    code = lib.kiln_value_dtype(v)
    dims = lib.kiln_value_dims(v)
    shape = tuple(dims[k] for k in range(lib.kiln_value_rank(v)))
    if lib.kiln_value_on_device(v):
        raise invalid("the tensor is in GPU memory; numpy views need host memory")
    if code == 8:  # STRING: an array of char *, copied into Python strings
        n = lib.kiln_value_numel(v)
        ptrs = C.cast(lib.kiln_value_data(v), C.POINTER(C.c_char_p))
        return np.array([ptrs[i].decode("utf-8", "replace") for i in range(n)], dtype=object).reshape(shape)
    dt = _lib.DTYPES.get(code)
    if dt is None:
        raise invalid(f"kiln element type {_lib.ORT_TYPES.get(code, code)} has no numpy dtype")
    n = lib.kiln_value_nbytes(v)
    if not n:
        return np.empty(shape, dt)
    buf = (C.c_char * n).from_address(lib.kiln_value_data(v))
    buf._kiln_owner = owner  # the array's base is buf; buf keeps the value alive
    return np.frombuffer(buf, dt).reshape(shape)


# ---- OrtValue ----


def device_kind(device_type):
    """"cpu" or "cuda" for ONNX Runtime's device names; others are refused."""
    d = str(device_type).lower()
    if d in ("cpu", "cuda"):
        return d
    raise invalid(f"device '{device_type}': kiln has 'cpu' and 'cuda'")


def element_code(element_type):
    """kiln_dtype code of a numpy dtype or type (ONNX Runtime's element_type)."""
    code = _lib.CODES.get(np.dtype(element_type))
    if code is None:
        raise invalid(f"element type {element_type} has no kiln element type")
    return code


def wrap_memory(ptr, element_type, shape, device, device_id=0, keep=None):
    """An OrtValue borrowing ptr (host or device memory, as device says) as a contiguous
    tensor; keep is what keeps that memory alive (None: the caller does)."""
    lib = _lib.library()
    code, shape = element_code(element_type), tuple(int(d) for d in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(element_type).itemsize
    wrap = lib.kiln_value_wrap_device_tensor if device == "cuda" else lib.kiln_value_wrap_tensor
    h = C.c_void_p()
    st = wrap(code, len(shape), _dims(shape), ptr or None, nbytes, C.byref(h))
    if st:
        raise error(st, f"cannot wrap {device} memory at {ptr:#x} as {np.dtype(element_type)} {list(shape)}")
    return OrtValue(h.value, lib, keep=keep, device_id=device_id if device == "cuda" else 0)


def _upload(a, device_id):
    """An OrtValue holding a copy of ndarray a in new device memory."""
    buf = _cuda.DeviceBuffer(a.nbytes, device_id)
    buf.rt.copy(buf.ptr, a.ctypes.data, a.nbytes)
    return wrap_memory(buf.ptr, a.dtype, a.shape, "cuda", device_id, keep=buf)


class OrtValue:
    """One kiln value (ONNX Runtime's OrtValue). Made from numpy (ortvalue_from_numpy: the array
    is borrowed, not copied, when contiguous; with device_type "cuda" copied into new device
    memory), from DLPack (from_dlpack: CPU and CUDA tensors borrowed in place), or returned by
    InferenceSession.run_with_ort_values and IOBinding.get_outputs (it then owns kiln's output
    buffer, on the host or the device). numpy() views a host buffer without a copy and copies
    a device one; __dlpack__ exports either without a copy."""

    def __init__(self, handle, lib, keep=None, owner=None, device_id=0):
        self._v, self._lib, self._keep, self._device_id = handle, lib, keep, device_id
        self._owner = owner if owner is not None else _Owner(handle, lib)

    # constructors
    @staticmethod
    def ortvalue_from_numpy(numpy_obj, device_type="cpu", device_id=0):
        a = prepare_array(numpy_obj)
        if device_kind(device_type) == "cuda":
            return _upload(a, int(device_id))
        lib = _lib.library()
        h, a = wrap_array(lib, a)
        return OrtValue(h, lib, keep=a)

    @staticmethod
    def ortvalue_from_shape_and_type(shape, element_type=np.float32, device_type="cpu", device_id=0):
        """A zero-filled tensor of shape and element_type in host or (device_type "cuda") device memory."""
        if device_kind(device_type) == "cpu":
            return OrtValue.ortvalue_from_numpy(np.zeros(tuple(shape), dtype=element_type))
        nbytes = int(np.prod(tuple(shape), dtype=np.int64)) * np.dtype(element_type).itemsize
        buf = _cuda.DeviceBuffer(nbytes, int(device_id))
        buf.rt.memset(buf.ptr, nbytes)
        return wrap_memory(buf.ptr, element_type, shape, "cuda", int(device_id), keep=buf)

    @staticmethod
    def from_dlpack(data, is_bool_tensor=False):
        return from_dlpack(data)

    # ONNX Runtime's accessors
    def on_device(self):
        return bool(self._lib.kiln_value_on_device(self._v))

    def numpy(self):
        """The tensor as a numpy array: a view of a host buffer, a host copy of a device one."""
        if self._keep is not None and isinstance(self._keep, np.ndarray):
            return self._keep
        if self.on_device():
            dt = _lib.DTYPES.get(self._lib.kiln_value_dtype(self._v))
            if dt is None:
                raise invalid(f"kiln element type {self.data_type()} has no numpy dtype")
            out = np.empty(tuple(self.shape()), dt)
            _cuda.runtime().copy(out.ctypes.data, self.data_ptr(), out.nbytes)
            return out
        return value_to_python(self._lib, self._v, self)

    def update_inplace(self, np_arr):
        """Copies np_arr (same number of bytes) into this tensor's memory, host or device."""
        a = prepare_array(np_arr)
        if a.nbytes != self._lib.kiln_value_nbytes(self._v):
            raise invalid(f"update_inplace: {a.nbytes} bytes given for a tensor of "
                          f"{self._lib.kiln_value_nbytes(self._v)}")
        if self.on_device():
            _cuda.runtime().copy(self.data_ptr(), a.ctypes.data, a.nbytes)
        elif a.nbytes:
            C.memmove(self.data_ptr(), a.ctypes.data, a.nbytes)

    def shape(self):
        dims = self._lib.kiln_value_dims(self._v)
        return [dims[k] for k in range(self._lib.kiln_value_rank(self._v))]

    def data_type(self):
        kind = self._lib.kiln_value_kind_of(self._v)
        name = _lib.ORT_TYPES.get(self._lib.kiln_value_dtype(self._v), "undefined")
        return {1: "tensor", 2: "seq(tensor", 3: "optional(tensor"}[kind] + f"({name})" + ("" if kind == 1 else ")")

    def element_type(self):
        return _lib.DTYPES.get(self._lib.kiln_value_dtype(self._v), object)

    def device_name(self):
        return "cuda" if self.on_device() else "cpu"

    def device_id(self):
        return self._device_id

    def is_tensor(self):
        return self._lib.kiln_value_kind_of(self._v) == _lib.VALUE_TENSOR

    def has_value(self):
        lib = self._lib
        return lib.kiln_value_kind_of(self._v) != _lib.VALUE_OPTIONAL or bool(lib.kiln_value_optional_get(self._v))

    def data_ptr(self):
        """Address of the tensor's data: a host pointer, or a device pointer for a device tensor."""
        return self._lib.kiln_value_data(self._v) or 0

    def __repr__(self):
        return f"OrtValue({self.data_type()}, shape={self.shape()}, device={self.device_name()})"

    # DLPack
    def __dlpack_device__(self):
        return (_DL_CUDA, self._device_id) if self.on_device() else (_DL_CPU, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A "dltensor" capsule over this tensor's memory (no copy); the consumer's deleter
        releases it, and the capsule keeps this value alive until then. stream (CUDA): the
        consumer's stream; a device tensor kiln made is complete already (a run returns once its
        outputs are written), so no stream needs to wait: any stream but 0 (ambiguous, refused
        by the DLPack protocol) is accepted."""
        if self._lib.kiln_value_kind_of(self._v) != _lib.VALUE_TENSOR:
            raise BufferError("kiln: only tensors export through DLPack")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"kiln: DLPack export to device {tuple(dl_device)} is not supported "
                              f"(the tensor is on {self.__dlpack_device__()}; no copies)")
        if copy:
            raise BufferError("kiln: DLPack export with copy=True is not supported; the buffer is shared")
        if self.on_device() and stream == 0:
            raise BufferError("kiln: stream=0 is ambiguous for CUDA (DLPack): pass None, 1, 2 or a stream")
        return _to_capsule(self)

    def to_dlpack(self):
        return self.__dlpack__()


# ---- DLPack: the C structs of dlpack.h (v0.8 legacy DLManagedTensor, capsule "dltensor") ----

_DL_CPU, _DL_CUDA, _DL_CUDA_MANAGED = 1, 2, 13
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT, _DL_COMPLEX, _DL_BOOL = 0, 1, 2, 4, 5, 6


class _DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int32), ("device_id", C.c_int32)]


class _DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class _DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", _DLDevice), ("ndim", C.c_int32), ("dtype", _DLDataType),
                ("shape", C.POINTER(C.c_int64)), ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


class _DLManagedTensor(C.Structure):
    pass


_DELETER = C.CFUNCTYPE(None, C.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", C.c_void_p), ("deleter", _DELETER)]
# a producer's deleter, called holding the GIL (cupy's and torch's may touch Python objects)
_FOREIGN_DELETER = C.PYFUNCTYPE(None, C.c_void_p)

_CAPSULE_DESTRUCTOR = C.CFUNCTYPE(None, C.c_void_p)
_py = C.pythonapi
_py.PyCapsule_New.restype = C.py_object
_py.PyCapsule_New.argtypes = [C.c_void_p, C.c_char_p, _CAPSULE_DESTRUCTOR]
# the destructor sees a capsule that is being deallocated: raw pointers, no reference counting
_capsule_is_valid = C.PYFUNCTYPE(C.c_int, C.c_void_p, C.c_char_p)(("PyCapsule_IsValid", _py))
_capsule_pointer = C.PYFUNCTYPE(C.c_void_p, C.c_void_p, C.c_char_p)(("PyCapsule_GetPointer", _py))
_py.PyCapsule_IsValid.restype = C.c_int
_py.PyCapsule_IsValid.argtypes = [C.py_object, C.c_char_p]
_py.PyCapsule_GetPointer.restype = C.c_void_p
_py.PyCapsule_GetPointer.argtypes = [C.py_object, C.c_char_p]
_py.PyCapsule_SetName.restype = C.c_int
_py.PyCapsule_SetName.argtypes = [C.py_object, C.c_char_p]

_DL_TYPES = {  # numpy kind -> DLPack type code
    "i": _DL_INT, "u": _DL_UINT, "f": _DL_FLOAT, "c": _DL_COMPLEX, "b": _DL_BOOL,
}
# kiln_dtype code <-> DLPack (type code, bits)
_KILN_TO_DL = {1: (_DL_FLOAT, 32), 2: (_DL_UINT, 8), 3: (_DL_INT, 8), 4: (_DL_UINT, 16), 5: (_DL_INT, 16),
               6: (_DL_INT, 32), 7: (_DL_INT, 64), 9: (_DL_BOOL, 8), 10: (_DL_FLOAT, 16), 11: (_DL_FLOAT, 64),
               12: (_DL_UINT, 32), 13: (_DL_UINT, 64), 14: (_DL_COMPLEX, 64), 15: (_DL_COMPLEX, 128),
               16: (_DL_BFLOAT, 16)}
_DL_TO_KILN = {v: k for k, v in _KILN_TO_DL.items()}

# Exported tensors alive in a consumer: address of the DLManagedTensor -> what it references.
_exported = {}
_exported_lock = threading.Lock()


def _deleter(mt):
    with _exported_lock:
        _exported.pop(C.addressof(mt.contents), None)


_deleter_fn = _DELETER(_deleter)


def _capsule_destructor(capsule):
    # an unconsumed capsule still owns its tensor; a consumer renames it "used_dltensor"
    if _capsule_is_valid(capsule, b"dltensor"):
        p = _capsule_pointer(capsule, b"dltensor")
        if p:
            _deleter(C.cast(p, C.POINTER(_DLManagedTensor)))


_capsule_destructor_fn = _CAPSULE_DESTRUCTOR(_capsule_destructor)


def _to_capsule(val):
    lib = val._lib
    if val.on_device():  # the device pointer itself; the export holds the OrtValue
        code = lib.kiln_value_dtype(val._v)
        if code not in _KILN_TO_DL:
            raise BufferError(f"kiln: tensors of {val.data_type()} do not export through DLPack")
        dims, data, held = val.shape(), lib.kiln_value_data(val._v), val
        dl_type, device = _KILN_TO_DL[code], _DLDevice(_DL_CUDA, val._device_id)
    else:
        a = val.numpy()  # a view of the buffer: keeps it alive as long as the export does
        if not isinstance(a, np.ndarray) or a.dtype.kind not in _DL_TYPES:
            raise BufferError(f"kiln: tensors of {val.data_type()} do not export through DLPack")
        dims, data, held = a.shape, a.ctypes.data if a.nbytes else lib.kiln_value_data(val._v), (a, val)
        dl_type, device = (_DL_TYPES[a.dtype.kind], a.dtype.itemsize * 8), _DLDevice(_DL_CPU, 0)
    mt = _DLManagedTensor()
    shape = (C.c_int64 * (len(dims) or 1))(*dims)
    t = mt.dl_tensor
    t.data = data
    t.device = device
    t.ndim = len(dims)
    t.dtype = _DLDataType(dl_type[0], dl_type[1], 1)
    t.shape = shape
    t.strides = None  # row-major, contiguous
    t.byte_offset = 0
    mt.manager_ctx = None
    mt.deleter = _deleter_fn
    with _exported_lock:
        _exported[C.addressof(mt)] = (mt, shape, held)
    return _py.PyCapsule_New(C.addressof(mt), b"dltensor", _capsule_destructor_fn)


class _Capsule:
    """Presents a bare "dltensor" capsule to np.from_dlpack, which takes producers only."""

    def __init__(self, capsule):
        if not _py.PyCapsule_IsValid(capsule, b"dltensor"):
            raise invalid("from_dlpack: not an unconsumed DLPack capsule ('dltensor')")
        self._capsule = capsule
        mt = C.cast(_py.PyCapsule_GetPointer(capsule, b"dltensor"), C.POINTER(_DLManagedTensor)).contents
        self._device = (mt.dl_tensor.device.device_type, mt.dl_tensor.device.device_id)

    def __dlpack_device__(self):
        return self._device

    def __dlpack__(self, **kw):
        return self._capsule


class _Imported:
    """A consumed DLManagedTensor (its capsule renamed "used_dltensor"): calls the producer's
    deleter when the last kiln reference to the memory goes."""
    __slots__ = ("mt",)

    def __init__(self, mt):
        self.mt = mt

    def __del__(self):
        if self.mt:
            fn = C.c_void_p.from_address(self.mt + _DLManagedTensor.deleter.offset).value
            if fn:
                _FOREIGN_DELETER(fn)(self.mt)
            self.mt = None


def dlpack_device(obj):
    """(device type, device id) of a DLPack producer; CPU for one without __dlpack_device__."""
    return tuple(obj.__dlpack_device__()) if hasattr(obj, "__dlpack_device__") else (_DL_CPU, 0)


def _import_device(data, dev):
    """An OrtValue borrowing a CUDA DLPack tensor in place (the capsule consumed)."""
    if dev[0] not in (_DL_CUDA, _DL_CUDA_MANAGED):
        raise invalid(f"from_dlpack: DLPack device type {dev[0]} is not supported; kiln takes CPU (1) and "
                      f"CUDA (2) tensors")
    rt = _cuda.runtime()
    if isinstance(data, _Capsule):
        capsule = data.__dlpack__()
    else:
        # the consumer's stream is the legacy default stream (1): the producer makes it wait for
        # its own work, and the host waits for it below, so kiln's stream sees finished data
        capsule = data.__dlpack__(stream=1)
    rt.sync_legacy()
    if not _py.PyCapsule_IsValid(capsule, b"dltensor"):
        raise invalid("from_dlpack: the producer did not return an unconsumed 'dltensor' capsule")
    p = _py.PyCapsule_GetPointer(capsule, b"dltensor")
    t = C.cast(p, C.POINTER(_DLManagedTensor)).contents.dl_tensor
    shape = tuple(t.shape[k] for k in range(t.ndim))
    code = _DL_TO_KILN.get((t.dtype.code, t.dtype.bits)) if t.dtype.lanes == 1 else None
    if code is None:
        raise invalid(f"from_dlpack: DLPack type (code {t.dtype.code}, {t.dtype.bits} bits, {t.dtype.lanes} lanes) "
                      f"has no kiln element type")
    if t.strides:
        want = 1
        for k in reversed(range(t.ndim)):
            if shape[k] != 1 and t.strides[k] != want:
                strides = [t.strides[i] for i in range(t.ndim)]
                raise invalid(f"from_dlpack: a non-contiguous CUDA tensor (shape {list(shape)}, strides {strides} "
                              f"elements); kiln reads device tensors in place, row-major: make it contiguous "
                              f"first (torch: .contiguous(), cupy: cupy.ascontiguousarray)")
            want *= shape[k]
    lib = _lib.library()
    nbytes = int(np.prod(shape, dtype=np.int64)) * lib.kiln_dtype_size(code)
    h = C.c_void_p()
    st = lib.kiln_value_wrap_device_tensor(code, t.ndim, _dims(shape), (t.data or 0) + t.byte_offset or None,
                                           nbytes, C.byref(h))
    if st:
        raise error(st, f"from_dlpack: cannot wrap the CUDA tensor ({_lib.ORT_TYPES.get(code)} {list(shape)})")
    _py.PyCapsule_SetName(capsule, b"used_dltensor")  # ours now: the producer's destructor leaves it
    return OrtValue(h.value, lib, keep=_Imported(p), device_id=t.device.device_id)


def from_dlpack(data):
    """An OrtValue over a tensor from any DLPack producer (an object with __dlpack__: a numpy
    array, a torch or cupy tensor on the CPU or a CUDA GPU) or a "dltensor" capsule, without a
    copy. A strided CPU tensor is made contiguous (one copy); a strided CUDA tensor is refused
    (make it contiguous first). A CUDA tensor is handed over on the legacy default stream
    (__dlpack__(stream=1)) and waited for, so the producer's pending work on it is done."""
    if type(data).__name__ == "PyCapsule":
        data = _Capsule(data)
    if not hasattr(data, "__dlpack__"):
        raise invalid(f"from_dlpack: {type(data).__name__} is neither a DLPack producer nor a capsule")
    dev = dlpack_device(data)
    if dev[0] != _DL_CPU:
        return _import_device(data, dev)
    a = prepare_array(np.from_dlpack(data))  # a strided tensor is copied once, a contiguous one not
    lib = _lib.library()
    h, a = wrap_array(lib, a)
    return OrtValue(h, lib, keep=a)
