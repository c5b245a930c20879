"""Models that cannot verify a tree (recurrent and hybrid layers, ALiBi) verify chains (chain_target.py): every method
gives Hugging Face's own greedy text on tiny random models, alone and for a list of prompts, with a random EAGLE-3
head, and at T=1 with a seed plain sampling's; a target that forgets to put the state back fails the same check."""

from __future__ import annotations

import pytest
import torch
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
}


class IdsTokenizer:
    all_special_ids: list[int] = []
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"<{int(i)}>" for i in ids)


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
    cfg = AutoConfig.for_model("mamba", hidden_size=H, num_hidden_layers=2, state_size=4, vocab_size=V)
    mamba = AutoModelForCausalLM.from_config(cfg)
    with pytest.raises(DraftTreeError, match="from a zero state") as e:
        target_for(mamba)
    assert "\n" not in str(e.value)
