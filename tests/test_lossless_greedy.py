"""Greedy losslessness on the real default model in float32: every method == plain decoding, token for token."""

from __future__ import annotations

import copy

import pytest
import torch

from drafttree.api import SpeculativeModel
from drafttree.models import LoadedModel

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain the difference between a list and a tuple in Python, with examples.",
    "Repeat the following sentence three times, exactly: The quick brown fox jumps over the lazy dog.",
    "Here is some code:\n\ndef add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
    "Rewrite both functions with type hints and docstrings.",
    "List the first ten prime numbers and explain how you found them.",
    "Translate to French: Good morning, how are you today? I would like a cup of coffee.",
    "Summarize: The city council met on Tuesday to discuss the new park. The park will have a playground, "
    "a pond and walking trails. The council voted to approve the park, which will open next spring.",
    "What are three tips for staying productive while working from home?",
    'Copy this JSON and add a field "age": 30 to it: {"name": "Ana", "city": "Lisbon", "job": "engineer"}',
    "If a train travels 60 miles per hour for 2.5 hours, how far does it go? Show your steps.",
    "Write a haiku about autumn leaves.",
]

MAX_NEW = 64


def truncated_copy(lm: LoadedModel, layers: int) -> LoadedModel:
    """A draft that shares the target's vocabulary but disagrees often: its first ``layers`` layers only."""
    model = copy.deepcopy(lm.model)
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    return LoadedModel(model=model, tokenizer=lm.tokenizer, name=f"{lm.name}-first{layers}", source=lm.source)


@pytest.fixture(scope="module")
def references(default_fp32):
    """Plain decoding through transformers' own generate: the ground truth."""
    sm = SpeculativeModel(default_fp32, method="ar")
    refs = []
    for p in PROMPTS:
        ids = sm.encode_prompt(p)
        with torch.no_grad():
            out = default_fp32.model.generate(ids[None], attention_mask=torch.ones_like(ids)[None],
                                              max_new_tokens=MAX_NEW, do_sample=False)
        refs.append(out[0, ids.numel():].tolist())
    return refs


def _check_method(sm: SpeculativeModel, method: str, references, n: int | None = None) -> list[float]:
    taus = []
    for p, ref in list(zip(PROMPTS, references))[:n]:
        res = sm.generate(p, max_new_tokens=MAX_NEW, method=method)
        assert res.tokens == ref, f"{method} diverged on {p[:40]!r}"
        taus.append(res.tau)
    return taus


def test_ar_equals_transformers_generate(default_fp32, references):
    _check_method(SpeculativeModel(default_fp32, method="ar"), "ar", references)


def test_lookup_is_lossless(default_fp32, references):
    taus = _check_method(SpeculativeModel(default_fp32, method="lookup"), "lookup", references)
    assert max(taus) > 1.5, "prompt lookup should propose and get accepted on the copy-heavy prompts"


@pytest.mark.parametrize("opts", [{"k": 4}, {"k": 5, "tree": True, "top_k": 3, "total_tokens": 12}])
def test_draft_model_is_lossless(default_fp32, references, opts):
    draft = truncated_copy(default_fp32, 10)
    sm = SpeculativeModel(default_fp32, method="draft", draft=draft, **opts)
    taus = _check_method(sm, "draft", references, n=4)  # a 10-layer draft is slow on 2 cores: four prompts
    assert 1.0 < sum(taus) / len(taus) < 1.0 + opts["k"], "the truncated draft is accepted sometimes, not always"


# ------------------------------------------------------------------ the shipped EAGLE head and its LDLP

HEAD_METHODS = ["eagle-chain", "eagle1", "eagle2", "eagle-chain-threshold", "eagle-chain-ldlp",
                "eagle-chain-ldlp-threshold", "eagle2-ldlp"]


@pytest.fixture(scope="module")
def shipped(default_fp32):
    from drafttree.heads import load_head_for, shipped_head_dir

    assert shipped_head_dir(default_fp32.name) is not None, "the package must ship a head for the default model"
    head = load_head_for(default_fp32)
    assert (head.path / "ldlp.safetensors").exists(), "the shipped head must come with its trained LDLP"
    return SpeculativeModel(default_fp32, head=head)


@pytest.mark.parametrize("method", HEAD_METHODS)
def test_shipped_head_is_lossless(shipped, references, method):
    taus = _check_method(shipped, method, references)
    # a trained head is accepted well beyond one token per target forward on these chat prompts
    print(f"{method}: mean tau {sum(taus) / len(taus):.2f}")
    assert sum(taus) / len(taus) > 1.2, f"{method}: mean tau {sum(taus) / len(taus):.2f}"


# ------------------------------------------------------- one tree fed by every source (hybrid, auto, switch)

HYBRID_SETTINGS = [
    ("hybrid", {}),  # auto: machine-fitted tree size, gates on
    ("hybrid", {"gate": False, "total_tokens": 24}),  # big mixed trees every round
    ("hybrid", {"gate": False, "top_k": 1, "total_tokens": 8}),  # head chains merged with n-gram branches
    ("hybrid", {"sources": "ngram+head", "gate": False, "total_tokens": 24}),  # without the shipped corpus
    ("switch", {}),
]


@pytest.mark.parametrize("method,opts", HYBRID_SETTINGS, ids=lambda x: str(x))
def test_hybrid_with_the_shipped_head_is_lossless(shipped, references, method, opts):
    for p, ref in zip(PROMPTS, references):
        res = shipped.generate(p, max_new_tokens=MAX_NEW, method=method, method_options=opts)
        assert res.tokens == ref, f"{method} {opts} diverged on {p[:40]!r}"
    if method == "hybrid" and opts:
        accepts = shipped.drafter(method, opts).source_accepts
        assert all(a > 0 for a in accepts), f"both sources must get drafts accepted: {accepts}"


def test_auto_is_the_hybrid_and_lossless(shipped, references):
    assert shipped.method == "hybrid"
    assert [s.name for s in shipped.drafter().sources] == ["ngram", "corpus", "head"]
    _check_method(shipped, "hybrid", references)


def test_auto_with_nothing_loaded_is_the_budgeted_ngram_hybrid_and_lossless(default_fp32, references):
    """No head and no draft LM (any model of the user's own): auto is the hybrid with its n-gram source alone, sized
    on the cost curve, not prompt lookup's fixed trees; it drafts where the context repeats and stays exact."""
    sm = SpeculativeModel(default_fp32)
    assert sm.method == "hybrid" and sm.head is None and sm.draft is None
    assert [s.name for s in sm.drafter().sources] == ["ngram"]
    taus = _check_method(sm, "auto", references)
    assert max(taus) > 1.5, "the n-grams should get drafts accepted on the copy-heavy prompts"


@pytest.mark.parametrize("with_head,extend", [(False, False), (True, False), (False, True)])
def test_hybrid_with_a_draft_model_is_lossless(default_fp32, shipped, references, with_head, extend):
    draft = truncated_copy(default_fp32, 10)
    opts = {"extend": extend, "total_tokens": 24} if extend else {}  # a fixed size: every round drafts on
    sm = SpeculativeModel(default_fp32, draft=draft, head=shipped.head if with_head else None, **opts)
    assert sm.method == "hybrid"
    names = [s.name for s in sm.drafter().sources]
    assert names == (["ngram", "corpus", "head", "draft"] if with_head else ["ngram", "draft"])
    for p, ref in list(zip(PROMPTS, references))[:6]:
        assert sm.generate(p, max_new_tokens=MAX_NEW).tokens == ref
    if extend:
        assert sm.drafter().sources[-1].extended > 0, "the draft LM never drafted on after an n-gram branch"


def test_seeded_sampling_gives_plain_samplings_text_with_every_method(shipped, monkeypatch):
    """At T > 0 the seed fixes every position's sample (noise.py): every method gives the text plain sampling gives
    with that seed, token for token, also under a jittery clock (a loaded machine changes tree sizes, not text)."""
    import time as time_module

    prompt = PROMPTS[2]
    for sampling in ({"temperature": 1.0}, {"temperature": 0.7, "top_p": 0.9, "top_k": 40}):
        plain = shipped.generate(prompt, max_new_tokens=48, seed=7, method="ar", **sampling).tokens
        open_gates = {"gate": False, "total_tokens": 24}  # auto's gates may have closed in earlier generations
        for method, options in [("auto", None), ("hybrid", open_gates), ("eagle2", None), ("lookup", None),
                                ("eagle-chain", None), ("eagle1", None)]:
            res = shipped.generate(prompt, max_new_tokens=48, seed=7, method=method, method_options=options,
                                   **sampling)
            assert res.tokens == plain, f"{method} {sampling}: not plain sampling's text"
            if method not in ("auto", "lookup"):
                assert res.target_forwards < len(plain), f"{method}: no draft was ever accepted"
    rng = iter(torch.rand(100_000, generator=torch.Generator().manual_seed(0)).tolist())
    real = time_module.perf_counter
    offset = [0.0]

    def jittery() -> float:
        offset[0] += next(rng) * 0.05  # up to 50 ms of extra "time" per reading
        return real() + offset[0]

    monkeypatch.setattr(time_module, "perf_counter", jittery)
    plain = shipped.generate(prompt, max_new_tokens=48, temperature=1.0, seed=9, method="ar").tokens
    for method in ("hybrid", "eagle2"):
        assert shipped.generate(prompt, max_new_tokens=48, temperature=1.0, seed=9, method=method).tokens == plain
    assert shipped.generate(prompt, max_new_tokens=48, temperature=1.0, seed=10).tokens != plain


def test_a_seeded_batch_gives_each_rows_plain_sampling_text(shipped):
    """At T=1 row i of a batch (seed + i) is plain sampling's text with that seed, whoever shares its rounds."""
    prompts = PROMPTS[:3]
    rows = shipped.generate(prompts, max_new_tokens=32, temperature=1.0, seed=20)
    for i, (p, row) in enumerate(zip(prompts, rows)):
        assert row.tokens == shipped.generate(p, max_new_tokens=32, temperature=1.0, seed=20 + i, method="ar").tokens


def test_oracle_chain_is_the_full_chain_cut_where_the_target_rejects(shipped):
    """The benchmark's oracle drafts exactly what an 8-token chain gets accepted, and re-derives its reference
    when the output leaves it (as a bf16 near-tie can make it), instead of drafting nothing from then on."""
    from drafttree.bench.oracle import oracle_drafter

    prompt = PROMPTS[1]
    ids = shipped.encode_prompt(prompt)
    full = shipped.generate(ids, max_new_tokens=MAX_NEW, method="eagle-chain", method_options={"depth": 8})
    oracle = oracle_drafter(shipped, ids, MAX_NEW)
    res = shipped.generate(ids, max_new_tokens=MAX_NEW, drafter=oracle)
    assert res.tokens == full.tokens and res.stats.accept_lengths == full.stats.accept_lengths
    assert res.method == "eagle-chain-oracle" and oracle.untimed > 0

    wrong = oracle_drafter(shipped, ids, MAX_NEW)
    real = wrong.continuation
    calls = []

    def wrong_after_ten(context):  # the first reference goes wrong after 10 tokens; later ones are right
        out = real(context)
        calls.append(len(context))
        return out[:10] + [0] * (len(out) - 10) if len(calls) == 1 else out

    wrong.continuation = wrong_after_ten
    again = shipped.generate(ids, max_new_tokens=MAX_NEW, drafter=wrong)
    assert again.tokens == full.tokens and len(calls) == 2
    assert again.target_forwards <= full.target_forwards + 1, "one round cut short, then the reference is back"


# ------------------------------------------------------------------ batched decoding: rows sharing forwards


@pytest.mark.parametrize("method", ["ar", "auto"])
def test_batched_decoding_is_lossless(shipped, references, method):
    """Eleven prompts of different lengths, at most four rows at a time (rows join as others finish, the
    budget shrinks trees for the batch): every row equals plain decoding, token for token."""
    from drafttree.batching import AlwaysDraft, DraftOrPlain

    shipped.batch_policy = AlwaysDraft() if method != "ar" else DraftOrPlain()  # every round drafts: tested
    results = shipped.generate(PROMPTS, max_new_tokens=MAX_NEW, method=None if method == "auto" else method,
                               max_batch=4)
    shipped.batch_policy = DraftOrPlain()
    assert [r.tokens for r in results] == references
    if method != "ar":
        assert max(r.tau for r in results) > 1.3, "rows should accept drafts in a batch too"


def test_batched_head_pass_is_lossless(shipped, references):
    """Rows whose heads draft together (one head forward per level for all rows, the gate held open): every row
    equals plain decoding, and the head's drafts are accepted in the batch."""
    from drafttree.accept import Sampling
    from drafttree.batching import AlwaysDraft, BatchDecoder, Sequence
    from drafttree.batching.head_pass import HeadBatch
    from drafttree.drafters import make_drafter

    sm = shipped
    passes = HeadBatch()
    passes.gate.enabled = False
    dec = BatchDecoder(sm.batch_target(), sm.verify_cost(), AlwaysDraft(), head_batch=passes)  # every round drafts
    lengths = [48, 64, 30, 64]
    seqs = [Sequence(sm.encode_prompt(PROMPTS[i]), make_drafter("hybrid", sm.target, None, sm.head, batch_pass=True),
                     Sampling(), n, frozenset(sm.eos_ids)) for i, n in enumerate(lengths)]
    for s in seqs:
        dec.add(s)
    while dec.rows:
        dec.step()
    for s, n, ref in zip(seqs, lengths, references):
        assert s.tokens == ref[:n]
    head_accepts = sum(s.drafter.source_accepts[1] for s in seqs)
    assert passes.passes > 10 and head_accepts > 0


def test_batched_rows_packed_on_a_stepped_curve_are_lossless(shipped, references, monkeypatch):
    """Three rows on a curve with a free slot past their roots and a step at the 5th token (as AMX tiles step at the
    17th): each round the batch verifies its best node over all rows and the other rows' trees shrink to their roots
    (HybridDrafter.shrink, counted); every row equals plain decoding, and drafts are accepted."""
    from drafttree.accept import Sampling
    from drafttree.batching import AlwaysDraft, BatchDecoder, Sequence
    from drafttree.budget import CostModel
    from drafttree.drafters import make_drafter
    from drafttree.drafters.hybrid import HybridDrafter

    shrinks: list[int] = []
    real = HybridDrafter.shrink

    def counted(self, nodes):
        shrinks.append(nodes)
        return real(self, nodes)

    monkeypatch.setattr(HybridDrafter, "shrink", counted)
    sm = shipped
    # every round drafts: the packing is tested, not whether this machine's clock finds drafting pays
    dec = BatchDecoder(sm.batch_target(), CostModel([1, 4, 5, 8, 96], [1.0, 1.0, 3.0, 3.5, 60.0]), AlwaysDraft())
    dec.measure_excess = False  # the curve as written
    picks = [2, 3, 8]  # a sentence repeated, code rewritten, JSON copied: the n-grams draft
    seqs = [Sequence(sm.encode_prompt(PROMPTS[i]), make_drafter("hybrid", sm.target, None, sm.head), Sampling(),
                     MAX_NEW, frozenset(sm.eos_ids)) for i in picks]
    dec.add_many(seqs)
    while dec.rows:
        dec.step()
    for s, i in zip(seqs, picks):
        assert s.tokens == references[i]
    together = min(len(s.stats.tree_sizes) for s in seqs)  # the rounds all three rows shared
    assert all(sum(s.stats.tree_sizes[j] - 1 for s in seqs) <= 1 for j in range(together))
    assert len(shrinks) > 10 and max(s.stats.tau for s in seqs) > 1.2


def test_batched_rows_with_their_own_lengths_and_cancellation(shipped, references):
    """Rows finishing at different lengths, one cancelled mid-way: the others are unaffected."""
    from drafttree.accept import Sampling
    from drafttree.batching import BatchDecoder, Sequence
    from drafttree.drafters import make_drafter

    sm = shipped
    dec = BatchDecoder(sm.batch_target(), sm.verify_cost())
    lengths = [5, 40, 23, 64]
    seqs = [Sequence(sm.encode_prompt(PROMPTS[i]), make_drafter("hybrid", sm.target, None, sm.head), Sampling(), n,
                     frozenset(sm.eos_ids)) for i, n in enumerate(lengths)]
    victim = Sequence(sm.encode_prompt(PROMPTS[5]), make_drafter("lookup", sm.target, None, None), Sampling(), 64)
    for s in seqs[:2] + [victim] + seqs[2:]:
        dec.add(s)
    rounds = 0
    while dec.rows:
        dec.step()
        rounds += 1
        if rounds == 3:
            victim.cancelled = True
    for s, n, ref in zip(seqs, lengths, references):
        assert s.tokens == ref[:n] and s.stats.finish_reason in ("length", "stop")
    assert victim.stats.finish_reason == "cancelled" and 0 < len(victim.tokens) < 64
    assert victim.tokens == references[5][: len(victim.tokens)]


def test_newcomers_prefilled_together_equal_each_prefilled_alone(shipped):
    """Prompts packed into one prefill forward (each attending causally over itself only) give each prompt what its
    own prefill gives: logits, features (the head's inputs) and cache rows, in float32 up to summation order; the
    packing splits at ``MAX_PACKED_TOKENS``; a prompt the target refuses fails before any row is added."""
    from drafttree.batching import BatchTarget
    from drafttree.errors import DraftTreeError

    sm = shipped
    ids = [sm.encode_prompt(p) for p in PROMPTS[:5]]
    layers = getattr(sm.head, "aux_layers", None)
    alone, packed = BatchTarget(sm.target.model, layers), BatchTarget(sm.target.model, layers)
    assert packed.packs_prompts()
    packed.MAX_PACKED_TOKENS = sum(x.numel() for x in ids[:3])  # two packed forwards: 3 prompts, then 2
    ref = [alone.add(x) for x in ids]
    calls = []
    orig = packed._prefill_packed
    packed._prefill_packed = lambda group, need: calls.append(len(group)) or orig(group, need)
    got = packed.add_many(ids)
    assert calls == [3, 2] and packed.lens == alone.lens == [x.numel() for x in ids]
    for r, (a, b) in enumerate(zip(ref, got)):
        assert a.logits.shape == b.logits.shape and a.features.shape == b.features.shape
        assert torch.allclose(a.logits, b.logits, atol=1e-3, rtol=1e-4)
        assert int(a.logits.argmax()) == int(b.logits.argmax())
        assert torch.allclose(a.features, b.features, atol=1e-3, rtol=1e-4)
        n = ids[r].numel()
        for la, lb in zip(alone.cache.layers, packed.cache.layers):
            assert torch.allclose(la.keys[r, :, :n], lb.keys[r, :, :n], atol=1e-4, rtol=1e-4)
            assert torch.allclose(la.values[r, :, :n], lb.values[r, :, :n], atol=1e-4, rtol=1e-4)
    too_long = torch.ones(sm.target.model.config.max_position_embeddings, dtype=torch.long)
    with pytest.raises(DraftTreeError, match="context window"):
        packed.add_many([ids[0], too_long])
    assert packed.rows == 5


# ------------------------------------------------------------------ prefix caching (chat turns)

TURNS = ["Name three rivers in Europe.", "Which of them is the longest? Answer in one sentence.",
         "Now write a haiku about that river."]


def _converse(sm: SpeculativeModel, method: str, options: dict | None = None) -> list[tuple[list[int], int]]:
    """Three chat turns, each answer appended to the conversation: (answer tokens, cached prompt tokens) per turn."""
    messages, turns = [], []
    for turn in TURNS:
        messages.append({"role": "user", "content": turn})
        res = sm.generate(messages, max_new_tokens=40, method=method, method_options=options)
        messages.append({"role": "assistant", "content": res.text})
        turns.append((res.tokens, res.cached_tokens))
    return turns


def test_prefix_cached_chat_turns_are_lossless(default_fp32, shipped):
    """With ``prefix_cache`` the later turns compute only what is new, and every method still answers each turn
    with plain decoding's tokens -- those of a fresh prefill of the whole conversation too."""
    fresh = _converse(SpeculativeModel(default_fp32, method="ar"), "ar")
    assert all(cached == 0 for _, cached in fresh)
    cached_sm = SpeculativeModel(default_fp32, head=shipped.head, prefix_cache=True)
    draft = truncated_copy(default_fp32, 10)
    with_draft = SpeculativeModel(default_fp32, head=shipped.head, draft=draft, prefix_cache=True)
    for sm, method, options in [(cached_sm, "ar", None), (cached_sm, "auto", None),
                                (cached_sm, "hybrid", {"gate": False, "total_tokens": 24}),
                                (cached_sm, "eagle2", None), (with_draft, "auto", None)]:
        turns = _converse(sm, method, options)
        assert [t for t, _ in turns] == [t for t, _ in fresh], f"{method} {options}: not plain decoding's answers"
        prompt_lens = [sm.encode_prompt([{"role": "user", "content": TURNS[0]}]).numel()]
        assert all(cached > prompt_lens[0] for _, cached in turns[1:]), f"{method}: later turns were not cached"
