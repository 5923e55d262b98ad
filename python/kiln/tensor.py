"""tensor.py - kiln tensors in Python: OrtValue (ONNX Runtime's name) holding one kiln_value,
numpy views of kiln's buffers without a copy, and DLPack export and import on the CPU.

A numpy array given to kiln is wrapped (kiln_value_wrap_tensor borrows its memory) when it is
C-contiguous, aligned and in native byte order; otherwise one contiguous copy is made. Tensor
outputs come back as numpy arrays over the buffer kiln allocated for them: the array keeps the
kiln_value alive and the value is freed when the last view of it goes."""
import ctypes as C
import threading

import numpy as np

from . import _lib
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


class OrtValue:
    """One kiln value (ONNX Runtime's OrtValue). Made from numpy (ortvalue_from_numpy: the array
    is borrowed, not copied, when contiguous), from DLPack (from_dlpack), or returned by
    InferenceSession.run_with_ort_values (it then owns kiln's output buffer). numpy() views the
    buffer without a copy; __dlpack__ exports it without a copy."""

    def __init__(self, handle, lib, keep=None, owner=None):
        self._v, self._lib, self._keep = handle, lib, keep
        self._owner = owner if owner is not None else _Owner(handle, lib)

    # constructors
    @staticmethod
    def ortvalue_from_numpy(numpy_obj, device_type="cpu", device_id=0):
        if str(device_type).lower() != "cpu":
            raise invalid(f"OrtValue on device '{device_type}': kiln's Python binding holds CPU tensors only")
        lib = _lib.library()
        h, a = wrap_array(lib, prepare_array(numpy_obj))
        return OrtValue(h, lib, keep=a)

    @staticmethod
    def ortvalue_from_shape_and_type(shape, element_type=np.float32, device_type="cpu", device_id=0):
        if str(device_type).lower() != "cpu":
            raise invalid(f"OrtValue on device '{device_type}': kiln's Python binding holds CPU tensors only")
        return OrtValue.ortvalue_from_numpy(np.zeros(tuple(shape), dtype=element_type))

    @staticmethod
    def from_dlpack(data, is_bool_tensor=False):
        return from_dlpack(data)

    # ONNX Runtime's accessors
    def numpy(self):
        if self._keep is not None:
            return self._keep
        return value_to_python(self._lib, self._v, self)

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
        return "cuda" if self._lib.kiln_value_on_device(self._v) else "cpu"

    def is_tensor(self):
        return self._lib.kiln_value_kind_of(self._v) == _lib.VALUE_TENSOR

    def has_value(self):
        lib = self._lib
        return lib.kiln_value_kind_of(self._v) != _lib.VALUE_OPTIONAL or bool(lib.kiln_value_optional_get(self._v))

    def data_ptr(self):
        return self._lib.kiln_value_data(self._v) or 0

    def __repr__(self):
        return f"OrtValue({self.data_type()}, shape={self.shape()}, device={self.device_name()})"

    # DLPack (CPU)
    def __dlpack_device__(self):
        if self._lib.kiln_value_on_device(self._v):
            raise BufferError("kiln: DLPack export of GPU tensors is not implemented (CPU tensors only)")
        return (_DL_CPU, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if self._lib.kiln_value_kind_of(self._v) != _lib.VALUE_TENSOR:
            raise BufferError("kiln: only tensors export through DLPack")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"kiln: DLPack export to device {tuple(dl_device)} is not supported (CPU only)")
        if copy:
            raise BufferError("kiln: DLPack export with copy=True is not supported; the buffer is shared")
        return _to_capsule(self)

    def to_dlpack(self):
        return self.__dlpack__()


# ---- DLPack: the C structs of dlpack.h (v0.8 legacy DLManagedTensor, capsule "dltensor") ----

_DL_CPU = 1
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_COMPLEX, _DL_BOOL = 0, 1, 2, 5, 6


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
    a = val.numpy()  # a view of the buffer: keeps it alive as long as the export does
    if not isinstance(a, np.ndarray) or a.dtype.kind not in _DL_TYPES:
        raise BufferError(f"kiln: tensors of {val.data_type()} do not export through DLPack")
    mt = _DLManagedTensor()
    shape = (C.c_int64 * (a.ndim or 1))(*a.shape)
    t = mt.dl_tensor
    t.data = a.ctypes.data if a.nbytes else lib.kiln_value_data(val._v)
    t.device = _DLDevice(_DL_CPU, 0)
    t.ndim = a.ndim
    t.dtype = _DLDataType(_DL_TYPES[a.dtype.kind], a.dtype.itemsize * 8, 1)
    t.shape = shape
    t.strides = None  # row-major, contiguous
    t.byte_offset = 0
    mt.manager_ctx = None
    mt.deleter = _deleter_fn
    with _exported_lock:
        _exported[C.addressof(mt)] = (mt, shape, a, val)
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


def from_dlpack(data):
    """An OrtValue over a CPU tensor from any DLPack producer (an object with __dlpack__, e.g. a
    numpy array or a CPU torch tensor) or a "dltensor" capsule, without a copy (a strided one is
    made contiguous: one copy). GPU tensors are
    refused (not implemented yet)."""
    if type(data).__name__ == "PyCapsule":
        data = _Capsule(data)
    if not hasattr(data, "__dlpack__"):
        raise invalid(f"from_dlpack: {type(data).__name__} is neither a DLPack producer nor a capsule")
    dev = tuple(data.__dlpack_device__()) if hasattr(data, "__dlpack_device__") else (_DL_CPU, 0)
    if dev[0] != _DL_CPU:
        raise invalid(f"from_dlpack: device type {dev[0]} (GPU DLPack) is not implemented; CPU tensors only")
    a = prepare_array(np.from_dlpack(data))  # a strided tensor is copied once, a contiguous one not
    lib = _lib.library()
    h, a = wrap_array(lib, a)
    return OrtValue(h, lib, keep=a)
