"""Structured output (grammar.py): every tree node restricted to what the grammar allows after its own path, every
method exact for the constrained target (greedy: plain decoding's tokens under the same grammar; sampling: the
constrained distribution, against references computed here; a rule that masks every node as the root must fail),
llguidance's masks as its matcher gives them, and bad constraints as one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from drafttree import DraftTreeError, SpeculativeModel
from drafttree.accept import Sampling
from drafttree.grammar import Grammar, GrammarState, unpack, words
from drafttree.tree import DraftTree

VOCAB, PROMPT, ENDS = 12, [3, 5, 7, 2], {4}


def toy_allowed(out: list[int]) -> list[int]:
    """A path-dependent toy grammar over 12 tokens, written plainly: the next token t must keep the output's sum plus
    t off the multiples of 3, may not repeat the last token, and the end token (4) comes only after 2 tokens."""
    last = out[-1] if out else -1
    ok = [t for t in range(VOCAB) if (sum(out) + t) % 3 and t != last]
    return [t for t in ok if t != 4 or len(out) >= 2]


class ToyState(GrammarState):
    vocab = VOCAB

    def __init__(self):
        super().__init__()
        self.out: list[int] = []

    def _fill(self, row):
        bits = torch.zeros(VOCAB, dtype=torch.bool)
        bits[toy_allowed(self.out)] = True
        row[:] = pack(bits[None])[0].numpy()

    def _push(self, token):  # (a forbidden token in the output shows as an impossible outcome in the chi-square tests)
        self.out.append(token)

    def _pop(self, n):
        del self.out[len(self.out) - n:]

    def _stopped(self):
        return False


class Toy(Grammar):
    def start(self):
        return ToyState()


def pack(allowed: torch.Tensor) -> torch.Tensor:
    """[n, vocab] bool -> [n, words] int32 bitmasks (the tests' own packing)."""
    n, v = allowed.shape
    out = torch.zeros(n, words(v), dtype=torch.int64)
    for t in range(v):
        out[:, t // 32] |= allowed[:, t].long() << (t % 32)
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)


def test_bitmasks_unpack_as_packed():
    g = torch.Generator().manual_seed(0)
    for v in (1, 31, 32, 33, 100):
        allowed = torch.rand(5, v, generator=g) < 0.5
        assert torch.equal(unpack(pack(allowed).numpy(), v), allowed)


@pytest.mark.parametrize("vocab", [64, 100, 49152])
def test_logits_are_masked_as_the_bits_say(vocab, monkeypatch):
    """The kernel's word-by-word masking and torch's fallback: -inf exactly where a bit is 0, words whole, empty and
    partial, a vocabulary that ends inside a word."""
    from drafttree.grammar import mask_logits
    from drafttree.kernels import gemm

    g = torch.Generator().manual_seed(vocab)
    allowed = torch.rand(6, vocab, generator=g) < 0.7
    allowed[1] = True
    allowed[2] = False
    allowed[3, : vocab // 2] = False
    bits = pack(allowed).numpy()
    z = torch.randn(6, vocab, generator=g)
    want = torch.where(allowed, z, torch.tensor(float("-inf")))
    assert torch.equal(mask_logits(z.clone(), bits), want)
    monkeypatch.setattr(gemm, "small_gemm", lambda: None)  # as on a machine without the kernel
    assert torch.equal(mask_logits(z.clone(), bits), want)


def test_every_node_is_masked_for_its_own_path():
    # nodes 2 and 4 are forbidden (sums 9 and 15), so 5 and 6 are never reached; 1 -> 3 -> 7 -> 8 is allowed
    tokens = torch.tensor([5, 1, 2, 3, 7, 1, 8, 2, 4])
    parents = torch.tensor([-1, 0, 0, 1, 1, 2, 4, 3, 7])
    tree = DraftTree.from_parents(tokens, parents)
    state = ToyState()
    out = [2, 5]  # the output so far; the root (node 0) is its last token
    state.sync(out)
    got = state.masks(tree)
    for i in range(tree.size):
        path = [int(tokens[j]) for j in tree.path_to(i)[1:]]
        prefix = out + path
        reachable = all(prefix[k] in toy_allowed(prefix[:k]) for k in range(len(out), len(prefix)))
        want = torch.zeros(VOCAB, dtype=torch.bool)
        if reachable:
            want[toy_allowed(prefix)] = True
        else:
            want[:] = True  # never reached by the walk: left as it is
        assert torch.equal(got[i], want), i
    assert [bool(got[i].all()) for i in range(tree.size)] == [False, False, True, False, True, True, True, False, False]
    assert state.out == out  # the walk put the state back


def _pvalues(s: Sampling, n: int = 2000):
    """The constrained target's laws of the first three tokens (test_sampling.tree_pvalues), the toy grammar's mask
    written plainly (toy_allowed)."""
    from tests.test_sampling import tree_pvalues

    def next_logits(model, out: list[int]) -> np.ndarray:
        with torch.no_grad():
            logits = model(torch.tensor([PROMPT + out])).logits[0, -1].double().numpy()
        z = np.full(VOCAB, -np.inf)
        ok = toy_allowed(out)
        z[ok] = logits[ok]
        return z
    return tree_pvalues(s, next_logits, PROMPT, ENDS, n, seed=5)


@pytest.mark.parametrize("s", [Sampling(1.0, grammar=Toy()), Sampling(0.7, top_k=5, grammar=Toy())],
                         ids=["T1", "T0.7-topk"])
def test_trees_sample_the_constrained_distribution(s):
    p12, p3 = _pvalues(s)
    assert p12 > 1e-3 and p3 > 1e-3, f"p(first two)={p12:.2e} p(third)={p3:.2e}"


def test_a_rule_that_masks_every_node_as_the_root_is_caught(monkeypatch):
    """The tempting bug: one mask per round (what may follow the output), used for every node of the tree."""
    real = GrammarState.bitmasks

    def rootwise(self, tree):
        return np.repeat(real(self, DraftTree.root_only(0)), tree.size, axis=0)

    monkeypatch.setattr(GrammarState, "bitmasks", rootwise)
    p12, p3 = _pvalues(Sampling(1.0, grammar=Toy()), n=1500)
    assert min(p12, p3) < 1e-4, f"a path-blind mask went unnoticed (p={p12:.2e}, {p3:.2e})"


# ------------------------------------------------------------------------------------- llguidance, the real tokenizer

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "age", "city"], "additionalProperties": False}
PERSON = "Give me a JSON record for a person named Alice who is 31 and lives in Paris."


@pytest.fixture(scope="module")
def sm(default_fp32):
    return SpeculativeModel(default_fp32, method="auto")


def test_llguidance_masks_are_its_matchers_for_each_path(sm):
    import llguidance

    g = sm.sampling(json_schema=SCHEMA).grammar
    tok = sm.tokenizer
    text = '{"name": "Al'
    ids = tok(text, add_special_tokens=False).input_ids
    state = g.start()
    state.sync(ids[:2])
    # a tree from the output's last token: the true continuation, a sibling the grammar forbids, and children
    rest = ids[2:]
    bad = tok("}}", add_special_tokens=False).input_ids[0]
    tokens = [ids[1], rest[0], bad, *rest[1:3]]
    parents = [-1, 0, 0, 1, 3][: len(tokens)]
    tree = DraftTree.from_parents(torch.tensor(tokens), torch.tensor(parents))
    got = state.masks(tree)
    for i in range(tree.size):
        path = [tokens[j] for j in tree.path_to(i)[1:]]
        m = llguidance.LLMatcher(g.tokenizer, g.text, log_level=0)
        assert m.consume_tokens(ids[:2])
        if m.try_consume_tokens(path) < len(path):
            assert bool(got[i].all()), "a forbidden node's row is left as it is"
            continue
        want = unpack(np.frombuffer(m.compute_bitmask(), dtype=np.int32)[None], sm.target.vocab_size)
        assert torch.equal(got[i], want[0]), i
    assert not bool(got[0, bad]) and bool(got[0, rest[0]])


@pytest.mark.parametrize("kwargs", [{"json_schema": SCHEMA}, {"json_schema": True},
                                    {"regex": r"(\d{3}) \d{3}-\d{4}"}, {"choice": ["Paris", "London", "Rome"]},
                                    {"grammar": 'start: "The answer is " ("yes" | "no") "."'}])
def test_every_method_gives_plain_decodings_text_under_the_grammar(sm, kwargs):
    prompt = ("Where does Alice live? Answer in one word." if "json_schema" not in kwargs
              else PERSON if kwargs["json_schema"] is not True else "Describe a cat in two sentences.")
    plain = sm.generate(prompt, max_new_tokens=48, method="ar", **kwargs)
    free = sm.generate(prompt, max_new_tokens=48, method="ar")
    assert plain.tokens != free.tokens  # the grammar changed the text
    for method in ("lookup", "hybrid", "auto"):
        assert sm.generate(prompt, max_new_tokens=48, method=method, **kwargs).tokens == plain.tokens, method
    if "json_schema" in kwargs and plain.finish_reason == "stop":
        value = json.loads(plain.text)
        assert isinstance(value, dict) and (kwargs["json_schema"] is True or set(value) == set(SCHEMA["properties"]))
    if "choice" in kwargs:
        assert plain.text in kwargs["choice"] and plain.finish_reason == "stop"
    both = sm.generate([prompt, "Say hi."], max_new_tokens=48, **kwargs)  # a batch: each row its own state
    assert both[0].tokens == plain.tokens
    assert both[1].tokens == sm.generate("Say hi.", max_new_tokens=48, method="ar", **kwargs).tokens


def test_seeded_sampling_under_a_schema_is_plain_samplings_text(sm):
    kw = dict(max_new_tokens=48, temperature=1.0, top_p=0.95, seed=3, json_schema=SCHEMA)
    plain = sm.generate(PERSON, method="ar", **kw)
    assert sm.generate(PERSON, **kw).tokens == plain.tokens
    assert sm.generate([PERSON, PERSON], **kw)[0].tokens == plain.tokens


@pytest.mark.parametrize("kwargs,needle", [
    ({"json_schema": "{not json"}, "json_schema is not valid JSON"),
    ({"json_schema": [1, 2]}, "json_schema must be"),
    ({"json_schema": {"type": "object"}, "regex": "a+"}, "give one structured-output constraint"),
    ({"regex": "(unclosed"}, "regex"),
    ({"regex": ""}, "regex must be a non-empty string"),
    ({"choice": []}, "choice must be a non-empty list"),
    ({"choice": ["a", 3]}, "choice must be a non-empty list"),
    ({"grammar": "start: undefined_rule"}, "grammar"),
    ({"json_schema": {"type": "frobnicate"}}, "json_schema"),
])
def test_bad_constraints_are_one_line_errors(sm, kwargs, needle):
    with pytest.raises(DraftTreeError, match=needle) as e:
        sm.generate("hi", max_new_tokens=4, **kwargs)
    assert "\n" not in str(e.value)


def test_after_the_grammars_end_only_end_tokens_follow(sm):
    """With ignore_eos the text runs on past the grammar's end: only end tokens, whatever the drafts proposed there."""
    prompt = "Where does Alice live? Answer in one word."
    plain = sm.generate(prompt, max_new_tokens=12, method="ar", choice=["Paris", "Rome"], ignore_eos=True)
    assert plain.text in ("Paris", "Rome") and len(plain.tokens) == 12
    assert set(plain.tokens[plain.tokens.index(min(sm.eos_ids)):]) <= sm.eos_ids
    for method in ("lookup", "hybrid", "auto"):
        got = sm.generate(prompt, max_new_tokens=12, method=method, choice=["Paris", "Rome"], ignore_eos=True)
        assert got.tokens == plain.tokens, method


def test_the_state_follows_an_output_that_rolls_back():
    """transformers' assisted generation calls its logits processors on candidates' prefixes, then on a shorter output
    after a rejection: the state rolls back to the common prefix."""
    state = ToyState()
    state.sync([2, 5, 1])
    state.sync([2, 5, 1, 3])
    assert state.out == [2, 5, 1, 3]
    state.sync([2, 5])
    assert state.out == [2, 5]
    state.sync([2, 7, 3])
    assert state.out == [2, 7, 3] and state.pushed == 3


@pytest.mark.parametrize("method", ["hf-ar", "hf-lookup"])
def test_transformers_methods_decode_under_the_same_grammar(sm, method):
    from drafttree.bench.peers import hf_generate

    ids = sm.encode_prompt(PERSON)
    grammar = sm.sampling(json_schema=SCHEMA).grammar
    new, _ = hf_generate(method, sm.target, ids, 40, 0.0, sm.eos_ids, 0, grammar=grammar)
    assert new == sm.generate(PERSON, max_new_tokens=40, method="ar", json_schema=SCHEMA).tokens
