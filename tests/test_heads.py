"""EAGLE head: architecture from the target's own layer class, checkpoint format, mismatch errors,
lossless decoding with any head (even an untrained one) on two architectures."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from drafttree.accept import Sampling
from drafttree.decode import DecodeStats, decode
from drafttree.drafters.base import Drafter
from drafttree.drafters.eagle import make_eagle_drafter
from drafttree.errors import DraftTreeError
from drafttree.heads import EagleHead, load_head
from drafttree.models import LoadedModel
from drafttree.target import TargetModel
from tests.conftest import tiny_causal_lm


def _lm(arch="llama", vocab=64, hidden=32, seed=0) -> LoadedModel:
    return LoadedModel(tiny_causal_lm(arch, vocab=vocab, hidden=hidden, seed=seed), None, f"tiny-{arch}", "")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_head_uses_target_layer_class_and_eagle1_keys(arch, tmp_path):
    lm = _lm(arch)
    head = EagleHead(lm.model, num_layers=1, draft_vocab=torch.arange(5, 40), target_name=lm.name)
    assert type(head.layers[0]) is type(lm.model.base_model.layers[0])
    assert isinstance(head.layers[0].input_layernorm, torch.nn.Identity)
    head.save(tmp_path / "h")
    keys = set(load_file(str(tmp_path / "h" / "model.safetensors")))
    assert {"fc.weight", "fc.bias", "d2t", "t2d"} <= keys
    assert all(k.startswith(("fc.", "layers.0.", "d2t", "t2d")) for k in keys), keys
    assert not any("embed" in k or "lm_head" in k for k in keys), "embeddings/LM head are the target's"
    assert not any("input_layernorm" in k for k in keys)
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    assert cfg["drafttree"]["target"]["name"] == lm.name
    assert cfg["drafttree"]["target"]["vocab_size"] == 64 and cfg["hidden_size"] == 32
    loaded = load_head(tmp_path / "h", lm)
    assert torch.equal(loaded.draft_vocab, torch.arange(5, 40))
    for k, v in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k].float(), v.to(torch.bfloat16).float())


def test_head_with_its_own_mlp_width_loads(tmp_path):
    """The head's intermediate size comes from its config.json, not the target's, before its layers are built."""
    lm = _lm("llama")
    head = EagleHead(lm.model, intermediate_size=24)
    assert head.layers[0].mlp.up_proj.weight.shape[0] == 24 != lm.model.config.intermediate_size
    head.save(tmp_path / "h", dtype=None)
    loaded = load_head(tmp_path / "h", lm)
    assert loaded.layers[0].mlp.up_proj.weight.shape[0] == 24
    torch.testing.assert_close(loaded.fc.weight, head.fc.weight)


def test_head_mismatch_is_a_clear_error(tmp_path):
    head = EagleHead(_lm("llama", vocab=64, hidden=32).model, target_name="tiny-a")
    head.save(tmp_path / "h")
    with pytest.raises(DraftTreeError, match="vocab size"):
        load_head(tmp_path / "h", _lm("llama", vocab=80, hidden=32))
    with pytest.raises(DraftTreeError, match="hidden size"):
        load_head(tmp_path / "h", _lm("llama", vocab=64, hidden=48))
    with pytest.raises(DraftTreeError, match="architecture"):
        load_head(tmp_path / "h", _lm("qwen2", vocab=64, hidden=32))
    with pytest.raises(DraftTreeError, match="not found"):
        load_head(tmp_path / "nope", _lm())
    (tmp_path / "bad").mkdir()
    with pytest.raises(DraftTreeError, match="not a head directory"):
        load_head(tmp_path / "bad", _lm())
    (tmp_path / "h" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(DraftTreeError, match="unreadable"):
        load_head(tmp_path / "h", _lm())


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])  # gemma3: a rotary table per layer type
@pytest.mark.parametrize("method", ["eagle-chain", "eagle1", "eagle2"])
def test_any_head_is_lossless_greedy(arch, method):
    lm = _lm(arch, seed=3)
    tm = TargetModel(lm.model)
    prompt = torch.tensor([3, 4, 5, 6, 7, 8, 3, 4, 5])
    ref = [t for s in decode(tm, Drafter(), prompt, Sampling(), 48) for t in s]
    head = EagleHead(lm.model, draft_vocab=torch.arange(2, 60))
    opts = {"total_tokens": 12} if method == "eagle2" else {}
    d = make_eagle_drafter(method, lm, head, **opts)
    st = DecodeStats()
    out = [t for s in decode(tm, d, prompt, Sampling(), 48, stats=st) for t in s]
    assert out == ref
    assert max(st.tree_sizes) > 1


def test_head_cache_is_not_polluted_by_branches():
    """After a round, the head's committed cache equals a fresh encoding of the accepted pairs."""
    lm = _lm("llama", seed=5)
    head = EagleHead(lm.model)
    tm = TargetModel(lm.model)
    prompt = torch.tensor([3, 4, 5, 6, 7])
    d = make_eagle_drafter("eagle2", lm, head, depth=3, top_k=3, total_tokens=8)
    out = [t for s in decode(tm, d, prompt, Sampling(), 12) for t in s]
    # rebuild from scratch: target features of the whole text, head encoding of every pair
    ids = prompt.tolist() + out
    with torch.no_grad():
        feats = lm.model.base_model(torch.tensor([ids[:-1]])).last_hidden_state[0]
    fresh = make_eagle_drafter("eagle2", lm, head, depth=3, top_k=3, total_tokens=8)
    fresh.state.encode(feats, ids[1:], 0)
    a, b = d.state, fresh.state
    a.flush()  # committed pairs are encoded lazily, when the head drafts next
    b.flush()
    assert a.committed == b.committed == len(ids) - 1
    torch.testing.assert_close(a.root_feat, b.root_feat, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(a.cache.layers[0].keys[:, :, : a.committed], b.cache.layers[0].keys, atol=1e-4,
                               rtol=1e-4)


@pytest.mark.parametrize("fmt", ["sglang", "vllm", "eagle"])
def test_export_for_serving_engines(fmt, tmp_path):
    from drafttree.heads.export import export_head

    lm = _lm("llama")
    EagleHead(lm.model, draft_vocab=torch.arange(5, 40), target_name="tiny").save(tmp_path / "h")
    res = export_head(tmp_path / "h", tmp_path / fmt, fmt)
    keys = set(load_file(str(tmp_path / fmt / "model.safetensors")))
    assert "fc.weight" in keys and "d2t" not in keys and "t2d" not in keys
    assert any(k.startswith("layers.0.self_attn.q_proj") for k in keys)
    cfg = json.loads((tmp_path / fmt / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 1 and cfg["model_type"] == "llama" and "drafttree" not in cfg
    assert cfg["architectures"] == (["LlamaForCausalLMEagle"] if fmt == "sglang" else ["LlamaForCausalLM"])
    assert bool(res["warnings"]) == (fmt == "vllm")  # vLLM drops fc.bias
    no_bias = EagleHead(lm.model, fc_bias=False)
    no_bias.save(tmp_path / "nb")
    assert not export_head(tmp_path / "nb", tmp_path / "nb-out", "vllm")["warnings"]
    with pytest.raises(DraftTreeError, match="format"):
        export_head(tmp_path / "h", tmp_path / "x", "onnx")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_committed_pairs_encode_as_a_prefill(dtype):
    """A long backlog of committed pairs (a prompt's) attends as a prefill (causal without an n x n mask; the prompt
    kernel where it runs, a cached prefix or not): the head's state equals that of the same pairs encoded 100 at a time
    through the masked path, up to the dtype's rounding."""
    from drafttree.drafters.eagle import EagleState

    lm = LoadedModel(tiny_causal_lm("llama", hidden=128, seed=3, dtype=dtype), None, "tiny-llama", "")
    head = EagleHead(lm.model).to(dtype)
    g = torch.Generator().manual_seed(0)
    n1, n2 = 300, 200  # both above attention.MAX_FOLDED_QUERY: the first into an empty cache, the second after it
    feats = torch.randn(n1 + n2, 128, generator=g).to(dtype)
    ids = torch.randint(0, 64, (n1 + n2,), generator=g).tolist()
    whole, parts = EagleState(head), EagleState(head)
    for a, b in ((0, n1), (n1, n1 + n2)):
        whole.encode(feats[a:b], ids[a:b], a)
        whole.flush()
    for a in range(0, n1 + n2, 100):
        parts.encode(feats[a:a + 100], ids[a:a + 100], a)
        parts.flush()
    assert whole.committed == parts.committed == n1 + n2
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(whole.root_feat.float(), parts.root_feat.float(), **tol)
    for lw, lp in zip(whole.cache.layers, parts.cache.layers):
        torch.testing.assert_close(lw.values[:, :, : n1 + n2].float(), lp.values[:, :, : n1 + n2].float(), **tol)
    # every position's output, not just the last (a dropped causal mask leaks later pairs into earlier positions):
    # the prefill path against the masked one, into an empty cache and after a cached prefix
    from drafttree.cache import GrowingCache

    with torch.inference_mode():
        prefill, masked = EagleState(head), EagleState(head)
        for a, b in ((0, n1), (n1, n1 + n2)):
            n = b - a
            args = (feats[a:b], torch.tensor(ids[a:b]), torch.arange(a, b), torch.ones(n, n, dtype=torch.bool).tril())
            outs = []
            for state, committed in ((prefill, True), (masked, False)):
                state.cache = state.cache or GrowingCache()
                outs.append(state._run(*args, committed=committed))
                state.committed = b
            torch.testing.assert_close(outs[0].float(), outs[1].float(), **tol)
