"""_errors.py - kiln's failures as Python exceptions: KilnError (a RuntimeError carrying the C
API's status and kiln's message) and, under ONNX Runtime's names, one subclass per kind of
failure, so `except InvalidArgument` written for ONNX Runtime catches kiln's."""
from . import _lib


class KilnError(RuntimeError):
    """A kiln failure. `status` is the kiln_status code, `status_name` its name
    ("KILN_ERR_SHAPE"); str(e) is kiln's message (which file, node, op, input, dims)."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.status_name = _lib.STATUS_NAMES.get(status, f"status {status}")


# ONNX Runtime's exception names (onnxruntime.capi.onnxruntime_pybind11_state)
class Fail(KilnError):
    pass


class InvalidArgument(KilnError):
    pass


class NoSuchFile(KilnError):
    pass


class NoModel(KilnError):
    pass


class EngineError(KilnError):
    pass


class RuntimeException(KilnError):
    pass


class InvalidProtobuf(KilnError):
    pass


class ModelLoaded(KilnError):
    pass


class NotImplemented(KilnError):  # noqa: A001 - ONNX Runtime's name
    pass


class InvalidGraph(KilnError):
    pass


class EPFail(KilnError):
    pass


# kiln_status -> the class raised
_BY_STATUS = {
    1: InvalidArgument,   # KILN_ERR_INVALID_ARG
    2: InvalidGraph,      # KILN_ERR_MODEL
    3: NotImplemented,    # KILN_ERR_UNSUPPORTED
    4: InvalidArgument,   # KILN_ERR_SHAPE (ONNX Runtime: "Got invalid dimensions for input")
    5: RuntimeException,  # KILN_ERR_NOMEM
    6: NoSuchFile,        # KILN_ERR_IO
    7: RuntimeException,  # KILN_ERR_RUNTIME
}


def error(status, message):
    """The exception for a kiln_status and message."""
    return _BY_STATUS.get(status, Fail)(status, message)


def invalid(message):
    """A caller's mistake found before calling the C API (KILN_ERR_INVALID_ARG)."""
    return InvalidArgument(1, message)
