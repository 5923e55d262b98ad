"""kiln - an ONNX inference runtime: the Python package.

    import kiln
    s = kiln.InferenceSession("model.onnx")            # ONNX Runtime's API
    y, = s.run(None, {"x": x})

    import kiln.onnxruntime as ort                     # a drop-in onnxruntime module
    kiln.install_as_onnxruntime()                      # `import onnxruntime` gives kiln from now on

    import kiln.genai as og                            # onnxruntime-genai's generation API

The package binds libkiln (include/kiln.h) with ctypes: one wheel serves every Python 3. Session,
DeviceArray and PROVIDERS are the lower-level binding the repository's tests use."""
import sys as _sys

from . import _lib
from ._errors import (EngineError, EPFail, Fail, InvalidArgument, InvalidGraph, InvalidProtobuf,  # noqa: F401
                      KilnError, ModelLoaded, NoModel, NoSuchFile, NotImplemented, RuntimeException)
from ._legacy import _CODES, _DTYPES, PROVIDERS, DeviceArray, Session  # noqa: F401
from ._lib import library  # noqa: F401
from .session import (ExecutionMode, ExecutionOrder, FallbackWarning, GraphOptimizationLevel,  # noqa: F401
                      IgnoredOptionWarning, InferenceSession, IOBinding, ModelMetadata, NodeArg, NodeEvent,
                      RunOptions, SessionOptions, VerifyReport, get_all_providers, get_available_providers,
                      get_device)
from .tensor import OrtValue, from_dlpack  # noqa: F401


def _version():
    try:
        return _lib.library().kiln_version().decode()
    except OSError:  # no libkiln found: the package still imports and says so on first use
        return "unknown"


__version__ = _version()


def install_as_onnxruntime():
    """Makes `import onnxruntime` (and onnxruntime.capi.onnxruntime_pybind11_state) resolve to
    kiln in this process, so code written for ONNX Runtime runs on kiln unchanged. Call it
    before that code imports onnxruntime; a module that already imported the real one keeps it.
    Returns the module installed."""
    from . import capi, onnxruntime
    from .capi import onnxruntime_pybind11_state
    _sys.modules["onnxruntime"] = onnxruntime
    _sys.modules["onnxruntime.capi"] = capi
    _sys.modules["onnxruntime.capi.onnxruntime_pybind11_state"] = onnxruntime_pybind11_state
    return onnxruntime
