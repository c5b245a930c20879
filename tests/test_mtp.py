"""The multi-token-prediction layer a checkpoint carries (DeepSeek / GLM: ``model.layers.<L>.eh_proj``; Qwen3-Next /
Qwen3.5 / Mellum: ``mtp.fc``; MiMo: ``model.mtp_layers.0.input_proj``; ERNIE 4.5: ``model.mtp_linear_proj.0``;
MiMo-V2-Flash: ``model.mtp.layers.0.final_layernorm``; LongCat-Flash: ``model.mtp.layers.0.enorm.m``) drafts as a head
(heads/mtp.py): every round's chain is the one a plain, cache-free recursion of the published MTP computation gives
(written here from its definition: norms, projection, the layer at index L, final norm, LM head), the drafting state
gives its distributions at every depth, transformers' own ``MtpModel`` computes the same logits where it reads the
layout, every method that takes a head gives plain decoding's tokens with it in float32 (T=1 with a seed: plain
sampling's), ``--head mtp`` and the default find it in the model's own directory, and a misfit is one line."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from test_architectures import ARCHS, IdsTokenizer
from test_assistant import Recording
from test_chain_target import ARCHS as HYBRIDS
from test_chain_target import BASE
from transformers import AutoConfig, AutoModelForCausalLM

from drafttree.api import SpeculativeModel
from drafttree.drafters import make_drafter
from drafttree.drafters.eagle import state_for
from drafttree.errors import DraftTreeError
from drafttree.heads import load_head_for
from drafttree.heads.export import export_head
from drafttree.heads.mtp import MtpHead
from drafttree.models import LoadedModel

V, N = 96, 20
BIAS = {5: 30.0, 9: 30.0}  # the target (with this logit bias) writes tokens 5 and 9 only
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
CASES = {  # layout: (model type, config values, layer count)
    "deepseek": ("deepseek_v3", ARCHS["deepseek_v3"][0], 3),  # MLA attention, an MoE MTP layer
    "qwen3_next": ("qwen3_5_moe_text", BASE | HYBRIDS["qwen3_5_text"] | MOE, 4),  # a gated-delta-net hybrid (chains)
    "mimo": ("qwen2", BASE | dict(num_hidden_layers=3), 3),  # MiMo-7B: a Qwen2 model, [hidden; embedding] projected
    # ERNIE 4.5: MoE from layer 1, a dense MTP layer, the target's final norm before the LM head
    "ernie": ("ernie4_5_moe", BASE | dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=32,
                                          moe_num_shared_experts=1, moe_layer_start_index=1), 3),
    # Mellum: the MTP layer is sliding-window attention (a window shorter than the prompts) with MoE, rotated with the
    # sliding layers' own theta
    "mellum": ("mellum", BASE | dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, sliding_window=6,
                                     layer_types=["sliding_attention", "full_attention", "full_attention"]), 3),
    # MiMo-V2-Flash: its MTP layer sliding-window attention with sinks (eager attention) and a dense MLP, which no
    # layer of the target is; the layer's own final norm, the normed output fed back
    "mimo_v2": ("mimo_v2_flash", BASE | dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                             v_head_dim=16, sliding_window=6,
                                             layer_types=["full_attention", "sliding_attention", "full_attention"],
                                             mlp_layer_types=["dense", "sparse", "sparse"]), 3),
}
LONGCAT_MLA = dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16,
                   v_head_dim=16, head_dim=8)
CASES["longcat"] = ("longcat_flash", BASE | LONGCAT_MLA | dict(  # two attention sublayers and a shortcut MoE per layer;
    n_routed_experts=4, zero_expert_num=2, expert_ffn_hidden_size=32, num_experts_per_tok=2), 3)  # the MTP layer plain
MTP_KIND = {"mellum": ("sliding_attention", "sparse"), "mimo_v2": ("sliding_attention", "dense")}  # the MTP layer's
WINDOW = {"mellum": 6, "mimo_v2": 6}
OFFSET = {"qwen3_next": 1.0}  # Qwen3.5's norms scale by 1 + w
ZEROED = ("deepseek", "mimo", "ernie")  # the embedding at position 0 zeroed, as vLLM serves these layouts
NORMED_FEEDBACK = ("qwen3_next", "mimo", "mellum", "mimo_v2", "longcat")


def _values(case: str, layers: int) -> dict:
    _, values, _ = CASES[case]
    values = dict(values, num_hidden_layers=layers)
    if case == "longcat":  # its config counts each layer's two attention sublayers as hidden layers
        values["num_hidden_layers"] = 2 * layers
    kind, mlp = MTP_KIND.get(case, ("full_attention", "sparse"))
    if "layer_types" in values:
        values["layer_types"] = (values["layer_types"] + [kind])[:layers]
    if case in MTP_KIND:
        values["mlp_layer_types"] = (values.get("mlp_layer_types", ["sparse"] * 3) + [mlp])[:layers]
    return values


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    return (offset + w) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _build(case: str, path, shards: int = 1, own_head: bool = False, width: int | None = None):
    """A checkpoint directory of a ``L``-layer model whose layer L (of an ``L+1``-layer model) and a few tensors more
    are its MTP layer; returns (the L+1-layer model, the MTP tensors by their checkpoint names)."""
    arch, _, n = CASES[case]
    full_cfg = AutoConfig.for_model(arch, **_values(case, n + 1))
    full_cfg.bos_token_id, full_cfg.eos_token_id = 0, None
    torch.manual_seed(0)
    full = AutoModelForCausalLM.from_config(full_cfg).eval().requires_grad_(False)
    with torch.no_grad():
        full.get_output_embeddings().weight.mul_(4.0)  # sharpened: the greedy text repeats
    h = full_cfg.hidden_size
    g = torch.Generator().manual_seed(3)
    full.save_pretrained(path.parent / "full")  # the names checkpoints publish (one tensor per expert)
    with safe_open(str(path.parent / "full" / "model.safetensors"), framework="pt") as f:
        published = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    assert case == "mimo" or any(".experts.0.gate_proj.weight" in k for k in published)
    state = {k: v for k, v in published.items() if not k.startswith(f"model.layers.{n}.")}
    block = {k.removeprefix(f"model.layers.{n}."): v for k, v in published.items()
             if k.startswith(f"model.layers.{n}.")}
    norm = (lambda: 1.0 + 0.1 * torch.randn(h, generator=g)) if case not in OFFSET else (
        lambda: 0.1 * torch.randn(h, generator=g))
    extra = {"fc": torch.randn(h, 2 * (width or h), generator=g) / h ** 0.5, "emb_norm": norm(),
             "hidden_norm": norm(), "norm": norm(), "block": full.model.layers[n]}
    if case == "ernie":  # a dense layer: another model's layer 0 (not the target's own first layer)
        torch.manual_seed(7)
        donor = AutoModelForCausalLM.from_config(full_cfg).eval().requires_grad_(False)
        donor.save_pretrained(path.parent / "donor")
        with safe_open(str(path.parent / "donor" / "model.safetensors"), framework="pt") as f:
            block = {k.removeprefix("model.layers.0."): f.get_tensor(k) for k in f.keys()  # noqa: SIM118
                     if k.startswith("model.layers.0.")}
        extra["block"], extra["norm"] = donor.model.layers[0], published["model.norm.weight"]
    if case == "deepseek":
        head = full.get_output_embeddings().weight.clone()
        if own_head:  # it drafts one of the two tokens the bias allows, whichever its state says
            a, b = BIAS
            head[[i for i in range(V) if i not in BIAS]] = 0.0
            head[b] = -head[a]
        mtp = {"enorm.weight": extra["emb_norm"], "hnorm.weight": extra["hidden_norm"], "eh_proj.weight": extra["fc"],
               "shared_head.norm.weight": extra["norm"], "shared_head.head.weight": head,
               "embed_tokens.weight": full.get_input_embeddings().weight.clone()} | block
        mtp = {f"model.layers.{n}.{k}": v for k, v in mtp.items()}
        extra["head"] = head
    elif case == "ernie":
        mtp = {"mtp_emb_norm.0.weight": extra["emb_norm"], "mtp_hidden_norm.0.weight": extra["hidden_norm"],
               "mtp_linear_proj.0.weight": extra["fc"]} | {f"mtp_block.0.{k}": v for k, v in block.items()}
        mtp = {f"model.{k}": v for k, v in mtp.items()}
        extra["head"] = full.get_output_embeddings().weight
    elif case == "longcat":
        extra["block"] = _PlainMla(full_cfg).eval().requires_grad_(False)
        mtp = {"layers.0.enorm.m.weight": extra["emb_norm"], "layers.0.hnorm.m.weight": extra["hidden_norm"],
               "layers.0.eh_proj.weight": extra["fc"], "norm.weight": extra["norm"],
               "embed_tokens.weight": full.get_input_embeddings().weight.clone()}
        mtp |= {f"layers.0.{k}": v for k, v in extra["block"].published().items()}
        mtp = {f"model.mtp.{k}": v for k, v in mtp.items()}
        extra["head"] = full.get_output_embeddings().weight
    elif case == "mimo_v2":  # published with the names vLLM and SGLang read
        block = {k.replace("post_attention_layernorm", "pre_mlp_layernorm").replace("self_attn.sinks",
                                                                                   "self_attn.attention_sink_bias"): v
                 for k, v in block.items()}
        mtp = {"enorm.weight": extra["emb_norm"], "hnorm.weight": extra["hidden_norm"], "eh_proj.weight": extra["fc"],
               "final_layernorm.weight": extra["norm"]} | block
        mtp = {f"model.mtp.layers.0.{k}": v for k, v in mtp.items()}
        extra["head"] = full.get_output_embeddings().weight
    elif case in ("qwen3_next", "mellum"):
        mtp = {"mtp.pre_fc_norm_embedding.weight": extra["emb_norm"], "mtp.pre_fc_norm_hidden.weight":
               extra["hidden_norm"], "mtp.fc.weight": extra["fc"], "mtp.norm.weight": extra["norm"]}
        mtp |= {f"mtp.layers.0.{k}": v for k, v in block.items()}
        extra["head"] = full.get_output_embeddings().weight
    else:
        mtp = {"token_layernorm.weight": extra["emb_norm"], "hidden_layernorm.weight": extra["hidden_norm"],
               "input_proj.weight": extra["fc"], "final_layernorm.weight": extra["norm"]} | block
        mtp = {f"model.mtp_layers.0.{k}": v for k, v in mtp.items()}
        extra["head"] = full.get_output_embeddings().weight
    cfg = AutoConfig.for_model(arch, **_values(case, n))
    cfg.bos_token_id, cfg.eos_token_id = 0, None
    cfg.num_nextn_predict_layers = 1
    if case in ("ernie", "mellum"):  # transformers' MtpModel reads the layer count from here
        cfg.num_mtp_layers = 1
        if case == "mellum":
            cfg.mtp_layer_types, cfg.mtp_mlp_layer_types = ["sliding_attention"], ["sparse"]
    path.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(path)
    tensors = {k: v.contiguous() for k, v in (state | mtp).items()}
    if shards == 1:
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    else:  # the MTP tensors split over two shards, as in a large model's checkpoint
        names = sorted(tensors)
        files = {}
        for i in range(shards):
            part = {k: tensors[k] for k in names[i::shards]}
            fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            save_file(part, str(path / fname), metadata={"format": "pt"})
            files |= dict.fromkeys(part, fname)
        (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": files}))
    return full, extra


def _target(path) -> LoadedModel:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().requires_grad_(False)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
    return LoadedModel(model, IdsTokenizer(), path.name, str(path))


class _PlainMla(torch.nn.Module):
    """LongCat's MTP layer as vLLM and SGLang build it: x + MLA(norm(x)), then + MLP(norm(.)), one dense MLP."""

    def __init__(self, cfg):
        super().__init__()
        from transformers.models.longcat_flash import modeling_longcat_flash as lc

        self.attn, self.mlp = lc.LongcatFlashMLA(cfg, 0), lc.LongcatFlashMLP(cfg)
        self.norm1, self.norm2 = (lc.LongcatFlashRMSNorm(cfg.hidden_size, cfg.rms_norm_eps) for _ in range(2))
        g = torch.Generator().manual_seed(11)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "norm" in name:
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))

    def published(self) -> dict[str, torch.Tensor]:
        names = {"attn.": "self_attn.", "mlp.": "transformer_layer.mlp.", "norm1.": "input_layernorm.",
                 "norm2.": "post_attention_layernorm."}
        return {next(v + k[len(p):] for p, v in names.items() if k.startswith(p)): t.clone()
                for k, t in self.state_dict().items()}

    def forward(self, x, attention_mask, position_ids, position_embeddings):
        x = x + self.attn(self.norm1(x), attention_mask=attention_mask, position_ids=position_ids,
                          position_embeddings=position_embeddings)[0]
        return x + self.mlp(self.norm2(x))


def _causal(t: int, window: int | None = None, start: int = 0) -> torch.Tensor:
    """The additive causal mask of ``t`` queries at positions start.. (keys further back than ``window`` masked)."""
    pos = torch.arange(start, start + t)
    far = pos[:, None] - pos[None, :]
    hidden = (far < 0) | (far >= window) if window else far < 0
    return torch.zeros(t, t).masked_fill(hidden, float("-inf"))[None, None]


def _reference_outputs(case: str, full, extra: dict, feats: torch.Tensor, toks: list[int]):
    """The MTP layer over (feature t, token t+1) pairs at positions 0.., causal, no cache: (layer output, normed)."""
    cfg = full.config
    eps, offset = cfg.rms_norm_eps, OFFSET.get(case, 0.0)
    pos = torch.arange(len(toks))
    emb = full.get_input_embeddings()(torch.tensor(toks))
    if case in ZEROED:
        emb[pos == 0] = 0.0
    parts = [_rms(emb, extra["emb_norm"], eps, offset), _rms(feats, extra["hidden_norm"], eps, offset)]
    x = torch.cat(parts[::-1] if case == "mimo" else parts, -1) @ extra["fc"].T  # MiMo reads [hidden; embedding]
    kw = {"layer_type": MTP_KIND[case][0]} if case in MTP_KIND else {}  # the sliding layers' own rotary table
    rot = full.model.rotary_emb(x[None], pos[None], **kw)
    out = extra["block"](x[None], attention_mask=_causal(len(toks), WINDOW.get(case)), position_ids=pos[None],
                         position_embeddings=rot)
    y = (out[0] if isinstance(out, tuple) else out)[0]
    return y, _rms(y, extra["norm"], eps, offset)


def _reference_chain(case: str, full, extra: dict, target: LoadedModel, context: list[int], depth: int) -> list[int]:
    """The MTP recursion without a cache: every step reruns the layer over all pairs so far, the last output becoming
    the next draft's feature (unnormed in DeepSeek's and ERNIE's layouts, normed in the others)."""
    with torch.no_grad():
        feats = target.model.base_model(torch.tensor([context[:-1]])).last_hidden_state[0]
        toks, drafts = list(context[1:]), []
        for _ in range(depth):
            y, normed = _reference_outputs(case, full, extra, feats, toks)
            drafts.append(int((normed[-1] @ extra["head"].T).argmax()))
            feats = torch.cat([feats, (normed if case in NORMED_FEEDBACK else y)[-1:]])  # fed back as vLLM does
            toks.append(drafts[-1])
    return drafts


def test_the_head_computes_the_published_layer_at_every_position(built):
    case, path, full, extra, target = built
    head = load_head_for(target, "mtp")
    ids = _prompts()[1]
    with torch.no_grad():
        feats = target.model.base_model(ids[None, :-1]).last_hidden_state[0]
        y, normed = _reference_outputs(case, full, extra, feats, ids[1:].tolist())
        mine = head(feats[None], ids[None, 1:], torch.arange(len(ids) - 1)[None], _causal(len(ids) - 1,
                                                                                         WINDOW.get(case)))[0]
        torch.testing.assert_close(mine, normed if case in NORMED_FEEDBACK else y)
        torch.testing.assert_close(head.draft_logits(mine), normed @ extra["head"].T)


@pytest.mark.parametrize("case", ["ernie", "mellum"])
def test_transformers_mtp_model_computes_the_same_logits(case, tmp_path):
    """Transformers' own ``MtpModel`` (its weight renaming, its layer built from the MTP config: ERNIE's dense layer and
    shared final norm, Mellum's sliding window and rotary table) loads the same checkpoint and gives the head's logits
    at every position (positions from 1: vLLM's zeroed first embedding is not in transformers)."""
    from transformers.modeling_layers import MtpModel

    _build(case, tmp_path / "model")
    target = _target(tmp_path / "model")
    theirs = MtpModel.from_pretrained(target.model).eval()
    head = load_head_for(target, "mtp")
    ids = _prompts()[1]
    t = len(ids) - 1
    pos = torch.arange(1, t + 1)[None]
    with torch.no_grad():
        feats = target.model.base_model(ids[None, :-1]).last_hidden_state
        expected = theirs._project_to_logits(theirs.forward_layer(0, feats, pos, None, input_ids=ids[None, 1:]))[0]
        mine = head.draft_logits(head(feats, ids[None, 1:], pos, _causal(t, WINDOW.get(case), start=1))[0])
    torch.testing.assert_close(mine, expected)


def _prompts() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, V, (k,), generator=g) for k in (7, 19)]
    prompts[1][10:16] = prompts[1][:6]
    return prompts


@pytest.fixture(scope="module", params=list(CASES))
def built(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / "model"
    full, extra = _build(request.param, path, shards=2 if request.param == "deepseek" else 1,
                         own_head=request.param == "deepseek")
    return request.param, path, full, extra, _target(path)


def test_every_rounds_chain_is_the_published_mtp_recursion(built):
    case, path, full, extra, target = built
    head = load_head_for(target, "mtp")
    assert isinstance(head, MtpHead) and head.layout == f"mtp-{'qwen3_next' if case == 'mellum' else case}"
    with pytest.raises(DraftTreeError, match="travels inside its model's checkpoint"):
        head.save(path.parent / "exported")
    with pytest.raises(DraftTreeError, match="nothing to export"):
        export_head(path, path.parent / "exported", "vllm")
    sm = SpeculativeModel(target, method="eagle-chain", head=head)
    checked = 0
    for prompt in _prompts():
        drafter = Recording(make_drafter("eagle-chain", target, head=head, depth=3))
        out = sm.generate(prompt, max_new_tokens=N, ignore_eos=True, logit_bias=BIAS, drafter=drafter)
        assert out.tokens == sm.generate(prompt, max_new_tokens=N, method="ar", ignore_eos=True,
                                         logit_bias=BIAS).tokens
        for context, chain in drafter.rounds:
            assert chain == _reference_chain(case, full, extra, target, context, len(chain)), len(context)
            checked += len(chain)
    assert checked > 0


def test_the_drafting_state_gives_the_layers_distributions(built):
    """The head's cached drafting state (its masks: the window of Mellum's sliding MTP layer) gives the cache-free
    reference's distribution at the root and at every depth of a chain drafted from it."""
    case, path, full, extra, target = built
    head = load_head_for(target, "mtp")
    ids = _prompts()[1].tolist()
    with torch.no_grad():
        feats = target.model.base_model(torch.tensor([ids[:-1]])).last_hidden_state[0]
        state = state_for(head)
        state.encode(feats, ids[1:], 0)
        lp, toks = state.root_logprobs(), ids[1:]
        for depth in range(1, 4):
            y, normed = _reference_outputs(case, full, extra, feats, toks)
            ref = torch.log_softmax(normed[-1] @ extra["head"].T, -1)
            torch.testing.assert_close(lp, ref)
            tok = int(ref.argmax())
            attend = torch.ones(1, depth, dtype=torch.bool)  # the chain's slots so far and itself
            lp = state.expand(torch.tensor([tok]), torch.tensor([depth - 2]), attend, depth)[0]
            feats = torch.cat([feats, (normed if case in NORMED_FEEDBACK else y)[-1:]])
            toks = [*toks, tok]


@pytest.mark.parametrize("method", ["eagle-chain", "eagle2", "auto"])
def test_every_method_gives_plain_decodings_tokens_with_an_mtp_layer(built, method):
    case, path, full, extra, target = built
    sm = SpeculativeModel(target, method=method, head=load_head_for(target, None))  # found in its own directory
    assert isinstance(sm.head, MtpHead)
    prompts = _prompts()
    with torch.no_grad():
        refs = [target.model.generate(p[None], attention_mask=torch.ones(1, p.numel(), dtype=torch.long),
                                      do_sample=False, max_new_tokens=N, min_new_tokens=N)[0, p.numel():].tolist()
                for p in prompts]
    assert [sm.generate(p, max_new_tokens=N, ignore_eos=True).tokens for p in prompts] == refs
    assert [r.tokens for r in sm.generate(list(prompts), max_new_tokens=N, ignore_eos=True)] == refs
    biased = [sm.generate(p, max_new_tokens=N, method="ar", ignore_eos=True, logit_bias=BIAS).tokens for p in prompts]
    outs = [sm.generate(p, max_new_tokens=N, ignore_eos=True, logit_bias=BIAS) for p in prompts]
    assert [o.tokens for o in outs] == biased
    if case == "deepseek" and method != "auto":  # its own LM head drafts the biased tokens: drafts were accepted
        assert sum(o.new_tokens for o in outs) > sum(o.target_forwards for o in outs)
    alone = [sm.generate(p, max_new_tokens=N, method="ar", ignore_eos=True, temperature=1.0, seed=5).tokens
             for p in prompts]
    assert [sm.generate(p, max_new_tokens=N, ignore_eos=True, temperature=1.0, seed=5).tokens
            for p in prompts] == alone


def test_mtp_misfits_get_one_line(tmp_path):
    _build("deepseek", tmp_path / "wide", width=32)  # eh_proj reads 2 x 32, the model is 64 wide
    target = _target(tmp_path / "wide")
    with pytest.raises(DraftTreeError, match="does not fit") as e:
        load_head_for(target, "mtp")
    assert "\n" not in str(e.value)
    with pytest.warns(UserWarning, match="drafting without the checkpoint's MTP layer"):
        assert load_head_for(target, None) is None  # the model still loads and decodes, without it
    _build("deepseek", tmp_path / "sharded", shards=2)
    (tmp_path / "sharded" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(DraftTreeError, match="could not read the MTP weights") as e:
        load_head_for(LoadedModel(target.model, IdsTokenizer(), "x", str(tmp_path / "sharded")), "mtp")
    assert "\n" not in str(e.value)
    plain = LoadedModel(target.model, IdsTokenizer(), "plain", "")
    with pytest.raises(DraftTreeError, match="--head mtp: the checkpoint of 'plain' .in memory. has no multi-token"):
        load_head_for(plain, "mtp")
    _build("deepseek", tmp_path / "fp8")  # FP8 weights (DeepSeek's published checkpoints): refused, not misread
    name = "model.layers.3.eh_proj.weight"
    with safe_open(str(tmp_path / "fp8" / "model.safetensors"), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    tensors[name] = tensors[name].to(torch.float8_e4m3fn)
    save_file(tensors, str(tmp_path / "fp8" / "model.safetensors"))
    with pytest.raises(DraftTreeError, match=r"is quantized \(model.layers.3.eh_proj.weight \(torch.float8_e4m3fn"):
        load_head_for(LoadedModel(target.model, IdsTokenizer(), "x", str(tmp_path / "fp8")), "mtp")


def test_an_mtp_projection_with_a_bias_is_read(tmp_path):
    """ERNIE's ``mtp_linear_proj`` may carry a bias (``use_bias``): the head reads it and adds it to the projection."""
    _build("ernie", tmp_path / "model")
    path = tmp_path / "model"
    target = _target(path)
    plain = load_head_for(target, "mtp")
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    bias = torch.randn(tensors["model.mtp_linear_proj.0.weight"].shape[0])
    save_file(tensors | {"model.mtp_linear_proj.0.bias": bias}, str(path / "model.safetensors"))
    head = load_head_for(target, "mtp")
    torch.testing.assert_close(head.fc.bias, bias, rtol=0, atol=0)
    x = torch.randn(3, head.fc.in_features)
    torch.testing.assert_close(head.fc(x), plain.fc(x) + bias)
    sm = SpeculativeModel(target, method="eagle2", head=head)
    for p in _prompts():
        assert sm.generate(p, max_new_tokens=N, ignore_eos=True).tokens == sm.generate(
            p, max_new_tokens=N, method="ar", ignore_eos=True).tokens


def test_an_fp8_mtp_layer_with_block_scales_is_dequantized(tmp_path):
    """DeepSeek-V3/R1 publish their MTP layer in FP8 with a float32 scale per 128 x 128 block (``weight_scale_inv``):
    the head's weights are each block times its scale (computed here block by block), and it decodes exactly."""
    _build("deepseek", tmp_path / "fp8")
    path = tmp_path / "fp8"
    target = _target(path)  # the target in float32 (transformers would quantize it with the config's FP8 settings)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(cfg | {"quantization_config": {"weight_block_size": [16, 16]}}))
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    expected = {}
    for name in ("model.layers.3.eh_proj.weight", "model.layers.3.mlp.experts.1.gate_proj.weight"):
        w = tensors[name]
        scale = torch.rand((w.shape[0] + 15) // 16, (w.shape[1] + 15) // 16) / 8 + 0.01
        q = torch.empty_like(w)
        for i in range(scale.shape[0]):
            for j in range(scale.shape[1]):
                q[16 * i:16 * i + 16, 16 * j:16 * j + 16] = w[16 * i:16 * i + 16, 16 * j:16 * j + 16] / scale[i, j]
        tensors[name] = q.to(torch.float8_e4m3fn)
        tensors[name + "_scale_inv"] = scale
        deq = torch.empty_like(w)
        for i in range(scale.shape[0]):
            for j in range(scale.shape[1]):
                deq[16 * i:16 * i + 16, 16 * j:16 * j + 16] = (
                    tensors[name][16 * i:16 * i + 16, 16 * j:16 * j + 16].float() * scale[i, j])
        expected[name] = deq.to(torch.bfloat16).float()
    save_file(tensors, str(path / "model.safetensors"))
    head = load_head_for(target, "mtp")
    torch.testing.assert_close(head.fc.weight, expected["model.layers.3.eh_proj.weight"], rtol=0, atol=0)
    gate_up = head.layers[0].mlp.experts.gate_up_proj[1]  # expert 1's gate rows, then its up rows
    gate = expected["model.layers.3.mlp.experts.1.gate_proj.weight"]
    torch.testing.assert_close(gate_up[:gate.shape[0]], gate, rtol=0, atol=0)
    sm = SpeculativeModel(target, method="eagle-chain", head=head)
    for p in _prompts():
        assert sm.generate(p, max_new_tokens=N, ignore_eos=True).tokens == sm.generate(
            p, max_new_tokens=N, method="ar", ignore_eos=True).tokens
