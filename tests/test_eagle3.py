"""EAGLE-3 heads: published layouts load as they are, survive load -> export -> load, and decode losslessly."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from drafttree.accept import Sampling
from drafttree.decode import decode
from drafttree.drafters import Drafter, make_drafter
from drafttree.errors import DraftTreeError
from drafttree.heads import Eagle3Head, load_head
from drafttree.heads.export import export_head
from drafttree.models import LoadedModel
from drafttree.target import TargetModel, tree_attention_mask
from tests.conftest import tiny_causal_lm

VOCAB, HIDDEN, LAYERS = 64, 32, 6
DRAFT_IDS = torch.arange(3, 51)  # a reduced draft vocabulary of 48 target ids


def _lm(arch: str = "llama", seed: int = 1, **kw) -> LoadedModel:
    args = dict(vocab=VOCAB, hidden=HIDDEN, layers=LAYERS, seed=seed) | kw
    return LoadedModel(tiny_causal_lm(arch, **args), None, f"tiny-{arch}", "")


def _random_head(lm: LoadedModel, seed: int = 0, **variants) -> Eagle3Head:
    torch.manual_seed(seed)
    head = Eagle3Head(lm.model, draft_vocab=DRAFT_IDS, target_name=lm.name, **variants)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))  # not a fresh init: norms and LM head all differ from defaults
    return head.eval()


def _draft_logits(head, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(1, 5, len(head.aux_layers) * HIDDEN, generator=g)
    ids = torch.randint(0, VOCAB, (1, 5), generator=g)
    mask = tree_attention_mask(torch.tril(torch.ones(5, 5, dtype=torch.bool)), 0, torch.float32)
    with torch.no_grad():
        out = head(feats, ids, torch.arange(5)[None], mask)
        again = head(out, ids, torch.arange(5)[None], mask)  # the fed-back step (no fc)
        return torch.cat([head.draft_logits(out), head.draft_logits(again)], 1)


def _reference_logits(head: Eagle3Head, lm: LoadedModel, norm_before_residual: bool) -> torch.Tensor:
    """EAGLE-3's forward written out with plain tensor ops from the weights (EAGLE repo cnets.py order:
    embedding first, residual = the fed hidden state or its norm, logits = lm_head(norm(h)))."""
    w = {k: v.float() for k, v in head.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(1, 5, len(head.aux_layers) * HIDDEN, generator=g)[0]
    ids = torch.randint(0, VOCAB, (1, 5), generator=g)[0]
    eps, nh, nkv = head.config.rms_norm_eps, head.config.num_attention_heads, head.config.num_key_value_heads
    hd = HIDDEN // nh

    def rms(x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w[name]

    def rope(x):  # x [heads, T, hd], theta 10000, rotate-half convention
        inv = 1.0 / 10000 ** (torch.arange(0, hd, 2).float() / hd)
        ang = torch.arange(5).float()[:, None] * inv[None]
        cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def layer(hidden):
        p = "midlayer."
        emb = lm.model.get_input_embeddings().weight[ids].float()
        x = torch.cat([rms(emb, p + "input_layernorm.weight"), rms(hidden, p + "hidden_norm.weight")], -1)
        residual = rms(hidden, p + "hidden_norm.weight") if norm_before_residual else hidden
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(5, nh, hd).transpose(0, 1)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(5, nkv, hd).transpose(0, 1)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(5, nkv, hd).transpose(0, 1)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
        att = (q @ k.transpose(1, 2)) / hd ** 0.5
        att = att.masked_fill(~torch.tril(torch.ones(5, 5, dtype=torch.bool)), float("-inf")).softmax(-1)
        o = (att @ v).transpose(0, 1).reshape(5, nh * hd) @ w[p + "self_attn.o_proj.weight"].T
        h = residual + o
        m = rms(h, p + "post_attention_layernorm.weight")
        gate, up = m @ w[p + "mlp.gate_proj.weight"].T, m @ w[p + "mlp.up_proj.weight"].T
        return h + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T

    out = layer(feats @ w["fc.weight"].T)
    again = layer(out)
    return torch.stack([rms(out, "norm.weight"), rms(again, "norm.weight")]) @ w["lm_head.weight"].T


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_eagle3_forward_matches_a_reference_written_from_the_paper_code(norm_before_residual):
    lm = _lm("llama")
    head = _random_head(lm, norm_before_residual=norm_before_residual)
    ours = _draft_logits(head)[0].reshape(2, 5, -1)
    torch.testing.assert_close(ours, _reference_logits(head, lm, norm_before_residual), atol=1e-4, rtol=1e-4)
    other = _reference_logits(head, lm, not norm_before_residual)
    assert (ours - other).abs().max() > 1e-3, "the variant must change the output"


def _layer_config(head: Eagle3Head) -> dict:
    """Config fields as the EAGLE repo's training config spells them (no head_dim, rope_theta plain)."""
    return {"hidden_size": HIDDEN, "intermediate_size": head.config.intermediate_size,
            "num_attention_heads": head.config.num_attention_heads,
            "num_key_value_heads": head.config.num_key_value_heads, "num_hidden_layers": 1,
            "max_position_embeddings": 2048, "rms_norm_eps": head.config.rms_norm_eps, "vocab_size": VOCAB,
            "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float16"}


def _published(head: Eagle3Head, layout: str, path, lm: LoadedModel) -> None:
    """Write ``head`` as each project publishes it, by hand (not through our writer)."""
    state = {k: v.clone() for k, v in head.state_dict().items()}
    ids = head.draft_vocab
    state["d2t"] = ids - torch.arange(ids.numel())
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[ids] = True
    state["t2d"] = t2d
    cfg = _layer_config(head) | {"draft_vocab_size": int(ids.numel())}
    path.mkdir(parents=True)
    if layout == "eagle-bin":  # EAGLE repo training output: LlamaForCausalLM + draft_vocab_size, a .bin
        cfg["architectures"] = ["LlamaForCausalLM"]
        torch.save(state, path / "pytorch_model.bin")
    elif layout == "specforge":  # layer *output* ids in eagle_config
        cfg |= {"architectures": ["LlamaForCausalLMEagle3"],
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in head.aux_layers]}}
        save_file(state, str(path / "model.safetensors"))
    elif layout == "speculators":  # layers.0.*, embedding stored, layer-input ids at the top level
        state = {k.replace("midlayer.", "layers.0."): v for k, v in state.items()}
        state["embed_tokens.weight"] = lm.model.get_input_embeddings().weight.clone()
        cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
               "transformer_layer_config": _layer_config(head) | {"model_type": "llama"},
               "draft_vocab_size": int(ids.numel()), "norm_before_residual": head.variants["norm_before_residual"],
               "eagle_aux_hidden_state_layer_ids": list(head.aux_layers),
               "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": "tiny"}}}
        save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("method", ["eagle-chain", "eagle1", "eagle2", "hybrid"])
def test_random_eagle3_head_is_lossless_greedy(arch, method):
    lm = _lm(arch)
    head = _random_head(lm)
    prompt = torch.tensor([3, 4, 5, 6, 7, 8, 3, 4, 5])
    ref = [t for s in decode(TargetModel(lm.model), Drafter(), prompt, Sampling(), 40) for t in s]
    opts = {"total_tokens": 10} if method in ("eagle2", "hybrid") else {}
    d = make_drafter(method, lm, head=head, **opts)
    tm = TargetModel(lm.model, feature_layers=head.aux_layers)
    assert [t for s in decode(tm, d, prompt, Sampling(), 40) for t in s] == ref


@pytest.mark.parametrize("layout,variants", [("eagle-bin", {}), ("specforge", {}),
                                             ("speculators", {"norm_before_residual": True})])
def test_published_layouts_load_export_and_load_again(layout, variants, tmp_path):
    lm = _lm("llama")
    head = _random_head(lm, **variants)
    _published(head, layout, tmp_path / "pub", lm)
    loaded = load_head(tmp_path / "pub", lm)
    assert isinstance(loaded, Eagle3Head) and loaded.aux_layers == head.aux_layers == [2, 3, 3]
    assert torch.equal(loaded.draft_vocab, DRAFT_IDS) and loaded.variants == head.variants
    want = _draft_logits(head)
    torch.testing.assert_close(_draft_logits(loaded), want)
    loaded.save(tmp_path / "ours", dtype=None)
    for fmt in ("sglang", "vllm", "speculators", "eagle"):
        if fmt in ("sglang", "eagle") and variants:
            with pytest.raises(DraftTreeError, match="cannot express"):
                export_head(tmp_path / "ours", tmp_path / fmt, fmt)
            continue
        export_head(tmp_path / "ours", tmp_path / fmt, fmt)
        again = load_head(tmp_path / fmt, lm)
        torch.testing.assert_close(_draft_logits(again), want, msg=fmt)
        assert again.aux_layers == head.aux_layers, fmt
    cfg = json.loads((tmp_path / "speculators" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["eagle_aux_hidden_state_layer_ids"] == [2, 3, 3]
    cfg = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["eagle_aux_hidden_state_layer_ids"] == [2, 3, 3]
    # a loaded published head decodes losslessly too
    prompt = torch.tensor([5, 6, 7, 5, 6, 7, 8])
    ref = [t for s in decode(TargetModel(lm.model), Drafter(), prompt, Sampling(), 32) for t in s]
    tm = TargetModel(lm.model, feature_layers=loaded.aux_layers)
    d = make_drafter("eagle2", lm, head=loaded, total_tokens=8)
    assert [t for s in decode(tm, d, prompt, Sampling(), 32) for t in s] == ref


def test_heads_that_do_not_fit_are_one_line_errors(tmp_path):
    lm = _lm("llama")
    head = _random_head(lm)
    _published(head, "specforge", tmp_path / "h", lm)
    with pytest.raises(DraftTreeError, match="hidden size 32 vs target 48"):
        load_head(tmp_path / "h", _lm("llama", hidden=48))
    with pytest.raises(DraftTreeError, match="vocab size 64 vs target 80"):
        load_head(tmp_path / "h", _lm("llama", vocab=80))
    with pytest.raises(DraftTreeError, match="out of range"):
        load_head(tmp_path / "h", _lm("llama", layers=3))
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 9, 2]
    (tmp_path / "h" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DraftTreeError, match=r"aux hidden-state layers \[2, 10, 3\] are out of range"):
        load_head(tmp_path / "h", lm)
    # a pickle that holds more than tensors is refused, not executed
    _published(head, "eagle-bin", tmp_path / "b", lm)
    torch.save({"fc.weight": torch.zeros(1), "evil": Drafter()}, tmp_path / "b" / "pytorch_model.bin")
    with pytest.raises(DraftTreeError, match="refusing to unpickle"):
        load_head(tmp_path / "b", lm)
    (tmp_path / "b" / "pytorch_model.bin").unlink()
    with pytest.raises(DraftTreeError, match="not a head directory"):
        load_head(tmp_path / "b", lm)


def test_published_eagle1_head_with_embedding_in_a_bin_loads(tmp_path):
    """EAGLE-1/2 heads as the EAGLE repo publishes them: pytorch_model.bin, embed_tokens stored, plain config."""
    from drafttree.heads import EagleHead

    lm = _lm("llama")
    torch.manual_seed(3)
    head = EagleHead(lm.model)
    state = dict(head.state_dict()) | {"embed_tokens.weight": lm.model.get_input_embeddings().weight.clone()}
    (tmp_path / "e1").mkdir()
    torch.save(state, tmp_path / "e1" / "pytorch_model.bin")
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN, "vocab_size": VOCAB,
           "num_hidden_layers": 1, "intermediate_size": lm.model.config.intermediate_size, "bias": True}
    (tmp_path / "e1" / "config.json").write_text(json.dumps(cfg))
    loaded = load_head(tmp_path / "e1", lm)
    assert isinstance(loaded, EagleHead) and loaded.layout == "eagle1"
    feats, ids = torch.randn(1, 4, HIDDEN), torch.randint(0, VOCAB, (1, 4))
    mask = tree_attention_mask(torch.tril(torch.ones(4, 4, dtype=torch.bool)), 0, torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(feats, ids, torch.arange(4)[None], mask),
                                   head(feats, ids, torch.arange(4)[None], mask))
