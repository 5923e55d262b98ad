"""session.py - ONNX Runtime's Python API (InferenceSession, SessionOptions, RunOptions,
NodeArg, ModelMetadata, IOBinding and their enums) on kiln's C API, plus kiln's own:
statistics, the observer hook and verify (the served session against the reference one, value
by value)."""
import ctypes as C
import enum
import os
import threading
import warnings

import numpy as np

from . import _lib
from ._errors import KilnError, error, invalid
from . import _cuda
from .tensor import (OrtValue, _Owner, device_kind, dlpack_device, from_dlpack, prepare_array, value_to_python,
                     wrap_array, wrap_memory)

_CODES, _DTYPES, _TensorDesc, _MAX_RANK = _lib.CODES, _lib.DTYPES, _lib.TensorDesc, _lib.MAX_RANK
_tls = threading.local()
_out_types = {}


def _run_buffers(n_in, n_out):
    """run()'s argument arrays for n_in inputs and n_out outputs, with their elements and dims
    fields as objects (ctypes makes a new one on every access otherwise)."""
    descs, outs, odesc = (_TensorDesc * (n_in or 1))(), (C.c_void_p * (n_out or 1))(), (_TensorDesc * (n_out or 1))()
    in_d, out_d = [descs[i] for i in range(n_in)], [odesc[j] for j in range(n_out)]
    return descs, outs, odesc, in_d, [d.dims for d in in_d], out_d, [d.dims for d in out_d]


def _out_buffer(nbytes):
    """A ctypes byte-array type of nbytes over an output's buffer whose instance frees the
    kiln_value (its `_v`) when the last numpy array over it goes (types cached per size)."""
    t = _out_types.get(nbytes)
    if t is None:
        if len(_out_types) > 4096:
            _out_types.clear()
        free = _lib.library().kiln_value_free

        def __del__(buf, free=free):  # bound now: works during interpreter shutdown too
            free(buf._v)  # `_v` is set on every instance; freeing NULL is a no-op
        t = _out_types[nbytes] = type("_KilnBuffer", (C.c_char * nbytes,), {"__del__": __del__})
    return t


class IgnoredOptionWarning(UserWarning):
    """An ONNX Runtime option kiln accepts but does not act on."""


class FallbackWarning(UserWarning):
    """Nodes of a CUDA session that compute on the CPU (the statistics' nodes_fallback)."""


def _ignored(what, why, stacklevel=3):
    warnings.warn(f"kiln: {what} is not supported and is ignored ({why})", IgnoredOptionWarning,
                  stacklevel=stacklevel)


class GraphOptimizationLevel(enum.IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(enum.IntEnum):
    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


# ---- options ----

class SessionOptions:
    """ONNX Runtime's SessionOptions. Mapped to kiln: intra_op_num_threads (threads of one run),
    graph_optimization_level (ORT_DISABLE_ALL = kiln's reference configuration: reference
    kernels, one thread, no memory planning; every other level = kiln's full compilation),
    execution_mode ORT_SEQUENTIAL (what kiln does). kiln's own: plan_cache_size,
    allow_unsupported. Every other ONNX Runtime field is accepted and ignored with an
    IgnoredOptionWarning when set to something other than its default; unknown names raise
    AttributeError, as ONNX Runtime does."""

    _MAPPED = {"intra_op_num_threads": 0, "graph_optimization_level": GraphOptimizationLevel.ORT_ENABLE_ALL,
               "execution_mode": ExecutionMode.ORT_SEQUENTIAL, "plan_cache_size": 16, "allow_unsupported": False}
    _IGNORED = {
        "inter_op_num_threads": (0, "kiln runs the nodes of a run in order, on intra_op threads"),
        "log_verbosity_level": (0, "kiln does not log"),
        "logid": ("", "kiln does not log"),
        "enable_profiling": (False, "no profiler; kiln's observer hook (run_observed) times every node"),
        "profile_file_prefix": ("onnxruntime_profile_", "no profiler"),
        "optimized_model_filepath": ("", "kiln does not write optimized models"),
        "enable_cpu_mem_arena": (True, "kiln always plans each run's memory in one arena"),
        "enable_mem_pattern": (True, "kiln always plans memory per binding of the symbolic dims"),
        "enable_mem_reuse": (True, "kiln always reuses dead buffers"),
        "use_deterministic_compute": (False, "kiln's kernels are deterministic"),
        "execution_order": (ExecutionOrder.DEFAULT, "kiln runs nodes in its planned order"),
        "use_per_session_threads": (True, "every kiln session has its own threads"),
    }

    def __init__(self):
        d = self.__dict__
        for k, v in self._MAPPED.items():
            d[k] = v
        for k, (v, _) in self._IGNORED.items():
            d[k] = v
        d["log_severity_level"] = 2
        d["_config"] = {}

    def __setattr__(self, name, value):
        if name == "log_severity_level":
            if int(value) < 2:  # kiln prints nothing at all, which is what levels 2..4 ask for
                _ignored("SessionOptions.log_severity_level below 2", "kiln does not log", 2)
        elif name == "execution_mode":
            if int(value) != ExecutionMode.ORT_SEQUENTIAL:
                _ignored("SessionOptions.execution_mode ORT_PARALLEL", "kiln runs the nodes of a run in order", 2)
        elif name in self._IGNORED:
            default, why = self._IGNORED[name]
            if name == "inter_op_num_threads" and int(value) <= 1:
                pass  # one inter-op thread is what kiln does (faster-whisper sets it)
            elif value != default:
                _ignored(f"SessionOptions.{name}", why, 2)
        elif name not in self._MAPPED:
            raise AttributeError(f"'SessionOptions' object has no attribute '{name}'")
        self.__dict__[name] = value

    def add_session_config_entry(self, key, value):
        _ignored(f"session config entry '{key}'", "kiln has no session config entries", 2)
        self._config[key] = value

    def get_session_config_entry(self, key):
        if key not in self._config:
            raise invalid(f"session config entry '{key}' was not set")
        return self._config[key]

    def add_free_dimension_override_by_name(self, name, value):
        _ignored(f"free dimension override '{name}'", "kiln binds every symbolic dim at run time", 2)

    def add_free_dimension_override_by_denotation(self, name, value):
        _ignored(f"free dimension override '{name}'", "kiln binds every symbolic dim at run time", 2)

    def register_custom_ops_library(self, path):
        raise error(3, f"custom operator libraries ({path}) are not supported by kiln")

    def add_initializer(self, name, value):
        raise error(3, f"add_initializer('{name}') is not supported by kiln")

    def add_external_initializers(self, names, values):
        raise error(3, "add_external_initializers is not supported by kiln")


class RunOptions:
    """ONNX Runtime's RunOptions. `terminate` set before a run makes it fail at once (a run in
    progress is not interrupted); log fields are accepted (kiln does not log)."""

    def __init__(self):
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.terminate = False
        self.only_execute_path_to_fetches = False
        self._config = {}

    def add_run_config_entry(self, key, value):
        _ignored(f"run config entry '{key}'", "kiln has no run config entries", 2)
        self._config[key] = value

    def get_run_config_entry(self, key):
        if key not in self._config:
            raise invalid(f"run config entry '{key}' was not set")
        return self._config[key]


# ---- model descriptions ----

class NodeArg:
    """A graph input or output: name, type ('tensor(float)', 'seq(tensor(int64))', ...) and
    shape (ints for fixed dims, the symbol's name for a named symbolic dim, None for a dim the
    model leaves unnamed; None instead of a list when the model gives no shape)."""

    __slots__ = ("name", "type", "shape", "dtype")

    def __init__(self, name, type, shape, dtype=None):
        self.name, self.type, self.shape, self.dtype = name, type, shape, dtype

    def __repr__(self):
        return f"NodeArg(name='{self.name}', type='{self.type}', shape={self.shape})"


class ModelMetadata:
    __slots__ = ("producer_name", "producer_version", "graph_name", "domain", "description", "graph_description",
                 "version", "custom_metadata_map")

    def __repr__(self):
        return f"ModelMetadata(producer_name={self.producer_name!r}, graph_name={self.graph_name!r}, " \
               f"version={self.version})"


def _type_string(kind, dtype):
    t = f"tensor({_lib.ORT_TYPES.get(dtype, 'undefined')})"
    return {_lib.VALUE_TENSOR: t, _lib.VALUE_SEQUENCE: f"seq({t})", _lib.VALUE_OPTIONAL: f"optional({t})"}.get(kind, t)


def _node_arg(io):
    shape = None
    if io.rank >= 0:
        shape = []
        for k in range(io.rank):
            d = io.dims[k]
            if d >= 0:
                shape.append(d)
            else:
                n = io.dim_names[k].decode()
                shape.append(None if n.startswith("?") else n)  # "?N": a dim the model leaves unnamed
    return NodeArg(io.name.decode(), _type_string(io.kind, io.dtype), shape, io.dtype)


# ---- providers ----

_PROVIDER_NAMES = {"cpuexecutionprovider": _lib.PROVIDER_CPU, "cpu": _lib.PROVIDER_CPU,
                   "cudaexecutionprovider": _lib.PROVIDER_CUDA, "cuda": _lib.PROVIDER_CUDA}
_ORT_NAMES = {_lib.PROVIDER_CPU: "CPUExecutionProvider", _lib.PROVIDER_CUDA: "CUDAExecutionProvider"}


def get_available_providers():
    """Providers this build of kiln has, by ONNX Runtime's names (CUDA first, as ONNX Runtime
    lists it). Whether a GPU is usable shows when a session is created."""
    lib = _lib.library()
    out = ["CUDAExecutionProvider"] if lib.kiln_provider_available(_lib.PROVIDER_CUDA) else []
    return out + ["CPUExecutionProvider"]


def get_all_providers():
    return ["CUDAExecutionProvider", "CPUExecutionProvider"]


def get_device():
    return "GPU" if "CUDAExecutionProvider" in get_available_providers() else "CPU"


def _resolve_providers(providers, provider_options):
    """[(kind, options dict)] in the caller's order; unknown names are dropped with a warning
    while a known one remains, else an error."""
    if providers is None:
        return [(_lib.PROVIDER_CPU, {})]
    if isinstance(providers, (str, tuple)):
        providers = [providers]
    if provider_options is not None and len(provider_options) != len(providers):
        raise invalid("provider_options must have one entry per provider")
    out, unknown = [], []
    for i, p in enumerate(providers):
        name, opts = (p[0], dict(p[1] or {})) if isinstance(p, tuple) else (p, {})
        if provider_options is not None:
            opts.update(provider_options[i] or {})
        kind = _PROVIDER_NAMES.get(str(name).lower())
        if kind is None:
            unknown.append(str(name))
        else:
            out.append((kind, opts))
    if not out:
        raise invalid(f"no provider kiln has among {list(map(str, providers))}; kiln has "
                      f"CPUExecutionProvider and CUDAExecutionProvider")
    if unknown:
        warnings.warn(f"kiln: providers {unknown} are not kiln's; using {[_ORT_NAMES[k] for k, _ in out]}",
                      UserWarning, stacklevel=4)
    return out


# ---- the session ----

class InferenceSession:
    """ONNX Runtime's InferenceSession on kiln.

        s = kiln.InferenceSession("model.onnx", providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        y, = s.run(None, {"x": x})

    path_or_bytes: a file path or the serialized model. providers: names (ONNX Runtime's or
    kiln's "cpu"/"cuda") or (name, options) tuples, tried in order: when the CUDA provider cannot
    start (no GPU, a build without it) and a CPU provider is listed after it, the session is
    created on the CPU with a warning. A CUDA session runs what the GPU does not support on the
    CPU, node by node. CUDA options: device_id."""

    def __init__(self, path_or_bytes, sess_options=None, providers=None, provider_options=None, **kwargs):
        self._h = None
        self._lib = _lib.library()
        if kwargs:
            _ignored(f"InferenceSession arguments {sorted(kwargs)}", "not kiln options", 2)
        self._model = path_or_bytes
        self._sess_options = sess_options if sess_options is not None else SessionOptions()
        self._create(_resolve_providers(providers, provider_options))

    # creation
    def _options(self, kind, popts):
        so = self._sess_options
        opt = self._lib.kiln_session_options_default()
        opt.provider = kind
        opt.num_threads = int(so.intra_op_num_threads or 0)
        opt.unoptimized = int(so.graph_optimization_level) == GraphOptimizationLevel.ORT_DISABLE_ALL
        opt.allow_unsupported = bool(getattr(so, "allow_unsupported", False))
        opt.plan_cache_size = int(getattr(so, "plan_cache_size", 16))
        for k, v in popts.items():
            if k == "device_id" and kind == _lib.PROVIDER_CUDA:
                opt.device_id = int(v)
            else:
                _ignored(f"provider option '{k}' of {_ORT_NAMES[kind]}", "not a kiln option", 5)
        return opt

    def _open(self, opt):
        lib, h, m = self._lib, C.c_void_p(), self._model
        if isinstance(m, (bytes, bytearray, memoryview)):
            m = bytes(m)
            st = lib.kiln_session_create_from_memory(m, len(m), None, C.byref(opt), C.byref(h))
        elif isinstance(m, (str, os.PathLike)):
            st = lib.kiln_session_create(os.fsencode(m), C.byref(opt), C.byref(h))
        else:
            raise invalid(f"InferenceSession takes a path or the model's bytes, not {type(m).__name__}")
        if st:
            msg = lib.kiln_last_error(h).decode("utf-8", "replace")
            lib.kiln_session_free(h)
            raise error(st, msg)
        return h.value

    def _create(self, chain):
        for i, (kind, popts) in enumerate(chain):
            try:
                self._h = self._open(self._options(kind, popts))
            except KilnError as e:
                later = [k for k, _ in chain[i + 1:]]
                if e.status != 3 or kind != _lib.PROVIDER_CUDA or _lib.PROVIDER_CPU not in later:
                    raise
                warnings.warn(f"kiln: CUDAExecutionProvider unavailable ({e}); using the next provider listed",
                              UserWarning, stacklevel=4)
                continue
            self._kind, self._provider_options = kind, popts
            self._device_id = int(popts.get("device_id", 0)) if kind == _lib.PROVIDER_CUDA else 0
            break
        self._hp = C.c_void_p(self._h)
        lib, h = self._lib, self._h
        if self._kind == _lib.PROVIDER_CUDA:
            self._warn_fallbacks()
        self._inputs = [self._io(lib.kiln_session_input_info, i) for i in range(lib.kiln_session_input_count(h))]
        self._outputs = [self._io(lib.kiln_session_output_info, i) for i in range(lib.kiln_session_output_count(h))]
        self._out_names = [o.name for o in self._outputs]
        self._input_dtypes = {i.name: _DTYPES.get(i.dtype) for i in self._inputs}
        self._name_arrays = {}
        self._default_out = self._names_array(tuple(self._out_names))

    def _warn_fallbacks(self):
        """One warning naming the nodes that compute on the CPU under CUDA (nodes_fallback)."""
        lib, h, names = self._lib, self._h, []
        for i in range(lib.kiln_session_node_count(h)):
            if lib.kiln_session_node_fallback(h, i):
                name, dom, op, prov, why = C.c_char_p(), C.c_char_p(), C.c_char_p(), C.c_char_p(), C.c_char_p()
                lib.kiln_session_node(h, i, C.byref(name), C.byref(dom), C.byref(op), None)
                lib.kiln_session_node_placement(h, i, C.byref(prov), C.byref(why))
                names.append(f"'{name.value.decode()}' ({op.value.decode()}: {(why.value or b'').decode()})")
        if names:
            shown = "; ".join(names[:5]) + (f"; and {len(names) - 5} more" if len(names) > 5 else "")
            warnings.warn(f"kiln: {len(names)} nodes fall back to the CPU in this CUDA session: {shown}",
                          FallbackWarning, stacklevel=4)

    def _io(self, fn, i):
        io = _lib.IoInfo()
        st = fn(self._h, i, C.byref(io))
        if st:
            raise error(st, self._lib.kiln_last_error(self._h).decode("utf-8", "replace"))
        return _node_arg(io)

    def _names_array(self, names):
        """A cached `const char *[]` of names (the run path builds none per call)."""
        arr = self._name_arrays.get(names)
        if arr is None:
            arr = (C.c_char_p * (len(names) or 1))(*[n.encode() for n in names])
            if len(self._name_arrays) < 64:
                self._name_arrays[names] = arr
        return arr

    # ONNX Runtime's accessors
    def get_inputs(self):
        return list(self._inputs)

    def get_outputs(self):
        return list(self._outputs)

    def get_providers(self):
        if self._kind == _lib.PROVIDER_CUDA:  # nodes the GPU does not take run on the CPU
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    def get_provider_options(self):
        opts = {"CPUExecutionProvider": {}}
        if self._kind == _lib.PROVIDER_CUDA:
            opts["CUDAExecutionProvider"] = {k: str(v) for k, v in self._provider_options.items()}
        return opts

    def get_session_options(self):
        return self._sess_options

    def set_providers(self, providers=None, provider_options=None):
        """Recreates the session on other providers (ONNX Runtime's set_providers)."""
        chain = _resolve_providers(providers, provider_options)
        old = self._h
        self._h = None
        self._create(chain)
        self._lib.kiln_session_free(old)

    def get_modelmeta(self):
        lib, h = self._lib, self._h

        def s(field):
            return lib.kiln_session_model_string(h, field).decode("utf-8", "replace")
        m = ModelMetadata()
        m.producer_name, m.producer_version = s(b"producer_name"), s(b"producer_version")
        m.graph_name, m.domain = s(b"graph_name"), s(b"domain")
        m.description, m.graph_description = s(b"doc_string"), s(b"graph_doc_string")
        m.version = lib.kiln_session_model_version(h)
        m.custom_metadata_map = {}
        for i in range(lib.kiln_session_metadata_count(h)):
            k, v = C.c_char_p(), C.c_char_p()
            lib.kiln_session_metadata(h, i, C.byref(k), C.byref(v))
            m.custom_metadata_map[k.value.decode("utf-8", "replace")] = v.value.decode("utf-8", "replace")
        return m

    # running
    def _fail(self, st):
        buf = C.create_string_buffer(1024)  # a copy: other threads may fail on this session meanwhile
        self._lib.kiln_last_error_copy(self._h, buf, len(buf))
        return error(st, buf.value.decode("utf-8", "replace"))

    def _call(self, output_names, input_feed, run_options, observer=None):
        """Runs; returns (kiln_value handles of the outputs, owned by the caller, and their names)."""
        if run_options is not None and run_options.terminate:
            raise error(7, "the run was not started: RunOptions.terminate is set")
        if not isinstance(input_feed, dict):
            raise invalid(f"feeds must be a dict of input name -> array, not {type(input_feed).__name__}")
        lib = self._lib
        if output_names:
            names = output_names if type(output_names) is tuple else tuple(output_names)
            out_names = self._names_array(names)
        else:
            names, out_names = self._out_names, self._default_out
        n_in, n_out = len(input_feed), len(names)
        handles = (C.c_void_p * (n_in or 1))()
        keep, wrapped = [], []
        try:
            i = 0
            for name, v in input_feed.items():
                if not isinstance(v, (OrtValue, np.ndarray)) and dlpack_device(v)[0] != 1:
                    v = from_dlpack(v)  # a GPU tensor (torch, cupy): read in place
                    keep.append(v)
                if isinstance(v, OrtValue):
                    handles[i] = v._v
                else:
                    if not isinstance(v, np.ndarray):  # a list or a scalar: the declared element type
                        v = np.asarray(v, dtype=self._input_dtypes.get(name))
                    h, a = wrap_array(lib, prepare_array(v))
                    wrapped.append(h)
                    keep.append(a)
                    handles[i] = h
                i += 1
            in_names = self._names_array(tuple(input_feed))
            outs = (C.c_void_p * (n_out or 1))()
            if observer is None:
                st = lib.kiln_session_run(self._h, n_in, in_names, handles, n_out, out_names, outs)
            else:
                st = lib.kiln_session_run_observed(self._h, n_in, in_names, handles, n_out, out_names, outs,
                                                   observer, None)
            if st:
                raise self._fail(st)
            return outs, names
        finally:
            for h in wrapped:
                lib.kiln_value_free(h)

    def run(self, output_names, input_feed, run_options=None):
        """ONNX Runtime's run: output_names (None: all) and a dict of input name -> numpy array
        (or OrtValue, or any DLPack producer on a CUDA GPU such as a torch or cupy tensor, read in
        place by a CUDA session); returns a list of numpy arrays over kiln's output buffers (no
        copy), lists for sequence outputs, None for an empty optional.

        Numeric numpy inputs take one C call (kiln_session_run_tensors, which borrows their
        memory and describes the outputs); OrtValue and string inputs go through kiln_values."""
        if run_options is not None and run_options.terminate:
            raise error(7, "the run was not started: RunOptions.terminate is set")
        try:
            values = input_feed.values()
        except AttributeError:
            raise invalid(f"feeds must be a dict of input name -> array, not {type(input_feed).__name__}") from None
        n_in = len(input_feed)
        if output_names:
            names = output_names if type(output_names) is tuple else tuple(output_names)
            out_names = self._name_arrays.get(names) or self._names_array(names)
        else:
            names, out_names = self._out_names, self._default_out
        n_out = len(names)
        # per-thread argument arrays, reused: a run only reads them before it returns
        key = (n_in, n_out)
        bufs = _tls.__dict__.get(key)
        if bufs is None:
            bufs = _tls.__dict__[key] = _run_buffers(n_in, n_out)
        descs, outs, odesc, in_d, in_dims, out_d, out_dims = bufs
        keep = None
        i = 0
        # the common case costs no flag lookups: a byte-swapped dtype is not in _CODES, and
        # from_buffer refuses a non-contiguous array (then copied) as it does a read-only one
        addressof, from_buffer = C.addressof, C.c_char.from_buffer
        for a in values:
            if type(a) is not np.ndarray:
                if isinstance(a, OrtValue) or (hasattr(a, "__dlpack_device__") and dlpack_device(a)[0] != 1):
                    return self._run_values(output_names, input_feed, run_options)
                if not isinstance(a, np.ndarray):  # a list or a scalar: the declared element type
                    a = np.asarray(a, dtype=self._input_dtypes.get(list(input_feed)[i]))
                a = prepare_array(a)
                keep = (keep or []) + [a]  # the copy lives until the run returns
            code = _CODES.get(a.dtype)
            if code is None or a.ndim > _MAX_RANK:
                return self._run_values(output_names, input_feed, run_options)
            try:
                ptr = addressof(from_buffer(a))
            except (TypeError, ValueError):
                if not a.flags.c_contiguous:
                    a = prepare_array(a)
                    keep = (keep or []) + [a]
                ptr = a.ctypes.data  # read-only or empty: numpy's own (slower) accessor
            d = in_d[i]
            d.dtype = code
            d.rank = a.ndim
            in_dims[i][:a.ndim] = a.shape
            d.data = ptr
            d.nbytes = a.nbytes
            i += 1
        lib = self._lib
        in_key = tuple(input_feed)
        in_names = self._name_arrays.get(in_key) or self._names_array(in_key)
        st = lib.fast_run_tensors(self._hp, n_in, in_names, descs, n_out, out_names, outs, odesc)
        if st:
            raise self._fail(st)
        result = []
        for j in range(n_out):
            d = out_d[j]
            dt = _DTYPES.get(d.dtype)
            if dt is None or d.rank < 0:
                result.append(value_to_python(lib, outs[j], _Owner(outs[j], lib)))
            elif d.nbytes:
                buf = _out_buffer(d.nbytes).from_address(d.data)
                buf._v = outs[j]  # the array's base: frees the output value when the array goes
                result.append(np.ndarray(out_dims[j][:d.rank], dt, buf))
            else:
                lib.kiln_value_free(outs[j])
                result.append(np.empty(out_dims[j][:d.rank], dt))
        return result

    def _run_values(self, output_names, input_feed, run_options):
        outs, names = self._call(output_names, input_feed, run_options)
        lib = self._lib
        return [value_to_python(lib, outs[j], _Owner(outs[j], lib)) for j in range(len(names))]

    def run_with_ort_values(self, output_names, input_dict_ort_values, run_options=None):
        """run() taking and returning OrtValues (the outputs own kiln's buffers)."""
        outs, names = self._call(output_names, input_dict_ort_values, run_options)
        lib, dev = self._lib, self._device_id
        return [OrtValue(outs[j], lib, device_id=dev if lib.kiln_value_on_device(outs[j]) else 0)
                for j in range(len(names))]

    def io_binding(self):
        """ONNX Runtime's IOBinding: inputs and outputs bound to host or device memory, run by
        run_with_iobinding."""
        return IOBinding(self)

    def run_with_iobinding(self, iobinding, run_options=None):
        """Runs with the inputs and outputs bound in iobinding (kiln_session_run_with_outputs):
        device inputs are read in place, outputs bound to 'cuda' come back in device memory
        (into the bound buffer when one was given), complete when this returns. Results:
        iobinding.get_outputs()."""
        if run_options is not None and run_options.terminate:
            raise error(7, "the run was not started: RunOptions.terminate is set")
        b = iobinding
        if b._session is not self:
            raise invalid("run_with_iobinding: the IOBinding belongs to another session")
        if b._sync_inputs:
            b.synchronize_inputs()
        lib = self._lib
        in_names, out_names = tuple(b._inputs), tuple(b._outputs)
        n_in, n_out = len(in_names), len(out_names)
        handles = (C.c_void_p * (n_in or 1))(*[v._v for v in b._inputs.values()])
        binds = (_lib.OutputBinding * (n_out or 1))()
        for j, (on_device, storage) in enumerate(b._outputs.values()):
            binds[j].on_device = on_device
            binds[j].storage = storage._v if storage is not None else None
        outs = (C.c_void_p * (n_out or 1))()
        st = lib.kiln_session_run_with_outputs(self._h, n_in, self._names_array(in_names), handles, n_out,
                                               self._names_array(out_names), binds, outs)
        if st:
            raise self._fail(st)
        results, bad = [], None
        for j, (name, (on_device, storage)) in enumerate(b._outputs.items()):
            v = outs[j]
            if storage is not None and lib.kiln_value_nbytes(v) and lib.kiln_value_data(v) != storage.data_ptr():
                bad = bad or (f"output '{name}' ({_type_string(lib.kiln_value_kind_of(v), lib.kiln_value_dtype(v))} "
                              f"{[lib.kiln_value_dims(v)[k] for k in range(lib.kiln_value_rank(v))]}) does not fit "
                              f"the buffer bound to it ({storage.data_type()} {storage.shape()})")
            on_dev = bool(lib.kiln_value_on_device(v))
            results.append(OrtValue(v, lib, keep=storage, device_id=self._device_id if on_dev else 0))
        if bad:
            raise invalid(bad)
        b._results = results

    # kiln's own
    def stats(self):
        """The session's counters (kiln_session_stats): runs, plan cache hits and misses, arena
        bytes, bind/plan and run nanoseconds, GPU placement and copies."""
        st = _lib.Stats()
        self._lib.kiln_session_stats_get(self._h, C.byref(st))
        out = {name: getattr(st, name) for name, _ in _lib.Stats._fields_}
        out["graphs_note"] = out["graphs_note"].decode("utf-8", "replace")
        out["kernels_note"] = out["kernels_note"].decode("utf-8", "replace")
        return out

    def nodes(self):
        """[(name, op_type, provider)] for every node, subgraphs included, in execution order."""
        return _lib.node_list(self._lib, self._h)

    def run_observed(self, output_names, input_feed, observer, run_options=None):
        """run() calling observer(event) after every node of the main graph with a NodeEvent:
        node, node_name, op_type, input_names, output_names, outputs (numpy copies; None for an
        output not produced) and ms. observer returning False stops the run (KilnError); an
        exception it raises stops the run and is re-raised."""
        lib, raised = self._lib, []

        def tap(user, ev):
            try:
                e = ev.contents
                outs = []
                for k in range(e.n_outputs):
                    p = e.outputs[k]
                    outs.append(None if not p else _copy(value_to_python(lib, p, None)))
                event = NodeEvent(e.node, e.node_name.decode(), e.op_type.decode(),
                                  [e.input_names[k].decode() for k in range(e.n_inputs)],
                                  [e.output_names[k].decode() for k in range(e.n_outputs)], outs, e.ms)
                return 0 if observer(event) is not False else 1
            except BaseException as exc:  # noqa: B902 - handed back to the caller after the run
                raised.append(exc)
                return 1
        fn = _lib.OBSERVER_FN(tap)
        try:
            outs, names = self._call(output_names, input_feed, run_options, fn)
        except KilnError:
            if raised:
                raise raised[0]
            raise
        return [value_to_python(lib, outs[j], _Owner(outs[j], lib)) for j in range(len(names))]

    def verify(self, input_feed, rtol=1e-4, atol=1e-5):
        """`kiln verify` from Python: runs input_feed through this session (the path that serves
        requests) and through the reference configuration of the same model, taps every
        intermediate value of both and compares those of the same name. Returns a VerifyReport:
        rows (value, op, shape, max_abs, verdict) in execution order, `ok`, and `first` (the first
        row that differs, or None). Verdicts: 'ok', 'DIFFERENT VALUES', 'SAME VALUES, WRONG
        PLACES' (a layout bug), 'DIFFERENT SHAPE'."""
        ref_opts = SessionOptions()
        ref_opts.graph_optimization_level = GraphOptimizationLevel.ORT_DISABLE_ALL
        ref = InferenceSession(self._model, ref_opts)
        served_taps, ref_taps = [], {}
        self.run_observed(None, input_feed, lambda e: served_taps.extend(zip([e] * e.n_out, e.output_names, e.outputs)))
        ref.run_observed(None, input_feed, lambda e: ref_taps.update(
            {n: v for n, v in zip(e.output_names, e.outputs) if n}))
        rows = []
        for ev, name, got in served_taps:
            if not name or name not in ref_taps or not isinstance(got, np.ndarray):
                continue
            want = ref_taps[name]
            rows.append(_compare(name, ev.op_type, got, want, rtol, atol))
        return VerifyReport(rows)

    def close(self):
        if self._h:
            self._hp = None  # a run after close gets KILN_ERR_INVALID_ARG, not a freed session
            self._lib.kiln_session_free(self._h)
            self._h = None

    def __del__(self):
        if getattr(self, "_h", None):
            self.close()


class IOBinding:
    """ONNX Runtime's IOBinding on kiln (InferenceSession.io_binding()): inputs bound to host or
    device memory, outputs to be handed out on the host or the device, optionally into memory
    the caller allocated. Bindings are kept until cleared; run_with_iobinding fills
    get_outputs()."""

    def __init__(self, session):
        self._session = session
        self._inputs, self._outputs, self._results = {}, {}, []
        self._sync_inputs = False

    def bind_cpu_input(self, name, arr_on_cpu):
        """Binds a numpy array (borrowed when contiguous, kept alive by the binding)."""
        self._inputs[name] = OrtValue.ortvalue_from_numpy(arr_on_cpu)

    def bind_input(self, name, device_type, device_id, element_type, shape, buffer_ptr):
        """Binds memory at buffer_ptr (host or CUDA device memory) as a contiguous tensor of
        element_type (a numpy dtype) and shape; the caller keeps it alive while bound. The device
        is synchronized before the run (the memory's producer may still be writing it)."""
        dev = device_kind(device_type)
        self._inputs[name] = wrap_memory(int(buffer_ptr), element_type, shape, dev, int(device_id))
        self._sync_inputs = self._sync_inputs or dev == "cuda"

    def bind_ortvalue_input(self, name, ortvalue):
        self._inputs[name] = ortvalue

    def synchronize_inputs(self):
        """Waits for all work on the device (raw device pointers bound as inputs are then ready)."""
        _cuda.runtime().synchronize()

    def bind_output(self, name, device_type="cpu", device_id=0, element_type=None, shape=None, buffer_ptr=None):
        """The output goes to device_type's memory: into buffer_ptr when given (with element_type
        and shape; the output must fit it), else into memory kiln allocates. device_id: the
        session's GPU (outputs are made there)."""
        dev = device_kind(device_type)
        storage = None
        if buffer_ptr is not None:
            if element_type is None or shape is None:
                raise invalid(f"bind_output('{name}'): a buffer_ptr needs its element_type and shape")
            storage = wrap_memory(int(buffer_ptr), element_type, shape, dev, int(device_id))
        self._outputs[name] = (dev == "cuda", storage)

    def bind_ortvalue_output(self, name, ortvalue):
        """The output is written into ortvalue's memory (host or device)."""
        self._outputs[name] = (ortvalue.on_device(), ortvalue)

    def synchronize_outputs(self):
        """Nothing to wait for: outputs are complete when run_with_iobinding returns."""

    def get_outputs(self):
        """The outputs of the last run_with_iobinding, as OrtValues in the order bound."""
        return list(self._results)

    def get_outputs_as_ortvaluevector(self):
        return self.get_outputs()

    def copy_outputs_to_cpu(self):
        """The outputs of the last run as numpy arrays (device outputs copied to the host)."""
        return [v.numpy() if v.on_device() else v.numpy().copy() for v in self._results]

    def clear_binding_inputs(self):
        self._inputs = {}
        self._sync_inputs = False

    def clear_binding_outputs(self):
        self._outputs, self._results = {}, []


def _copy(x):
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, list):
        return [_copy(i) for i in x]
    return x


class NodeEvent:
    """What run_observed's observer sees after a node ran (see kiln_node_event in kiln.h)."""
    __slots__ = ("node", "node_name", "op_type", "input_names", "output_names", "outputs", "ms")

    def __init__(self, node, node_name, op_type, input_names, output_names, outputs, ms):
        self.node, self.node_name, self.op_type = node, node_name, op_type
        self.input_names, self.output_names, self.outputs, self.ms = input_names, output_names, outputs, ms

    @property
    def n_out(self):
        return len(self.output_names)


class VerifyReport:
    def __init__(self, rows):
        self.rows = rows
        self.first = next((r for r in rows if r["verdict"] != "ok"), None)
        self.ok = self.first is None

    def __repr__(self):
        bad = sum(r["verdict"] != "ok" for r in self.rows)
        s = f"{len(self.rows)} values compared: {len(self.rows) - bad} agree, {bad} differ"
        if self.first:
            s += f"; first divergence: '{self.first['value']}' ({self.first['op']}): {self.first['verdict']}"
        return s


def _compare(name, op, got, want, rtol, atol):
    row = {"value": name, "op": op, "shape": list(got.shape), "max_abs": 0.0}
    if got.shape != want.shape:
        row["verdict"] = "DIFFERENT SHAPE"
        return row
    if got.dtype.kind in "OUS":
        row["verdict"] = "ok" if np.array_equal(got, want) else "DIFFERENT VALUES"
        return row
    g, w = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    if g.size:
        d = np.abs(g - w)
        row["max_abs"] = float(np.nanmax(d)) if not np.all(np.isnan(d)) else 0.0
    ok = np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
    sorted_ok = np.allclose(np.sort(g), np.sort(w), rtol=rtol, atol=atol, equal_nan=True)
    row["verdict"] = "ok" if ok else "SAME VALUES, WRONG PLACES" if sorted_ok else "DIFFERENT VALUES"
    return row
