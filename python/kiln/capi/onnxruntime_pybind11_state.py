"""ONNX Runtime's exception module, with kiln's exceptions under its names (all subclass
kiln.KilnError, itself a RuntimeError), and the API classes ONNX Runtime also exports here."""
from .._errors import (EngineError, EPFail, Fail, InvalidArgument, InvalidGraph, InvalidProtobuf,  # noqa: F401
                       KilnError, ModelLoaded, NoModel, NoSuchFile, NotImplemented, RuntimeException)
from ..session import (ExecutionMode, ExecutionOrder, GraphOptimizationLevel, InferenceSession,  # noqa: F401
                       ModelMetadata, NodeArg, RunOptions, SessionOptions)
from ..tensor import OrtValue  # noqa: F401
