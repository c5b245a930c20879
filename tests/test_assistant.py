"""Gemma 4's assistant drafters (heads/assistant.py), loaded from a checkpoint directory as transformers saves them: the
chain they draft is the one transformers' own candidate generator drafts, every method that takes a head gives plain
decoding's tokens with one (float32; T=1 with a seed: plain sampling's), and one that does not fit its target is
refused in one line."""

from __future__ import annotations

import pytest
import torch
from test_architectures import IdsTokenizer
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
from transformers.generation.candidate_generator import SinglePositionMultiTokenCandidateGenerator
from transformers.models.gemma4_assistant import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

from drafttree.api import SpeculativeModel
from drafttree.drafters import make_drafter
from drafttree.errors import DraftTreeError
from drafttree.heads.loading import load_head
from drafttree.models import LoadedModel

V, H, N = 96, 64, 20
BIAS = {5: 30.0, 9: 30.0}  # the target (with this logit bias) writes tokens 5 and 9 only, in an order of its own
# the target: Gemma 4's text model with per-layer inputs and its last two layers reusing layers 0 and 1's keys
TEXT = dict(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=512, sliding_window=8,
            vocab_size_per_layer_input=V, hidden_size_per_layer_input=8, num_global_key_value_heads=2,
            global_head_dim=16, num_kv_shared_layers=2, layer_types=["sliding_attention", "full_attention"] * 2)


def _target() -> torch.nn.Module:
    cfg = AutoConfig.for_model("gemma4_text", **TEXT)
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = 0, None, 1
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval().requires_grad_(False)
    with torch.no_grad():  # sharpened: its greedy text repeats
        model.get_output_embeddings().weight.mul_(4.0)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _assistant(backbone: int = H, ordered: bool = False, **sizes) -> torch.nn.Module:
    text = dict(TEXT, num_hidden_layers=2, hidden_size=32, intermediate_size=64, vocab_size_per_layer_input=0,
                hidden_size_per_layer_input=0, num_kv_shared_layers=2, layer_types=["sliding_attention",
                                                                                    "full_attention"]) | sizes
    cfg = Gemma4AssistantConfig(text_config=text, backbone_hidden_size=backbone, use_ordered_embeddings=ordered,
                                num_centroids=8, centroid_intermediate_top_k=2)
    torch.manual_seed(1)
    model = Gemma4AssistantForCausalLM(cfg).eval()
    with torch.no_grad():  # it drafts one of the two tokens the target is biased to (BIAS), whichever its state says
        w = model.lm_head.weight
        a, b = BIAS
        w[a] = 10 * w[a]
        w[b] = -w[a]
        w[[i for i in range(V) if i not in BIAS]] = 0.0
        if ordered:
            model.masked_embedding.token_ordering.copy_(torch.randperm(V))
    return model


@pytest.fixture(scope="module")
def loaded():
    return LoadedModel(_target(), IdsTokenizer(), "tiny-gemma4", "")


@pytest.fixture(scope="module", params=[False, True], ids=["lm-head", "ordered-embeddings"])
def head_dir(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("assistant")
    _assistant(ordered=request.param).save_pretrained(path)
    return path


def _prompts() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, V, (n,), generator=g) for n in (7, 19, 12)]
    prompts[1][10:16] = prompts[1][:6]
    return prompts


def _candidates(assistant, model, context: list[int], depth: int) -> list[int]:
    """Transformers' candidate generator's chain after a fresh forward over ``context`` (ending with the root)."""
    ids = torch.tensor([context])
    with torch.no_grad():
        out = model(ids[:, :-1], output_hidden_states=True, return_shared_kv_states=True)
    assistant.generation_config.num_assistant_tokens = depth
    hf = SinglePositionMultiTokenCandidateGenerator(assistant, model.get_input_embeddings(),
                                                    GenerationConfig(max_length=1000))
    cand, _ = hf.get_candidates(ids, {"attention_mask": torch.ones_like(ids)}, out, is_first_iteration=False,
                                n_last_matches=0)
    return cand[0, ids.shape[1]:].tolist()


class Recording:
    """A drafter that keeps each round's context and proposal."""

    def __init__(self, inner):
        self.inner, self.name, self.rounds = inner, inner.name, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, req):
        tree = self.inner.propose(req)
        self.rounds.append((list(req.context), tree.tokens[1:].tolist()))
        return tree


def test_every_rounds_chain_is_the_one_transformers_candidate_generator_drafts(loaded, head_dir):
    head = load_head(head_dir, loaded)
    sm = SpeculativeModel(loaded, method="eagle-chain", head=head)
    accepted = 0
    for prompt in _prompts():
        drafter = Recording(make_drafter("eagle-chain", loaded, head=head, depth=4))
        out = sm.generate(prompt, max_new_tokens=N, ignore_eos=True, logit_bias=BIAS, drafter=drafter)
        assert out.tokens == sm.generate(prompt, max_new_tokens=N, method="ar", ignore_eos=True,
                                         logit_bias=BIAS).tokens
        accepted += out.new_tokens - out.target_forwards
        for context, chain in drafter.rounds:
            assert chain == _candidates(head.assistant, loaded.model, context, len(chain)), len(context)
    assert accepted > 0  # rounds that committed several tokens moved the state on by as many


@pytest.mark.parametrize("method,options", [("eagle-chain", {}), ("eagle2", {}), ("auto", {}),
                                            ("hybrid", {"sources": "head"})])
def test_every_method_gives_plain_decodings_tokens_with_an_assistant(loaded, head_dir, method, options):
    sm = SpeculativeModel(loaded, method=method, head=load_head(head_dir, loaded), **options)
    prompts = _prompts()
    with torch.no_grad():
        refs = [loaded.model.generate(p[None], attention_mask=torch.ones(1, p.numel(), dtype=torch.long),
                                      do_sample=False, max_new_tokens=N, min_new_tokens=N)[0, p.numel():].tolist()
                for p in prompts]
    assert [sm.generate(p, max_new_tokens=N, method="ar", ignore_eos=True).tokens for p in prompts] == refs
    assert [sm.generate(p, max_new_tokens=N, ignore_eos=True).tokens for p in prompts] == refs
    assert [r.tokens for r in sm.generate(list(prompts), max_new_tokens=N, ignore_eos=True)] == refs  # one by one
    biased = [sm.generate(p, max_new_tokens=N, method="ar", ignore_eos=True, logit_bias=BIAS).tokens for p in prompts]
    outs = [sm.generate(p, max_new_tokens=N, ignore_eos=True, logit_bias=BIAS) for p in prompts]
    assert [o.tokens for o in outs] == biased
    if method.startswith("eagle"):  # these draft every round (the hybrid drafts where its gates say it pays)
        assert sum(o.new_tokens for o in outs) > sum(o.target_forwards for o in outs)  # drafts were accepted
    for kw in ({}, {"logit_bias": BIAS}):  # T=1 with a seed: plain sampling's tokens
        alone = [sm.generate(p, max_new_tokens=N, method="ar", ignore_eos=True, temperature=1.0, seed=5, **kw).tokens
                 for p in prompts]
        assert [sm.generate(p, max_new_tokens=N, ignore_eos=True, temperature=1.0, seed=5, **kw).tokens
                for p in prompts] == alone


def test_an_assistant_that_does_not_fit_its_target_gets_one_line(loaded, tmp_path):
    _assistant(backbone=2 * H).save_pretrained(tmp_path / "wide")
    with pytest.raises(DraftTreeError, match="backbone hidden size 128 vs target 64") as e:
        load_head(tmp_path / "wide", loaded)
    assert "\n" not in str(e.value)
    _assistant(head_dim=8, global_head_dim=8).save_pretrained(tmp_path / "narrow")
    with pytest.raises(DraftTreeError, match="reads keys 16 wide in 2 heads from target layer 0, not 8 wide") as e:
        load_head(tmp_path / "narrow", loaded)
    assert "\n" not in str(e.value)
    cfg = AutoConfig.for_model("llama", vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2)
    llama = LoadedModel(AutoModelForCausalLM.from_config(cfg).eval(), IdsTokenizer(), "tiny-llama", "")
    _assistant().save_pretrained(tmp_path / "ok")
    with pytest.raises(DraftTreeError, match="sliding_attention") as e:  # no sliding layers to lend their keys
        load_head(tmp_path / "ok", llama)
    assert "\n" not in str(e.value)


def test_the_server_serves_with_an_assistant_one_request_at_a_time(loaded, tmp_path):
    """Concurrent completions with an assistant head (the scheduler feeds batching/one_by_one.py): each answered with
    its prompt's greedy text, streams end with [DONE]."""
    import json
    import threading

    from server_client import post, request, sse_events

    from drafttree.server import ServerThread, create_app

    _assistant().save_pretrained(tmp_path)
    sm = SpeculativeModel(loaded, method="eagle2", head=load_head(tmp_path, loaded))
    prompts = _prompts()[:2]
    texts = [sm.generate(p, max_new_tokens=N, method="ar", ignore_eos=True).text for p in prompts]
    srv = ServerThread(create_app(sm, max_body_bytes=64 * 1024)).start()
    try:
        results: dict[int, object] = {}

        def ask(i):
            body = {"model": "tiny-gemma4", "prompt": prompts[i % 2].tolist(), "max_tokens": N, "ignore_eos": True,
                    "temperature": 0}
            if i % 2:
                status, _, data = request(srv, "POST", "/v1/completions", body | {"stream": True})
                events = sse_events(data)
                results[i] = (status, events[-1], "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]
                                                         if json.loads(e)["choices"]))
            else:
                status, out = post(srv, "/v1/completions", body)
                results[i] = (status, "[DONE]", out["choices"][0]["text"])

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert all(results[i] == (200, "[DONE]", texts[i % 2]) for i in range(4)), results
    finally:
        srv.stop()
