"""Models that cannot verify a tree (recurrent and hybrid layers, ALiBi) verify chains (chain_target.py): every method
gives Hugging Face's own greedy text on tiny random models, alone and for a list of prompts, with a random EAGLE-3
head, and at T=1 with a seed plain sampling's; a target that forgets to put the state back fails the same check."""

from __future__ import annotations

import math

import pytest
import torch
from test_architectures import IdsTokenizer  # token ids as text, for models without a tokenizer
from transformers import AutoConfig, AutoModelForCausalLM

from drafttree.api import SpeculativeModel
from drafttree.chain_target import ChainTarget, target_for
from drafttree.errors import DraftTreeError
from drafttree.heads import Eagle3Head
from drafttree.models import LoadedModel
from drafttree.target import TargetModel
from drafttree.tree import DraftTree

V, H, N = 96, 64, 20
BASE = dict(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, head_dim=16)
ARCHS = {  # a gated delta net (Qwen3.5), short convolutions (LFM2), Mamba-2 mixers (Granite 4), ALiBi (BLOOM)
    "qwen3_5_text": dict(layer_types=["linear_attention", "full_attention"] * 2, linear_num_key_heads=2,
                         linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16),
    "lfm2": dict(layer_types=["conv", "full_attention"] * 2, block_ff_dim=2 * H),
    "granitemoehybrid": dict(layer_types=["mamba", "attention"] * 2, mamba_n_heads=4, mamba_d_head=32,
                             mamba_d_state=8, num_local_experts=2, num_experts_per_tok=1),
    "bloom": dict(n_layer=2, n_head=4),
    "falcon_mamba": dict(state_size=8),  # its scan steps the tokens of a forward (recorded past states)
}


def _model(arch: str) -> torch.nn.Module:
    cfg = AutoConfig.for_model(arch, **(BASE | ARCHS[arch]))
    cfg.bos_token_id, cfg.eos_token_id = 0, None
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval().requires_grad_(False)
    with torch.no_grad():  # sharpen the random model: its greedy text repeats, so drafts get accepted
        model.get_output_embeddings().weight.mul_(4.0)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
    return model


def _prompts() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, V, (n,), generator=g) for n in (7, 19)]
    prompts[1][10:16] = prompts[1][:6]  # a repeat for the n-grams
    return prompts


def _hf_greedy(model, prompt: torch.Tensor) -> list[int]:
    with torch.no_grad():
        out = model.generate(prompt[None], do_sample=False, max_new_tokens=N, min_new_tokens=N)
    return out[0, prompt.numel():].tolist()


@pytest.mark.parametrize("arch", list(ARCHS))
def test_every_method_gives_hugging_faces_greedy_text_on_a_chain_model(arch):
    model = _model(arch)
    prompts = _prompts()
    refs = [_hf_greedy(model, p) for p in prompts]
    lm = LoadedModel(model, IdsTokenizer(), f"tiny-{arch}", "")
    sm = SpeculativeModel(lm, method="lookup")
    assert isinstance(sm._runner, ChainTarget)
    taus = []
    for method in ("ar", "lookup", "auto"):
        outs = [sm.generate(p, max_new_tokens=N, method=method, ignore_eos=True) for p in prompts]
        assert [o.tokens for o in outs] == refs, method
        taus.append(max(o.tau for o in outs))
    assert taus[1] > 1.0, "some of the n-grams' drafts are accepted"
    assert [r.tokens for r in sm.generate(list(prompts), max_new_tokens=N, ignore_eos=True)] == refs, "a list"
    torch.manual_seed(3)
    head = Eagle3Head(model, draft_vocab=torch.arange(2, V), target_name=lm.name).eval()
    hm = SpeculativeModel(lm, method="eagle2", head=head)
    assert [hm.generate(p, max_new_tokens=N, ignore_eos=True).tokens for p in prompts] == refs, "eagle2"
    alone = [sm.generate(p, max_new_tokens=N, method="ar", ignore_eos=True, temperature=1.0, seed=5 + i).tokens
             for i, p in enumerate(prompts)]
    batch = sm.generate(list(prompts), max_new_tokens=N, method="lookup", ignore_eos=True, temperature=1.0, seed=5)
    assert [r.tokens for r in batch] == alone


def test_a_chain_target_that_does_not_put_the_state_back_fails_the_check(monkeypatch):
    """The check above can fail: without the rollback, rejected drafts stay in the recurrent state."""
    model = _model("qwen3_5_text")
    prompts = _prompts()
    refs = [_hf_greedy(model, p) for p in prompts]
    sm = SpeculativeModel(LoadedModel(model, IdsTokenizer(), "tiny-qwen3_5", ""), method="lookup")
    assert [sm.generate(p, max_new_tokens=N, ignore_eos=True).tokens for p in prompts] == refs
    monkeypatch.setattr(ChainTarget, "_restore", lambda self: None)
    assert [sm.generate(p, max_new_tokens=N, ignore_eos=True).tokens for p in prompts] != refs


def test_a_tree_becomes_its_first_chain():
    tree = DraftTree.from_parents(torch.tensor([5, 6, 7, 8, 9, 10]), torch.tensor([-1, 0, 0, 1, 1, 3]))
    chain = tree.first_chain()
    assert chain.tokens.tolist() == [5, 6, 8, 10] and chain.depths.tolist() == [0, 1, 2, 3]
    assert DraftTree.chain(5, [6, 7]).first_chain().tokens.tolist() == [5, 6, 7]


def test_chain_models_refuse_trees_batches_and_broken_scans_in_one_line():
    model = _model("lfm2")
    assert isinstance(target_for(model), ChainTarget)
    for make, message in ((lambda: TargetModel(model), "conv layers carry a recurrent state"),
                          (lambda: SpeculativeModel(LoadedModel(model, IdsTokenizer(), "t", "")).batch_target(),
                           "decodes one sequence at a time")):
        with pytest.raises(DraftTreeError, match=message) as e:
            make()
        assert "\n" not in str(e.value)
    cfg = AutoConfig.for_model("minimax", **(BASE | dict(layer_types=["linear_attention", "full_attention"] * 2,
                                                         num_local_experts=2)))
    own_cache = target_for(AutoModelForCausalLM.from_config(cfg).eval())
    with pytest.raises(DraftTreeError, match="does not take transformers' DynamicCache") as e:
        own_cache.prefill(torch.arange(2, 9))
    assert "\n" not in str(e.value)


def _chunk_against_steps(target: ChainTarget) -> float:
    """How far a 10-token chain's logits are from the same tokens verified one by one (share of their spread)."""
    ids = torch.randint(2, V, (40,), generator=torch.Generator().manual_seed(0))
    target.prefill(ids[:30])
    chain = DraftTree.chain(int(ids[30]), ids[31:])
    chunk = target.forward_tree(chain.tokens, chain.depths, chain.ancestors).logits.float()
    target.prefill(ids[:30])
    steps = []
    for i in range(30, 40):
        one = DraftTree.chain(int(ids[i]), [])
        steps.append(target.forward_tree(one.tokens, one.depths, one.ancestors).logits.float())
        target.commit([0])
    steps = torch.cat(steps)
    return float((chunk - steps).abs().max() / steps.std())


def test_a_mamba_scan_steps_a_chain_from_the_cached_state_and_the_check_refuses_one_that_does_not():
    """transformers' Falcon-Mamba scan starts a multi-token forward from a zero state: with its layers recording
    past states a chain's logits are the token-by-token ones; without, they are not, and the first prefill's check
    refuses the model in one line."""
    model = _model("falcon_mamba")
    target = target_for(model)
    assert target.steps and _chunk_against_steps(target) < 1e-5
    target.steps = False  # transformers' multi-token path as it is
    assert _chunk_against_steps(target) > 1e-2
    fresh = ChainTarget(model)
    fresh.steps = False
    with pytest.raises(DraftTreeError, match="does not give what it gives token by token") as e:
        fresh.prefill(torch.arange(2, 9))
    assert "\n" not in str(e.value)


def test_the_server_serves_a_chain_model_one_request_at_a_time():
    """Concurrent completions on a model with recurrent layers: each answered with its prompt's greedy text (the
    scheduler feeds batching/one_by_one.py), streams end with [DONE]; the server keeps serving."""
    import json
    import threading

    from server_client import post, request, sse_events

    from drafttree.server import ServerThread, create_app

    model = _model("lfm2")
    prompts = _prompts()
    refs = [_hf_greedy(model, p) for p in prompts]
    sm = SpeculativeModel(LoadedModel(model, IdsTokenizer(), "tiny-lfm2", ""), method="lookup")
    srv = ServerThread(create_app(sm, max_body_bytes=64 * 1024)).start()
    try:
        results: dict[int, object] = {}

        def ask(i):
            body = {"model": "tiny-lfm2", "prompt": prompts[i % 2].tolist(), "max_tokens": N, "ignore_eos": True,
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
        texts = ["".join(f"<{t}>" for t in r) for r in refs]
        assert all(results[i] == (200, "[DONE]", texts[i % 2]) for i in range(4)), results
    finally:
        srv.stop()


def test_the_hybrid_drafter_gives_a_chain_target_its_best_rated_chain():
    """Merged nodes are numbered source by source, not by rating: the chain follows the ratings (an n-gram's unlikely
    first child before the head's likely one must not win)."""
    from drafttree.drafters.merged import MergedTree

    merged = MergedTree(5)
    merged.tokens += [11, 21, 22, 23]
    merged.parents += [0, 0, 2, 3]
    merged.scores += [math.log(0.1), math.log(0.9), math.log(0.81), math.log(0.73)]
    assert merged.best_chain(merged.best(5)) == [0, 2, 3, 4]
    assert merged.best_chain(merged.best(3)) == [0, 2, 3]
    assert merged.best_chain([0]) == [0]


def test_a_request_whose_prefill_fails_never_becomes_the_row():
    """The one-at-a-time decoder (the server's, for chain models): a failed prefill raises and leaves no row behind,
    so the scheduler answers that request once (its error) and goes on."""
    from drafttree.batching.decode import Sequence
    from drafttree.batching.one_by_one import OneByOneDecoder
    from drafttree.drafters import make_drafter

    lm = LoadedModel(_model("lfm2"), IdsTokenizer(), "tiny-lfm2", "")
    dec = SpeculativeModel(lm, method="lookup").batch_decoder()
    assert isinstance(dec, OneByOneDecoder) and dec.target.max_rows == 1
    with pytest.raises(DraftTreeError, match="empty prompt"):
        dec.add(Sequence(torch.zeros(0, dtype=torch.long), make_drafter("lookup", lm), max_new_tokens=4))
    assert dec.rows == 0 and dec.step() == []
    seq = Sequence(_prompts()[0], make_drafter("lookup", lm), max_new_tokens=4)
    out = list(dec.add(seq))
    while not seq.finished:
        out += [t for _, new in dec.step() for t in new]
    assert out == _hf_greedy(lm.model, _prompts()[0])[:4] and dec.step() == [] and dec.rows == 0


def test_a_ranked_tree_becomes_its_best_rated_chain():
    tree = DraftTree.from_parents(torch.tensor([5, 6, 7, 8, 9]), torch.tensor([-1, 0, 0, 2, 2]))
    tree.scores = torch.tensor([0.0, math.log(0.2), math.log(0.7), math.log(0.3), math.log(0.6)])
    chain = tree.first_chain()
    assert chain.tokens.tolist() == [5, 7, 9] and abs(chain.expected_accept - 1.3) < 1e-6


def test_chains_on_the_real_default_model_give_plain_decodings_tokens_in_float32(default_fp32):
    """The chain path (snapshot, rollback, replay, the hybrid's best chain with the shipped head) on the real default
    model, verifying chains as a recurrent model would: every method gives plain decoding's tokens in float32."""
    from drafttree.heads import load_head_for

    head = load_head_for(default_fp32, None)
    sm = SpeculativeModel(default_fp32, method="auto", head=head)
    prompts = ["Write a Python function that reverses a list, then call it on [1, 2, 3].",
               "Repeat after me three times: the quick brown fox jumps over the lazy dog."]
    refs = [sm.generate([{"role": "user", "content": p}], max_new_tokens=48, method="ar").tokens for p in prompts]
    sm._runner = ChainTarget(default_fp32.model, getattr(head, "aux_layers", None))
    for method in ("auto", "lookup", "eagle2"):
        outs = [sm.generate([{"role": "user", "content": p}], max_new_tokens=48, method=method) for p in prompts]
        assert [o.tokens for o in outs] == refs, method
        assert max(o.tau for o in outs) > 1.2, method


def test_an_eagle3_head_trains_for_a_hybrid_model_and_drafts_exactly(default_fp32, tmp_path):
    """Self-distillation (one prompt at a time: a recurrent state would take the left padding in), feature
    extraction, EAGLE-3 training and decoding with the trained head, on a tiny LFM2 with the default model's
    tokenizer (a chat template): the distilled answers are the model's greedy ones and the head's decoding is exact."""
    import json

    from drafttree.heads import load_head_for
    from drafttree.train.data import extract_features, iter_distilled, read_prompts, self_distill
    from drafttree.train.head import TrainConfig, train_head

    cfg = AutoConfig.for_model("lfm2", **(BASE | ARCHS["lfm2"] | dict(vocab_size=default_fp32.vocab_size)))
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = 1, 2, 2
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval().requires_grad_(False)
    lm = LoadedModel(model, default_fp32.tokenizer, "tiny-lfm2-chat", "")
    texts = ["Name a colour.", "Count to five.", "Say hi."]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps({"id": str(i), "messages": [{"role": "user", "content": t}]})
                                                for i, t in enumerate(texts)))
    assert self_distill(lm, read_prompts(tmp_path / "p.jsonl"), tmp_path / "d.jsonl", batch_size=2,
                        max_new_tokens=12, show_progress=False)["samples"] == 3
    for rec in iter_distilled(tmp_path / "d.jsonl"):
        ids = torch.tensor([rec["prompt_ids"]])
        ref = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=2, pad_token_id=2)[0, ids.shape[1]:]
        assert rec["response_ids"] == ref.tolist()[: len(rec["response_ids"])]
    assert extract_features(lm, tmp_path / "d.jsonl", tmp_path / "f", shard_size=4, show_progress=False,
                            aux_layers=[0, 1, 3])["samples"] == 3
    train_head(lm, TrainConfig(features=str(tmp_path / "f"), out=str(tmp_path / "run"), epochs=1, batch_tokens=256,
                               draft_vocab=512, eval_samples=1, eval_every=0, save_every=1, ttt_steps=2, max_steps=2,
                               mixed_precision="no", warmup_steps=1, head_kind="eagle3"), show_progress=False)
    head = load_head_for(lm, str(tmp_path / "run" / "head"), required=True)
    prompt = _prompts()[1] + 100
    sm = SpeculativeModel(lm, method="eagle2", head=head)
    out = sm.generate(prompt, max_new_tokens=N, ignore_eos=True)
    assert out.tokens == _hf_greedy(model, prompt)
