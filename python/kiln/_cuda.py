"""_cuda.py - the few CUDA runtime calls the Python package makes itself (device memory of
OrtValues made from numpy, copies to and from it, stream hand-offs of DLPack imports), through
ctypes on a libcudart loaded at run time.

libkiln carries its own CUDA runtime (linked statically); the one loaded here shares the
device's primary context with it, so pointers pass freely between them (and torch and cupy).
The library looked for, in order: $KILN_CUDART; a libcudart already mapped into the process
(torch's or cupy's); libcudart.so.13 / .12 / .11.0 / libcudart.so on the loader's path; the
same under pip's nvidia packages."""
import ctypes as C
import glob
import os
import sys
import threading

from ._errors import error

# cudaMemcpyKind
HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE, DEFAULT = 1, 2, 3, 4
_NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so")


def _mapped():
    """Paths of libcudart libraries this process has mapped already."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcudart" in line}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.isabs(p))


def _pip_nvidia():
    out = []
    for base in sys.path:
        for pattern in ("nvidia/cuda_runtime/lib/libcudart.so*", "nvidia/cu*/lib/libcudart.so*"):
            out += sorted(glob.glob(os.path.join(base, pattern)), reverse=True)
    return out


class Runtime:
    def __init__(self):
        tried, lib = [], None
        env = os.environ.get("KILN_CUDART")
        for cand in ([env] if env else []) + _mapped() + list(_NAMES) + _pip_nvidia():
            try:
                lib = C.CDLL(cand)
                break
            except OSError as e:
                tried.append(f"{cand} ({e})")
        if lib is None:
            raise error(3, "GPU tensors from Python need the CUDA runtime (libcudart), which was not found; "
                           "set KILN_CUDART to its path. Tried: " + "; ".join(tried))
        P, I, S = C.c_void_p, C.c_int, C.c_size_t
        for name, res, args in (("cudaMalloc", I, [C.POINTER(P), S]), ("cudaFree", I, [P]),
                                ("cudaMemcpy", I, [P, P, S, I]), ("cudaMemset", I, [P, I, S]),
                                ("cudaSetDevice", I, [I]), ("cudaGetDevice", I, [C.POINTER(I)]),
                                ("cudaStreamSynchronize", I, [P]), ("cudaDeviceSynchronize", I, []),
                                ("cudaGetErrorString", C.c_char_p, [I])):
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
        self.lib = lib
        self.path = getattr(lib, "_name", "")

    def _check(self, e, what):
        if e:
            raise error(7, f"CUDA: {what} failed: {self.lib.cudaGetErrorString(e).decode()} ({e})")

    def _on(self, device_id):
        """Makes device_id current for this thread; returns the one that was."""
        cur = C.c_int()
        self._check(self.lib.cudaGetDevice(C.byref(cur)), "cudaGetDevice")
        if cur.value != device_id:
            self._check(self.lib.cudaSetDevice(device_id), f"selecting device {device_id}")
        return cur.value

    def malloc(self, nbytes, device_id):
        p = C.c_void_p()
        prev = self._on(device_id)
        try:
            self._check(self.lib.cudaMalloc(C.byref(p), max(int(nbytes), 1)), f"allocating {nbytes} bytes")
        finally:
            if prev != device_id:
                self.lib.cudaSetDevice(prev)
        return p.value

    def free(self, ptr):
        self.lib.cudaFree(ptr)

    def memset(self, ptr, nbytes):
        if nbytes:
            self._check(self.lib.cudaMemset(ptr, 0, nbytes), "cudaMemset")
            self.sync_legacy()

    def copy(self, dst, src, nbytes):
        """Copies nbytes between any two of host and device memory and waits for it (a copy from
        pageable memory may still be in flight when cudaMemcpy returns)."""
        if nbytes:
            self._check(self.lib.cudaMemcpy(dst, src, nbytes, DEFAULT), "cudaMemcpy")
            self.sync_legacy()

    def sync_legacy(self):
        """Waits for the legacy default stream (the context's, shared with every runtime in the
        process): a producer asked to hand its tensor over on stream 1 has made it wait there."""
        self._check(self.lib.cudaStreamSynchronize(None), "cudaStreamSynchronize")

    def synchronize(self):
        self._check(self.lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")


_rt = None
_lock = threading.Lock()


def runtime():
    """The process's Runtime (libcudart loaded on first use)."""
    global _rt
    if _rt is None:
        with _lock:
            if _rt is None:
                _rt = Runtime()
    return _rt


class DeviceBuffer:
    """Device memory the package allocated (cudaMalloc), freed when the object goes."""
    __slots__ = ("ptr", "nbytes", "device_id", "rt")

    def __init__(self, nbytes, device_id):
        self.rt = runtime()
        self.ptr, self.nbytes, self.device_id = self.rt.malloc(nbytes, device_id), int(nbytes), int(device_id)

    def __del__(self):
        if self.ptr:
            self.rt.free(self.ptr)
            self.ptr = None
