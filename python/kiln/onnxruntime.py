"""kiln.onnxruntime - ONNX Runtime's module surface on kiln: `import kiln.onnxruntime as ort`
(or kiln.install_as_onnxruntime() to make `import onnxruntime` give this module)."""
from . import capi  # noqa: F401
from ._errors import (EngineError, EPFail, Fail, InvalidArgument, InvalidGraph, InvalidProtobuf,  # noqa: F401
                      KilnError, ModelLoaded, NoModel, NoSuchFile, NotImplemented, RuntimeException)
from .session import (ExecutionMode, ExecutionOrder, GraphOptimizationLevel, InferenceSession, IOBinding,  # noqa: F401
                      ModelMetadata, NodeArg, RunOptions, SessionOptions, get_all_providers,
                      get_available_providers, get_device)
from .tensor import OrtValue  # noqa: F401


def _version():
    from . import __version__
    return __version__


__version__ = _version()


def set_default_logger_severity(level):
    """Accepted: kiln does not log."""


def set_default_logger_verbosity(level):
    """Accepted: kiln does not log."""


def set_seed(seed):
    """Accepted and ignored with a warning: kiln's random operators take their seeds from the model."""
    from .session import _ignored
    _ignored("onnxruntime.set_seed", "random operators take their seeds from the model", 2)
