"""genai_ctypes.py - the generation tests' binding of kiln's kiln_genai_model_* and kiln_generator_*
C API (include/kiln.h) over the package's declarations of it (kiln._lib); the library is $KILN_LIB."""
import ctypes
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from kiln import _lib as _kl  # noqa: E402

Stats = _kl.Stats
lib = _kl.library()


class KilnError(RuntimeError):
    pass


class Model:
    """A folder opened and compiled once (kiln_genai_model) for Generator(model=...)."""

    def __init__(self, folder, provider=0):
        o = lib.kiln_session_options_default()
        o.provider = provider
        self.h = ctypes.c_void_p()
        st = lib.kiln_genai_model_open(folder.encode(), ctypes.byref(o), ctypes.byref(self.h))
        if st:
            msg = lib.kiln_genai_model_last_error(self.h).decode()
            self.close()
            raise KilnError(msg)

    def close(self):
        if self.h:
            lib.kiln_genai_model_free(self.h)
            self.h = None

    def __del__(self):
        self.close()


class Generator:
    def __init__(self, folder=None, batch=1, max_length=0, do_sample=0, temperature=0.0, top_k=-1, top_p=0.0, seed=0,
                 provider=0, model=None):
        """provider: 0 the CPU, 1 CUDA (kiln_provider_kind). With model (a Model), a generator of it
        (kiln_generator_create_from: the model's provider); otherwise of folder alone."""
        p = lib.kiln_generator_params_default()
        p.batch_size, p.max_length, p.do_sample, p.provider = batch, max_length, do_sample, provider
        p.temperature, p.top_k, p.top_p, p.seed = temperature, top_k, top_p, seed
        self.h = ctypes.c_void_p()
        self.batch = batch
        if model is not None:
            st = lib.kiln_generator_create_from(model.h, ctypes.byref(p), ctypes.byref(self.h))
        else:
            st = lib.kiln_generator_create(folder.encode(), ctypes.byref(p), ctypes.byref(self.h))
        if st:
            msg = lib.kiln_generator_last_error(self.h).decode()
            lib.kiln_generator_free(self.h)
            self.h = None
            raise KilnError(msg)

    def _check(self, st):
        if st:
            raise KilnError(lib.kiln_generator_last_error(self.h).decode())

    def append_tokens(self, prompts):
        lens = np.array([len(p) for p in prompts], np.int64)
        toks = np.zeros((len(prompts), lens.max()), np.int64)
        for i, p in enumerate(prompts):
            toks[i, :len(p)] = p
        self._check(lib.kiln_generator_append_tokens(self.h, len(prompts), lens.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)),
                                                     toks.ctypes.data_as(ctypes.POINTER(ctypes.c_int64))))

    def generate_next(self):
        self._check(lib.kiln_generator_generate_next(self.h))

    def next_tokens(self):
        p, n = ctypes.POINTER(ctypes.c_int64)(), ctypes.c_int()
        self._check(lib.kiln_generator_get_next_tokens(self.h, ctypes.byref(p), ctypes.byref(n)))
        return np.ctypeslib.as_array(p, (n.value,)).copy()

    def logits(self):
        p, v = ctypes.POINTER(ctypes.c_float)(), ctypes.c_int64()
        self._check(lib.kiln_generator_get_logits(self.h, ctypes.byref(p), ctypes.byref(v)))
        return np.ctypeslib.as_array(p, (self.batch, v.value)).copy()

    def is_done(self):
        return lib.kiln_generator_is_done(self.h)

    def stats(self):
        s = Stats()
        self._check(lib.kiln_generator_session_stats(self.h, ctypes.byref(s)))
        return s

    def close(self):
        if self.h:
            lib.kiln_generator_free(self.h)
            self.h = None

    def __del__(self):
        self.close()
