"""DFlash drafters (z-lab's ``DFlashDraftModel``, heads/dflash.py), loaded from a checkpoint in the published layout:
every round's draft is the one the published block computation gives (written here from its definition, with no cache:
the target's hidden states at ``target_layer_ids`` as context keys and values of every layer, the block of the root and
mask tokens attending to all of it and to itself), every method that takes a head gives plain decoding's tokens with one
(float32, on a tiny Qwen3 and on the real default model; T=1 with a seed: plain sampling's), and a drafter that does
not fit its target is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from test_architectures import IdsTokenizer
from test_assistant import Recording
from transformers import AutoConfig, AutoModelForCausalLM

from drafttree.api import SpeculativeModel
from drafttree.drafters import make_drafter
from drafttree.errors import DraftTreeError
from drafttree.heads.dflash import DFlashHead
from drafttree.heads.export import export_head
from drafttree.heads.loading import load_head
from drafttree.models import LoadedModel

V, H, L, N = 96, 64, 6, 20
MASK, BLOCK = 95, 5
KERNEL, GROUP, RANK, TOPK = 2, 16, 8, 6  # DFlash2's convolution and candidate selector
BIAS = {5: 30.0, 9: 30.0}
TARGET = dict(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=L, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=512, tie_word_embeddings=False,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def _target() -> LoadedModel:
    cfg = AutoConfig.for_model("qwen3", **TARGET)
    cfg.bos_token_id, cfg.eos_token_id = 0, None
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval().requires_grad_(False)
    with torch.no_grad():  # sharpened, and tokens 5 and 9 likeliest most of the time: drafts get accepted
        w = model.get_output_embeddings().weight
        w.mul_(4.0)
        w[9] = -w[5] * 3
        w[5] = w[5] * 3
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
    return LoadedModel(model, IdsTokenizer(), "tiny-qwen3", "")


def _checkpoint(path, hidden: int = H, layers: int = 2, ids=(1, 3), heads: int = 4, kv: int = 2, dim: int = 16,
                vocab: int = V, dflash2: bool = False, **extra) -> dict[str, torch.Tensor]:
    """A random DFlash checkpoint as z-lab publishes one (config.json + model.safetensors); returns its tensors."""
    g = torch.Generator().manual_seed(7)

    def rnd(*shape, scale=None):
        return torch.randn(*shape, generator=g) * (scale or shape[-1] ** -0.5)

    def norm(n):
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    w = {"fc.weight": rnd(hidden, len(ids) * hidden), "hidden_norm.weight": norm(hidden), "norm.weight": norm(hidden)}
    for i in range(layers):
        p = f"layers.{i}."
        a = p + "self_attn."
        w |= {p + "input_layernorm.weight": norm(hidden), p + "post_attention_layernorm.weight": norm(hidden),
              a + "q_proj.weight": rnd(heads * dim, hidden), a + "k_proj.weight": rnd(kv * dim, hidden),
              a + "v_proj.weight": rnd(kv * dim, hidden), a + "o_proj.weight": rnd(hidden, heads * dim),
              a + "q_norm.weight": norm(dim), a + "k_norm.weight": norm(dim),
              p + "mlp.gate_proj.weight": rnd(2 * hidden, hidden), p + "mlp.up_proj.weight": rnd(2 * hidden, hidden),
              p + "mlp.down_proj.weight": rnd(hidden, 2 * hidden)}
    if dflash2:  # convolutions around each attention and MLP, and the candidate selector (no ``.weight`` suffix)
        for i in range(layers):
            for conv in ("attention_conv", "mlp_conv"):
                w[f"layers.{i}.{conv}.base_kernel"] = rnd(2, KERNEL, hidden, scale=0.5)
                w[f"layers.{i}.{conv}.kernel_projection.weight"] = rnd(2 * KERNEL * hidden // GROUP, hidden)
        w |= {"candidate_selector.predecessor_codebook": rnd(vocab, RANK, scale=0.3),
              "candidate_selector.successor_codebook": rnd(vocab, RANK, scale=0.3),
              "candidate_selector.hidden_projection.weight": rnd(RANK, hidden)}
        extra = {"architectures": ["DFlash2DraftModel"], "dflash_config": {
            "mask_token_id": MASK, "target_layer_ids": list(ids), "conv_kernel_size": KERNEL, "conv_group_size": GROUP,
            "selector_rank": RANK, "selector_top_k": TOPK, "output_multiplier": 0.5, "final_logit_softcapping": 20.0}}
    cfg = {"architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
           "model_type": "qwen3", "block_size": BLOCK, "dflash_config": {"mask_token_id": MASK,
                                                                        "target_layer_ids": list(ids)},
           "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
           "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": dim, "vocab_size": vocab,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 512, "attention_bias": False,
           "num_target_layers": L, "tie_word_embeddings": False, "dtype": "bfloat16"} | extra
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.to(torch.bfloat16) for k, v in w.items()}, str(path / "model.safetensors"))
    return {k: v.to(torch.bfloat16).float() for k, v in w.items()}


def _rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _conv(x: torch.Tensor, w: dict, name: str, which: int, dyn: torch.Tensor) -> torch.Tensor:
    """DFlash2's convolution from its definition: out[t] = sum over o < K of (base[o] + dyn[t, o, group]) * x[t - o]."""
    base = w[name + ".base_kernel"][which]  # [K, H]
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for o in range(min(KERNEL, t + 1)):
            out[t] += (base[o] + dyn[t, o].repeat_interleave(GROUP)) * x[t - o]
    return out


def _conv_pair(x, w, name):
    dyn = (x @ w[name + ".kernel_projection.weight"].T).view(x.shape[0], 2, KERNEL, -1)
    return _conv(x, w, name, 0, dyn[:, 0]), dyn[:, 1]


def _reference_logits(w: dict, target: LoadedModel, context: list[int], layers: int = 2, ids=(1, 3), heads: int = 4,
                      kv: int = 2, dim: int = 16, hidden: bool = False) -> torch.Tensor:
    """The published block computation, cache-free: logits [BLOCK - 1, V] for depths 1.. after ``context`` (its last
    token the root), the context keys and values from the target's hidden states (layer outputs) at ``ids``."""
    with torch.no_grad():
        out = target.model(torch.tensor([context[:-1]]), output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i + 1][0] for i in ids], -1)
        ctx = _rms(feats @ w["fc.weight"].T, w["hidden_norm.weight"])
        n = len(context) - 1  # the root's position
        x = target.model.get_input_embeddings().weight[torch.tensor([context[-1]] + [MASK] * (BLOCK - 1))]
        pos = torch.arange(n + BLOCK, dtype=torch.float32)
        freqs = pos[:, None] / 10000.0 ** (torch.arange(0, dim, 2) / dim)[None]
        cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()

        def rope(t, c, s):  # t [heads, T, dim]
            return t * c + torch.cat([-t[..., dim // 2:], t[..., : dim // 2]], -1) * s

        for i in range(layers):
            p = f"layers.{i}."
            h = _rms(x, w[p + "input_layernorm.weight"])
            dflash2 = p + "attention_conv.base_kernel" in w
            if dflash2:
                h, second = _conv_pair(h, w, p + "attention_conv")
            q = _rms((h @ w[p + "self_attn.q_proj.weight"].T).view(BLOCK, heads, dim), w[p + "self_attn.q_norm.weight"])
            both = torch.cat([ctx, h])
            k = _rms((both @ w[p + "self_attn.k_proj.weight"].T).view(-1, kv, dim), w[p + "self_attn.k_norm.weight"])
            v = (both @ w[p + "self_attn.v_proj.weight"].T).view(-1, kv, dim)
            q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
            q, k = rope(q, cos[n:], sin[n:]), rope(k, cos, sin)
            k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
            att = torch.softmax(q @ k.transpose(1, 2) / dim ** 0.5, -1) @ v  # every key: no mask
            a = att.transpose(0, 1).reshape(BLOCK, -1) @ w[p + "self_attn.o_proj.weight"].T
            x = x + (_conv(a, w, p + "attention_conv", 1, second) if dflash2 else a)
            y = _rms(x, w[p + "post_attention_layernorm.weight"])
            if dflash2:
                y, second = _conv_pair(y, w, p + "mlp_conv")
            gate, up = y @ w[p + "mlp.gate_proj.weight"].T, y @ w[p + "mlp.up_proj.weight"].T
            m = (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
            x = x + (_conv(m, w, p + "mlp_conv", 1, second) if dflash2 else m)
        out = _rms(x, w["norm.weight"])[1:]
        logits = out @ target.model.get_output_embeddings().weight.T
        if dflash2:
            logits = torch.tanh(logits * 0.5 / 20.0) * 20.0
        return (logits, out) if hidden else logits


def _reference_draft(w: dict, target: LoadedModel, context: list[int]) -> list[int]:
    """The block's draft: each depth's argmax, or for DFlash2 the candidate selector's path (each depth's top
    candidates rescored after the token chosen above, from the root down)."""
    logits, out = _reference_logits(w, target, context, hidden=True)
    if "candidate_selector.hidden_projection.weight" not in w:
        return logits.argmax(-1).tolist()
    proj = out @ w["candidate_selector.hidden_projection.weight"].T
    prev, path = context[-1], []
    for d in range(BLOCK - 1):
        unary, cands = logits[d].topk(TOPK)
        pair = (w["candidate_selector.predecessor_codebook"][prev] * proj[d]) @ \
            w["candidate_selector.successor_codebook"][cands].T
        prev = int(cands[(unary + pair).argmax()])
        path.append(prev)
    return path


def _prompts() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, MASK, (k,), generator=g) for k in (7, 19)]
    prompts[1][10:16] = prompts[1][:6]
    return prompts


@pytest.fixture(scope="module", params=["dflash", "dflash2"])
def built(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / "drafter"
    return path, _checkpoint(path, dflash2=request.param == "dflash2"), _target()


def test_the_drafter_computes_the_published_block(built):
    path, w, target = built
    head = load_head(path, target)
    assert isinstance(head, DFlashHead) and head.aux_layers == [2, 4] and head.block_size == BLOCK
    assert head.layout == ("dflash2" if "candidate_selector.hidden_projection.weight" in w else "dflash")
    state = make_drafter("dflash", target, head=head).state
    ctx = _prompts()[1].tolist()
    with torch.no_grad():
        feats = target.model(torch.tensor([ctx[:-1]]), output_hidden_states=True).hidden_states
    cut = len(ctx) - 3
    state.encode(torch.cat([feats[2][0], feats[4][0]], -1)[:cut], ctx[1: cut + 1], 0)  # outputs of layers 1 and 3
    torch.testing.assert_close(state.logprobs(), torch.log_softmax(_reference_logits(w, target, ctx[: cut + 1]), -1))
    # the next round's LM head runs for the depths the last round read and two more, the rest when a tree goes deeper:
    # the same distributions either way
    state.encode(torch.cat([feats[2][0], feats[4][0]], -1)[cut:], ctx[cut + 1:], cut)
    state._used = 1
    want = torch.log_softmax(_reference_logits(w, target, ctx), -1)
    state.root_logprobs()  # DFlash2: the selector's rescoring of depth 1 (its marginals are compared here)
    torch.testing.assert_close(state._lp[0], want[0])
    assert state._lp.shape[0] == 3  # depths 1..3 so far
    state.expand(torch.tensor([5]), torch.tensor([-1]), torch.ones(1, 1, dtype=torch.bool), BLOCK - 2)
    torch.testing.assert_close(state._lp, want)


def _check_rounds(target: LoadedModel, head, reference) -> None:
    """Decode the prompts with ``dflash``: plain decoding's tokens, and every round's drafted chain the start of
    ``reference(context)``; some drafts accepted (rounds that committed several tokens moved the context on by as
    many)."""
    sm = SpeculativeModel(target, method="dflash", head=head)
    accepted = checked = 0
    for prompt in _prompts():
        drafter = Recording(make_drafter("dflash", target, head=head))
        out = sm.generate(prompt, max_new_tokens=N, ignore_eos=True, drafter=drafter)
        assert out.tokens == sm.generate(prompt, max_new_tokens=N, method="ar", ignore_eos=True).tokens
        accepted += out.new_tokens - out.target_forwards
        for context, chain in drafter.rounds:
            assert chain == reference(context)[: len(chain)], len(context)
            checked += len(chain)
    assert checked > 0 and accepted > 0


def test_every_rounds_draft_is_the_published_block(built):
    path, w, target = built
    _check_rounds(target, load_head(path, target), lambda context: _reference_draft(w, target, context))


@pytest.mark.parametrize("method,options", [("dflash", {}), ("eagle-chain", {"depth": 2}), ("eagle2", {}),
                                            ("auto", {}), ("hybrid", {"sources": "head"})])
def test_every_method_gives_plain_decodings_tokens_with_a_dflash_drafter(built, method, options):
    path, _, target = built
    sm = SpeculativeModel(target, method=method, head=load_head(path, target), **options)
    prompts = _prompts()
    with torch.no_grad():
        refs = [target.model.generate(p[None], attention_mask=torch.ones(1, p.numel(), dtype=torch.long),
                                      do_sample=False, max_new_tokens=N, min_new_tokens=N)[0, p.numel():].tolist()
                for p in prompts]
    outs = [sm.generate(p, max_new_tokens=N, ignore_eos=True) for p in prompts]
    assert [o.tokens for o in outs] == refs
    if method not in ("auto", "hybrid"):  # these draft every round (the hybrid where its gates say it pays)
        assert sum(o.new_tokens for o in outs) > sum(o.target_forwards for o in outs)  # drafts were accepted
    assert [r.tokens for r in sm.generate(list(prompts), max_new_tokens=N, ignore_eos=True)] == refs  # a batch
    biased = [sm.generate(p, max_new_tokens=N, method="ar", ignore_eos=True, logit_bias=BIAS).tokens for p in prompts]
    assert [sm.generate(p, max_new_tokens=N, ignore_eos=True, logit_bias=BIAS).tokens for p in prompts] == biased
    alone = [sm.generate(p, max_new_tokens=N, method="ar", ignore_eos=True, temperature=1.0, seed=5).tokens
             for p in prompts]
    assert [sm.generate(p, max_new_tokens=N, ignore_eos=True, temperature=1.0, seed=5).tokens
            for p in prompts] == alone


def test_a_sliding_causal_drafter_masks_as_published(tmp_path):
    """Layers marked sliding attention are causal within the block and windowed (the published code's mask)."""
    target = _target()
    _checkpoint(tmp_path / "d", layer_types=["sliding_attention", "full_attention"], use_sliding_window=True,
                sliding_window=4, max_window_layers=0)
    head = load_head(tmp_path / "d", target)
    assert head.causal == [True, False] and head.windows == [4, None]
    mask = head._mask(0, 10, 15, BLOCK, "cpu")[0, 0]
    assert mask[0].nonzero().flatten().tolist() == [7, 8, 9, 10] and mask[4].nonzero().flatten().tolist() == [11, 12,
                                                                                                              13, 14]
    sm = SpeculativeModel(target, method="dflash", head=head)
    p = _prompts()[1]
    assert sm.generate(p, max_new_tokens=N, ignore_eos=True).tokens == sm.generate(
        p, max_new_tokens=N, method="ar", ignore_eos=True).tokens


def test_a_dflash_drafter_that_does_not_fit_gets_one_line(tmp_path):
    target = _target()
    cases = [
        (dict(hidden=32), "hidden size 32 vs target 64"),
        (dict(ids=(1, 5)), r"target layers \[1, 5\] out of range for a target of 6 layers"),
        (dict(dflash_config={"mask_token_id": 500, "target_layer_ids": [1, 3]}), "mask token 500 outside"),
        (dict(architectures=["DFlash2DraftModel"]), "a DFlash2 config needs positive integers conv_kernel_size"),
        (dict(dflash_config={"mask_token_id": MASK, "target_layer_ids": "1,3"}), "target_layer_ids must list layer"),
        (dict(block_size=1), "block size 1"),
    ]
    for i, (kw, message) in enumerate(cases):
        _checkpoint(tmp_path / str(i), **kw)
        with pytest.raises(DraftTreeError, match=message) as e:
            load_head(tmp_path / str(i), target)
        assert "\n" not in str(e.value)
    _checkpoint(tmp_path / "short", layers=2)
    cfg = json.loads((tmp_path / "short" / "config.json").read_text())
    (tmp_path / "short" / "config.json").write_text(json.dumps(cfg | {"num_hidden_layers": 3}))
    with pytest.raises(DraftTreeError, match=r"weights do not match the architecture \(missing \['layers.2"):
        load_head(tmp_path / "short", target)
    _checkpoint(tmp_path / "narrow", dim=8, heads=8)  # q_proj 64 x 64 is right, q_norm is 8 wide: a shape misfit
    cfg = json.loads((tmp_path / "narrow" / "config.json").read_text())
    (tmp_path / "narrow" / "config.json").write_text(json.dumps(cfg | {"head_dim": 16}))
    with pytest.raises(DraftTreeError, match="weights do not match the architecture") as e:
        load_head(tmp_path / "narrow", target)
    assert "\n" not in str(e.value)
    with pytest.raises(DraftTreeError, match="is a DFlash drafter"):
        export_head(tmp_path / "0", tmp_path / "out", "vllm")


def test_dflash_method_refuses_other_heads(default_fp32):
    from drafttree.heads import load_head_for

    with pytest.raises(DraftTreeError, match="drafts with a dflash head; the loaded head .* is of kind .eagle."):
        make_drafter("dflash", default_fp32, head=load_head_for(default_fp32, None))


def test_a_dflash_drafter_is_lossless_on_the_default_model(default_fp32, tmp_path):
    """A random DFlash drafter as wide as SmolLM2 (9 heads of 64, 3 key-value heads) on the real default model."""
    cfg = default_fp32.model.config
    _checkpoint(tmp_path / "smol", hidden=cfg.hidden_size, layers=1, ids=(1, 14, 26), heads=9, kv=3, dim=64,
                vocab=cfg.vocab_size, dflash_config={"mask_token_id": 0, "target_layer_ids": [1, 14, 26]})
    head = load_head(tmp_path / "smol", default_fp32)
    prompt = "Repeat exactly: the quick brown fox jumps over the lazy dog. The quick brown fox"
    plain = SpeculativeModel(default_fp32, method="ar").generate(prompt, max_new_tokens=32, ignore_eos=True).tokens
    for method in ("dflash", "auto"):
        sm = SpeculativeModel(default_fp32, method=method, head=head)
        assert sm.generate(prompt, max_new_tokens=32, ignore_eos=True).tokens == plain, method


def test_a_published_drafter_loads_by_its_hub_id_from_the_local_cache(built, tmp_path, monkeypatch):
    """``--head org/name``: the snapshot in the Hugging Face cache, as `hf download` leaves it (never fetched)."""
    import shutil

    from huggingface_hub import constants

    path, _, target = built
    snap = tmp_path / "hub" / "models--z-lab--tiny-DFlash-b5" / "snapshots" / "abc123"
    shutil.copytree(path, snap)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    head = load_head("z-lab/tiny-DFlash-b5", target)
    assert isinstance(head, DFlashHead) and head.path == snap
    with pytest.raises(DraftTreeError, match="z-lab/absent is neither a directory nor a hub model in the local") as e:
        load_head("z-lab/absent", target)
    assert "\n" not in str(e.value)


def test_a_dflash_drafter_on_a_hybrid_target_verifies_chains_exactly(tmp_path):
    """z-lab publishes DFlash drafters for gated-delta-net hybrids (Qwen3-Coder-Next, Qwen3.5): such a target verifies
    chains (chain_target.py), and every method still gives its greedy text."""
    from test_chain_target import ARCHS as HYBRIDS
    from test_chain_target import BASE

    cfg = AutoConfig.for_model("qwen3_5_text", **(BASE | HYBRIDS["qwen3_5_text"]))
    cfg.bos_token_id, cfg.eos_token_id = 0, None
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval().requires_grad_(False)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
    target = LoadedModel(model, IdsTokenizer(), "tiny-qwen3.5", "")
    _checkpoint(tmp_path / "d", ids=(0, 2))
    head = load_head(tmp_path / "d", target)
    for method in ("dflash", "auto"):
        sm = SpeculativeModel(target, method=method, head=head)
        for p in _prompts():
            with torch.no_grad():
                ref = model.generate(p[None], attention_mask=torch.ones(1, p.numel(), dtype=torch.long),
                                     do_sample=False, max_new_tokens=N, min_new_tokens=N)[0, p.numel():].tolist()
            assert sm.generate(p, max_new_tokens=N, ignore_eos=True).tokens == ref, method


def _muse(path, window: int = 512, seed: int = 3) -> torch.nn.Module:
    """Transformers' own DFlash drafter (``muse_glimmer_assistant``), random, saved as transformers saves it."""
    from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    cfg = MuseGlimmerAssistantConfig(hidden_size=H, intermediate_size=2 * H, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=16, sliding_window=window, block_size=BLOCK,
                                     mask_token_id=MASK, target_layer_ids=[1, 3], bos_token_id=0, eos_token_id=None,
                                     pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(seed)
    model = MuseGlimmerAssistantModel(cfg).eval().requires_grad_(False)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if p.dim() == 1 else torch.randn_like(p) * p.shape[-1] ** -0.5)
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize("window", [512, 4])
def test_transformers_own_dflash_drafter_drafts_as_transformers_computes_it(tmp_path, window):
    """Transformers' DFlash drafter class (its own implementation, read here from its saved directory with its own
    names) gives the same block outputs as transformers' model does, round after round; with a window of 4 its
    sliding layers' bidirectional windows cut the context."""
    from transformers.cache_utils import DFlashCache

    target = _target()
    muse = _muse(tmp_path / "muse", window)
    head = load_head(tmp_path / "muse", target)
    assert head.layout == "muse" and head.causal == [False, False] and head.windows == [window, window]
    state = make_drafter("dflash", target, head=head).state
    ctx = _prompts()[1].tolist()
    with torch.no_grad():
        hs = target.model(torch.tensor([ctx]), output_hidden_states=True).hidden_states
    feats = torch.cat([hs[2][0], hs[4][0]], -1)
    for n in (12, 14, 17):  # three rounds: the cache carries the context from one to the next
        state.encode(feats[state.root_pos if state.root_pos else 0: n], ctx[(state.root_pos or 0) + 1: n + 1],
                     state.root_pos)
        with torch.no_grad():
            cache = DFlashCache(config=muse.config)
            cache.set_previous_accepted_tokens(n)
            block = torch.tensor([ctx[n]] + [MASK] * (BLOCK - 1))
            emb = target.model.get_input_embeddings()(block)[None]
            pos = torch.arange(n + BLOCK)[None]
            out = muse(noise_embeds=emb, context_hidden_states=feats[None, :n], position_ids=pos,
                       cache=cache).last_hidden_state[0]
        want = torch.log_softmax(target.model.get_output_embeddings()(out[1:]), -1)
        torch.testing.assert_close(state.logprobs(), want, rtol=1e-4, atol=1e-4)


def test_older_sharded_and_vllm_extended_checkpoints(tmp_path):
    target = _target()
    w = _checkpoint(tmp_path / "old", dflash_config={"mask_token_id": MASK})  # no target_layer_ids: z-lab's default
    cfg = json.loads((tmp_path / "old" / "config.json").read_text())
    (tmp_path / "old" / "config.json").write_text(json.dumps(cfg | {"num_target_layers": 6}))
    assert load_head(tmp_path / "old", target).target_layer_ids == [1, 3]  # round(1 + i * (6 - 4) / 1)
    shards = tmp_path / "sharded"  # a large drafter's weights in several files, listed by an index
    _checkpoint(shards)
    names = sorted(w)
    for i, part in enumerate((names[::2], names[1::2])):
        save_file({k: w[k].to(torch.bfloat16) for k in part}, str(shards / f"model-0000{i + 1}-of-00002.safetensors"))
    (shards / "model.safetensors").unlink()
    (shards / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        k: f"model-0000{1 + names.index(k) % 2}-of-00002.safetensors" for k in names}}))
    one, two = load_head(tmp_path / "old", target), load_head(shards, target)
    assert all(torch.equal(a, b) for a, b in zip(one.state_dict().values(), two.state_dict().values()))
    _checkpoint(tmp_path / "sinks", dflash_config={"mask_token_id": MASK, "target_layer_ids": [1, 3],
                                                   "attention_sink_bias": True})
    with pytest.raises(DraftTreeError, match="uses vLLM's DFlash extensions .attention_sink_bias.") as e:
        load_head(tmp_path / "sinks", target)
    assert "\n" not in str(e.value)
    _checkpoint(tmp_path / "sink")
    torch.save(torch.zeros(H), tmp_path / "sink" / "mask_embedding.pt")
    with pytest.raises(DraftTreeError, match="learnt mask embedding"):
        load_head(tmp_path / "sink", target)


def test_vllms_dflash_conventions_are_read_as_vllm_reads_them(tmp_path):
    """vLLM's config keys (``dflash_config.use_swa`` / ``swa_window_size``: every layer windowed; ``causal``: every
    layer's causality) and its ``midlayer.`` name for a one-layer drafter's layer; decoding stays exact."""
    target = _target()
    dc = {"mask_token_id": MASK, "target_layer_ids": [1, 3]}
    _checkpoint(tmp_path / "swa", dflash_config=dc | {"use_swa": True, "swa_window_size": 3})
    head = load_head(tmp_path / "swa", target)
    assert head.windows == [3, 3] and head.causal == [False, False]
    _checkpoint(tmp_path / "causal", dflash_config=dc | {"causal": True})
    assert load_head(tmp_path / "causal", target).causal == [True, True]
    w = _checkpoint(tmp_path / "one", layers=1)
    mid = tmp_path / "mid"
    mid.mkdir()
    (mid / "config.json").write_text((tmp_path / "one" / "config.json").read_text())
    save_file({k.replace("layers.0.", "midlayer."): v.to(torch.bfloat16) for k, v in w.items()},
              str(mid / "model.safetensors"))
    a, b = load_head(tmp_path / "one", target), load_head(mid, target)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    p = _prompts()[1]
    plain = SpeculativeModel(target, method="ar").generate(p, max_new_tokens=N, ignore_eos=True).tokens
    for h in (head, b):
        assert SpeculativeModel(target, method="dflash", head=h).generate(p, max_new_tokens=N,
                                                                          ignore_eos=True).tokens == plain


def _hf_candidates(muse, model, context: list[int]) -> list[int]:
    """Transformers' DFlash candidate generator's block after a fresh forward over ``context`` (its last: the root)."""
    from transformers import GenerationConfig
    from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator

    ids = torch.tensor([context])
    with torch.no_grad():
        out = model(ids[:, :-1], output_hidden_states=True)
        hf = DFlashTokenCandidateGenerator(muse, model.get_input_embeddings(), model.get_output_embeddings(),
                                           GenerationConfig(max_length=1000))
        kwargs = {"attention_mask": torch.ones_like(ids), "position_ids": torch.arange(ids.shape[1])[None]}
        cand, _ = hf.get_candidates(ids, kwargs, out, is_first_iteration=False, n_last_matches=0)
    return cand[0, ids.shape[1]:].tolist()


def test_every_rounds_block_is_the_one_transformers_dflash_candidate_generator_drafts(tmp_path):
    """Decoding with transformers' layout of a DFlash drafter: each round's block (the cached context carried from
    round to round here) is the one transformers' ``DFlashTokenCandidateGenerator`` drafts after a fresh forward."""
    target = _target()
    muse = _muse(tmp_path / "muse", window=6, seed=8)  # a drafter some of whose drafts are accepted
    _check_rounds(target, load_head(tmp_path / "muse", target), lambda context: _hf_candidates(muse, target.model,
                                                                                              context))
