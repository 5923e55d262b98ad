"""kiln.genai - LLM generation with onnxruntime-genai's Python surface (Model, GeneratorParams,
Generator, Config) over kiln's kiln_genai_model / kiln_generator C API (include/kiln.h):

    import kiln.genai as og                      # where `import onnxruntime_genai as og` was
    model = og.Model("folder")                   # genai_config.json + model.onnx, compiled once
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=64, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array([[1, 2, 3]], np.int32))
    while not gen.is_done():
        gen.generate_next_token()
        print(gen.get_next_tokens())

Token ids in and out (no tokenizer). What kiln's generator does not do is an error, not a silent
difference: beam search (num_beams > 1), the search options kiln does not implement
(repetition_penalty, length_penalty, no_repeat_ngram_size, min_length, diversity_penalty)
at other than their neutral values, and a second append_tokens on one generator."""
import ctypes as C
import json
import os

import numpy as np

from . import _lib
from ._errors import error, invalid

# search options kiln takes (kiln_generator_params), and those it accepts at their neutral value only
_TAKEN = ("max_length", "batch_size", "do_sample", "top_k", "top_p", "temperature", "random_seed")
_NEUTRAL = {"num_beams": 1, "num_return_sequences": 1, "repetition_penalty": 1.0, "length_penalty": 1.0,
            "no_repeat_ngram_size": 0, "min_length": 0, "diversity_penalty": 0.0, "early_stopping": True,
            "past_present_share_buffer": None, "chunk_size": 0}


class Config:
    """A model folder's configuration with the execution providers to use (onnxruntime-genai's
    og.Config): kiln runs "cpu" and "cuda"."""

    def __init__(self, path):
        self.path = str(path)
        self._provider = None  # None: the CPU (the config's provider options are not read)

    def clear_providers(self):
        self._provider = None

    def append_provider(self, name, *options):
        name = str(name).lower()
        if name not in ("cpu", "cuda"):
            raise invalid(f"provider '{name}': kiln runs 'cpu' and 'cuda'")
        if self._provider is None or self._provider == "cpu":
            self._provider = name

    def set_provider_option(self, provider, key, value):
        """Accepted: kiln's providers take no options here."""


class Model:
    """A model folder (genai_config.json and the model it names) opened and compiled once, for any
    number of Generators; `path` is the folder or a Config."""

    def __init__(self, path):
        cfg = path if isinstance(path, Config) else Config(path)
        self._lib = _lib.library()
        self.path = cfg.path
        provider = cfg._provider or "cpu"
        self.device_type = provider.upper()
        opt = self._lib.kiln_session_options_default()
        opt.provider = _lib.PROVIDER_CUDA if provider == "cuda" else _lib.PROVIDER_CPU
        self._h = C.c_void_p()
        st = self._lib.kiln_genai_model_open(self.path.encode(), C.byref(opt), C.byref(self._h))
        if st:
            msg = self._lib.kiln_genai_model_last_error(self._h).decode()
            self._lib.kiln_genai_model_free(self._h)
            self._h = None
            raise error(st, msg)
        with open(os.path.join(self.path, "genai_config.json")) as f:  # read (and checked) by kiln already
            model = json.load(f).get("model", {})
        self.type = model.get("type", "")
        self.pad_token_id = model.get("pad_token_id", 0)

    def __del__(self):
        if getattr(self, "_h", None):
            self._lib.kiln_genai_model_free(self._h)
            self._h = None


class GeneratorParams:
    """Search options for Generators of a Model (onnxruntime-genai's og.GeneratorParams)."""

    def __init__(self, model):
        self.model = model
        self._search = {"max_length": 0, "batch_size": 1, "do_sample": None, "top_k": None, "top_p": None,
                        "temperature": None, "random_seed": -1}

    def set_search_options(self, **options):
        for k, v in options.items():
            if k in _TAKEN:
                self._search[k] = v
            elif k in _NEUTRAL:
                if _NEUTRAL[k] is not None and v != _NEUTRAL[k]:
                    raise invalid(f"search option {k}={v!r}: kiln's generator does only {k}={_NEUTRAL[k]!r}")
            else:
                raise invalid(f"unknown search option '{k}'")

    def get_search_options(self):
        return {k: v for k, v in self._search.items() if v is not None}


class Generator:
    """One generation over a Model with its own KV cache (onnxruntime-genai's og.Generator)."""

    def __init__(self, model, params):
        self._lib = _lib.library()
        self.model = model
        s = params._search
        p = self._lib.kiln_generator_params_default()
        p.max_length = int(s["max_length"] or 0)
        p.batch_size = int(s["batch_size"] or 1)
        p.do_sample = -1 if s["do_sample"] is None else int(bool(s["do_sample"]))
        p.top_k = -1 if s["top_k"] is None else int(s["top_k"])
        p.top_p = 0.0 if s["top_p"] is None else float(s["top_p"])
        p.temperature = 0.0 if s["temperature"] is None else float(s["temperature"])
        seed = s["random_seed"]  # -1: a seed of its own, as onnxruntime-genai
        p.seed = int(seed) & (2**64 - 1) if seed is not None and seed >= 0 else int.from_bytes(os.urandom(8), "little")
        self.batch = p.batch_size
        self._h = C.c_void_p()
        st = self._lib.kiln_generator_create_from(model._h, C.byref(p), C.byref(self._h))
        if st:
            self._raise(st)

    def _raise(self, st):
        msg = self._lib.kiln_generator_last_error(self._h).decode()
        raise error(st, msg)

    def _check(self, st):
        if st:
            self._raise(st)

    def append_tokens(self, tokens):
        """The prompts, [batch, length] (a 1-D array or list: batch 1): shorter rows right-padded
        with the model's pad_token_id, as onnxruntime-genai takes them; or a list of lists."""
        if isinstance(tokens, (list, tuple)) and tokens and isinstance(tokens[0], (list, tuple, np.ndarray)):
            rows = [np.asarray(r, np.int64).reshape(-1) for r in tokens]
        else:
            a = np.asarray(tokens, np.int64)
            if a.ndim == 1:
                a = a[None]
            if a.ndim != 2:
                raise invalid(f"tokens of rank {a.ndim}: [batch, length] expected")
            rows = []
            for r in a:  # the trailing pads off (one token stays)
                n = len(r)
                while n > 1 and r[n - 1] == self.model.pad_token_id:
                    n -= 1
                rows.append(r[:n])
        lens = np.array([len(r) for r in rows], np.int64)
        toks = np.zeros((len(rows), max(int(lens.max()), 1) if len(rows) else 1), np.int64)
        for i, r in enumerate(rows):
            toks[i, :len(r)] = r
        self._check(self._lib.kiln_generator_append_tokens(self._h, len(rows), lens.ctypes.data_as(C.POINTER(C.c_int64)),
                                                           toks.ctypes.data_as(C.POINTER(C.c_int64))))

    def generate_next_token(self):
        self._check(self._lib.kiln_generator_generate_next(self._h))

    def get_next_tokens(self):
        p, n = C.POINTER(C.c_int64)(), C.c_int()
        self._check(self._lib.kiln_generator_get_next_tokens(self._h, C.byref(p), C.byref(n)))
        return np.ctypeslib.as_array(p, (n.value,)).astype(np.int32)

    def get_logits(self):
        """[batch, 1, vocab] float32: the logits the next choice is made from."""
        p, v = C.POINTER(C.c_float)(), C.c_int64()
        self._check(self._lib.kiln_generator_get_logits(self._h, C.byref(p), C.byref(v)))
        return np.ctypeslib.as_array(p, (self.batch, 1, v.value)).copy()

    def get_sequence(self, index):
        """Row index so far: its prompt, then the generated ids."""
        n = C.c_int64()
        p = self._lib.kiln_generator_get_sequence(self._h, int(index), C.byref(n))
        if not p:
            raise invalid(f"sequence {index} is out of range [0, {self.batch})")
        return np.ctypeslib.as_array(p, (n.value,)).astype(np.int32) if n.value else np.zeros(0, np.int32)

    def is_done(self):
        return bool(self._lib.kiln_generator_is_done(self._h))

    def __del__(self):
        if getattr(self, "_h", None):
            self._lib.kiln_generator_free(self._h)
            self._h = None
