"""Shared fixtures: tiny random models for unit tests, the real default model for losslessness tests."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch


def _threads_per_worker() -> int:
    """The CPU's cores shared among pytest-xdist's workers (``make test`` runs two): two processes of two torch
    threads each on two cores would spin against each other."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def pytest_configure(config):
    threads = _threads_per_worker()
    torch.set_num_threads(threads)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the CLI runs in subprocesses keep to their worker's share too
        os.environ["OMP_NUM_THREADS"] = str(threads)


def tiny_causal_lm(arch: str = "llama", vocab: int = 64, hidden: int = 32, layers: int = 2, seed: int = 0,
                   dtype=torch.float32):
    """A randomly initialised stock transformers model (Llama or Qwen2 or others by config class)."""
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Qwen2Config

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  bos_token_id=0, eos_token_id=1, pad_token_id=1)
    if arch == "llama":
        cfg = LlamaConfig(**common)
    elif arch == "qwen2":
        cfg = Qwen2Config(**common)
    elif arch == "gemma3":
        cfg = Gemma3TextConfig(**common, head_dim=8, sliding_window=6, query_pre_attn_scalar=8)
    else:
        raise ValueError(arch)
    cfg._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(cfg).to(dtype).eval()
    # random init is nearly uniform; sharpen so that distributions are far from uniform and tests bite
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    model.requires_grad_(False)
    return model


@pytest.fixture(scope="session")
def default_fp32():
    """The real default model in float32 (lossless claims are made in float32)."""
    from drafttree.models import load_model

    torch.set_num_threads(_threads_per_worker())
    return load_model("smollm2-135m-instruct", dtype="float32", device="cpu", show_progress=False)


# the server tests' model, server and greedy reference (test_server.py, test_server_openai.py; their client:
# server_client.py). Module-scoped: each of those files gets its own server; a test file that defines its own ``sm``
# or ``server`` (test_server_load.py, test_api_cli.py, ...) keeps its own.
@pytest.fixture(scope="module")
def sm(default_fp32):
    from drafttree import SpeculativeModel

    return SpeculativeModel(default_fp32, method="lookup")


@pytest.fixture(scope="module")
def server(sm):
    from drafttree.server import ServerThread, create_app

    srv = ServerThread(create_app(sm, max_body_bytes=256 * 1024)).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def expected(sm):
    from server_client import MESSAGES

    return sm.generate(MESSAGES, max_new_tokens=12)


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit, pooling cells whose expected count is below ``min_expected``."""
    from scipy.stats import chi2

    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    if (counts[probs <= 0] > 0).any():  # an outcome the target can never produce was sampled
        return 0.0
    n = counts.sum()
    exp = probs * n
    order = np.argsort(exp)
    pooled_c, pooled_e = [], []
    acc_c = acc_e = 0.0
    for i in order:
        acc_c += counts[i]
        acc_e += exp[i]
        if acc_e >= min_expected:
            pooled_c.append(acc_c)
            pooled_e.append(acc_e)
            acc_c = acc_e = 0.0
    if acc_e > 0 or acc_c > 0:
        if pooled_e:
            pooled_c[-1] += acc_c
            pooled_e[-1] += acc_e
        else:
            pooled_c.append(acc_c)
            pooled_e.append(acc_e)
    c, e = np.array(pooled_c), np.array(pooled_e)
    if len(c) < 2:
        return 1.0
    stat = float(((c - e) ** 2 / np.maximum(e, 1e-12)).sum())
    return float(chi2.sf(stat, len(c) - 1))


def reference_warp(logits: np.ndarray, s) -> np.ndarray:
    """Temperature, min-p, top-k, top-p (a Sampling ``s``): written here without drafttree's code (rows of a 2-D
    array), for the reference distributions of the sampling tests."""
    z = logits.astype(np.float64) / s.temperature
    if getattr(s, "min_p", 0.0):  # tokens at least min_p times as likely as the likeliest (before top-k, as vLLM)
        p = np.exp(z - z.max(-1, keepdims=True))
        z = np.where(p >= s.min_p * p.max(-1, keepdims=True), z, -np.inf)
    if s.top_k:
        kth = np.sort(z, axis=-1)[:, -s.top_k][:, None]
        z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if s.top_p < 1.0:
        out = np.zeros_like(p)
        for r in range(p.shape[0]):
            order = np.argsort(-p[r], kind="stable")
            cum, keep = 0.0, []
            for j in order:
                keep.append(j)
                cum += p[r, j]
                if cum >= s.top_p:
                    break
            out[r, keep] = p[r, keep] / p[r, keep].sum()
        p = out
    return p
