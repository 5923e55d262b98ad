"""kiln.genai (onnxruntime-genai's Python surface on kiln's generator) against onnxruntime-genai
on one generated builder-style folder: greedy tokens and logits, batch 2 with right-padded
prompts, sequences, seeded sampling, several generators of one model, and the errors."""
import os
import subprocess
import sys

import numpy as np
import pytest

og = pytest.importorskip("onnxruntime_genai")
import kiln  # noqa: E402
import kiln.genai as kg  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPTS = [[5, 17, 33, 100, 7], [9, 44]]
STEPS = 24


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("llm") / "gqa")
    subprocess.check_call([sys.executable, os.path.join(HERE, "..", "models", "make_llm.py"), d, "--form", "gqa",
                           "--accuracy-level", "1"], stdout=subprocess.DEVNULL)
    return d


def run(mod, model, prompts, steps, **search):
    """Tokens [batch, steps] and the logits of each step of module mod (og or kiln.genai)."""
    p = mod.GeneratorParams(model)
    p.set_search_options(max_length=max(map(len, prompts)) + steps, batch_size=len(prompts), **search)
    g = mod.Generator(model, p)
    width = max(map(len, prompts))
    g.append_tokens(np.array([r + [0] * (width - len(r)) for r in prompts], np.int32))  # pad_token_id 0
    toks, logits = [], []
    while not g.is_done():
        g.generate_next_token()
        # (onnxruntime-genai 0.18's get_logits after the last token makes is_done false: its
        # logits are read through get_output)
        out = g.get_output("logits") if mod is og else g.get_logits()
        logits.append(np.array(out, np.float32)[:, -1])
        toks.append(np.array(g.get_next_tokens()))
    return np.array(toks).T, np.array(logits), g


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS])
def test_greedy_like_onnxruntime_genai(folder, prompts):
    want, want_logits, _ = run(og, og.Model(folder), prompts, STEPS, do_sample=False)
    got, got_logits, g = run(kg, kg.Model(folder), prompts, STEPS, do_sample=False)
    assert got.shape == (len(prompts), STEPS)
    assert (got == want).all()
    width = max(map(len, prompts))
    for b, p in enumerate(prompts):  # a padded row's first logits: onnxruntime-genai's output is its last (pad) position's
        first = 0 if len(p) == width else 1
        assert np.abs(got_logits[first:, b] - want_logits[first:, b]).max() < 2e-3
    for b, p in enumerate(prompts):  # kiln's sequences hold the prompt without its pads
        assert g.get_sequence(b).tolist() == p + got[b].tolist()


def test_model_serves_many_generators(folder):
    m = kg.Model(folder)
    assert m.device_type == "CPU" and m.type == "llama"
    first = run(kg, m, PROMPTS, 8, do_sample=False)[0]
    for _ in range(3):
        assert (run(kg, m, PROMPTS, 8, do_sample=False)[0] == first).all()


def test_seeded_sampling(folder):
    m = kg.Model(folder)
    a = run(kg, m, PROMPTS[:1], 12, do_sample=True, top_k=50, top_p=0.9, temperature=0.8, random_seed=7)[0]
    b = run(kg, m, PROMPTS[:1], 12, do_sample=True, top_k=50, top_p=0.9, temperature=0.8, random_seed=7)[0]
    assert (a == b).all()


def test_errors(folder):
    m = kg.Model(folder)
    p = kg.GeneratorParams(m)
    with pytest.raises(kiln.InvalidArgument, match="num_beams"):
        p.set_search_options(num_beams=2)
    with pytest.raises(Exception, match="unknown search option"):
        p.set_search_options(beams=2)
    p.set_search_options(max_length=12, num_beams=1, repetition_penalty=1.0)
    g = kg.Generator(m, p)
    g.append_tokens([[5, 6, 7]])
    with pytest.raises(Exception, match="[Oo]nce|already"):
        g.append_tokens([[8]])
    while not g.is_done():
        g.generate_next_token()
    with pytest.raises(Exception, match="max_length"):
        g.generate_next_token()
    with pytest.raises(Exception, match="genai_config.json"):
        kg.Model(os.path.join(folder, "nonexistent"))
    c = kg.Config(folder)
    with pytest.raises(Exception, match="'dml'"):
        c.append_provider("dml")
