"""Structured output: the target's distribution restricted to what a grammar allows (a JSON schema, any JSON object, a
regular expression, a choice of strings, a Lark / GBNF grammar), as vLLM's and OpenAI's ``response_format`` ask.

The restriction is one more per-node logit adjustment (penalties.py): each verified tree node's logits keep only the
tokens the grammar allows after that node's own path (the output so far plus the node's ancestors), so the
acceptance walk samples the constrained target exactly, and every method gives what plain decoding under the same
grammar gives. A node whose own token the grammar forbids after its parent can never be reached by the walk (its
parent's adjusted logits give it no chance), so its row is left as it is.

:class:`GrammarState` holds the walk over a tree (what is the same for every grammar engine); :class:`Guidance`
states run llguidance's matcher (Rust; ~25 us a mask for SmolLM2's 49,152 tokens), which vLLM serves as one of its
structured-output backends.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import torch

from drafttree.errors import DraftTreeError
from drafttree.tree import DraftTree

KINDS = ("json_schema", "regex", "choice", "grammar")


def words(vocab: int) -> int:
    """int32 words of a bitmask over ``vocab`` tokens."""
    return (vocab + 31) // 32


def unpack(bits: np.ndarray, vocab: int) -> torch.Tensor:
    """[n, words] int32 bitmasks (token t: bit t % 32 of word t // 32) -> [n, vocab] bool."""
    flat = np.unpackbits(np.ascontiguousarray(bits).view(np.uint8), axis=1, bitorder="little")[:, :vocab]
    return torch.from_numpy(flat.view(np.bool_))


def allows(row: np.ndarray, token: int) -> bool:
    return bool((int(row[token >> 5]) >> (token & 31)) & 1)


class GrammarState:
    """One generation's place in a grammar. Engines give four steps (``_fill``, ``_push``, ``_pop``, ``_stopped``);
    the output is followed with :meth:`sync` and a verified tree's rows come from :meth:`masks`."""

    vocab: int
    end_ids: tuple[int, ...] = ()  # what a finished grammar still allows (the end of the text)

    def __init__(self) -> None:
        self.output: list[int] = []  # the output this state follows
        self.pushed = 0  # how many of its tokens are pushed (none after the grammar's end)

    def _fill(self, row: np.ndarray) -> None:
        """The tokens allowed next, as bits into ``row`` (a contiguous int32 array of ``words(vocab)``)."""
        raise NotImplementedError

    def _push(self, token: int) -> None:
        raise NotImplementedError

    def _pop(self, n: int) -> None:
        raise NotImplementedError

    def _stopped(self) -> bool:
        raise NotImplementedError

    def sync(self, output: list[int]) -> None:
        """Follow the generation's output (the tokens after the prompt): usually it grew since the last call; where it
        differs (a caller that rolls back, as transformers' assisted generation does), the state rolls back to the
        common prefix first. A finished grammar takes no more tokens (what follows its end is not pushed)."""
        old, n = self.output, len(self.output)
        same = n if output[:n] == old else next((i for i, (a, b) in enumerate(zip(old, output)) if a != b),
                                                min(n, len(output)))
        if same < self.pushed:
            self._pop(self.pushed - same)
            self.pushed = same
        if self.pushed == min(n, same):  # everything up to the common prefix was pushed: push what is new
            for tok in output[self.pushed:]:
                if self._stopped():
                    break
                self._push(tok)
                self.pushed += 1
        self.output = list(output)

    def bitmasks(self, tree: DraftTree) -> np.ndarray:
        """[n, words] int32 bitmasks: row i holds what may follow the output and node i's path (node 0 is the
        output's last token). Nodes the grammar forbids, and their subtrees, allow everything (they are never
        reached); after the grammar's end (or where it allows nothing) only the end tokens are allowed."""
        n = tree.size
        bits = np.zeros((n, words(self.vocab)), dtype=np.int32)
        reached, ended = [False] * n, [False] * n
        if self._stopped():
            reached[0] = ended[0] = True
        else:
            self._fill(bits[0])
            reached[0] = True
        if n > 1:
            tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
            children: list[list[int]] = [[] for _ in range(n)]
            for i in range(1, n):
                children[parents[i]].append(i)
            stack: list[tuple[int, int]] = [(0, 0)]  # (node, next child to try); pushed tokens = len(stack) - 1
            while stack:
                node, k = stack[-1]
                if k == len(children[node]) or ended[node]:
                    stack.pop()
                    if stack:
                        self._pop(1)
                    continue
                stack[-1] = (node, k + 1)
                child = children[node][k]
                if allows(bits[node], tokens[child]):
                    self._push(tokens[child])
                    reached[child] = True
                    if self._stopped():
                        ended[child] = True
                    else:
                        self._fill(bits[child])
                    stack.append((child, 0))
            ends = {t for t in self.end_ids if 0 <= t < self.vocab}
            for i in range(1, n):  # after the grammar's end: end tokens, and nothing else
                if ended[parents[i]] and reached[parents[i]] and tokens[i] in ends:
                    reached[i] = ended[i] = True
            for i in range(1, n):
                if not reached[i]:
                    bits[i] = -1
        end = ~bits.any(1)  # a finished grammar (or one that allows nothing): the end alone
        end[[i for i in range(n) if ended[i]]] = True
        if end.any():
            bits[end] = 0
            ends = [t for t in self.end_ids if 0 <= t < self.vocab]
            for t in ends:
                bits[end, t >> 5] |= np.int32(np.uint32(1 << (t & 31)).view(np.int32))
            if not ends:
                bits[end] = -1
        return bits

    def masks(self, tree: DraftTree) -> torch.Tensor:
        """:meth:`bitmasks` as [n, vocab] bool."""
        return unpack(self.bitmasks(tree), self.vocab)


def mask_logits(z: torch.Tensor, bits: np.ndarray) -> torch.Tensor:
    """``z`` ([n, vocab] float32) with -inf where ``bits`` forbid, in place: the kernel's word-by-word loop on a CPU
    (~10 us for 8 rows; torch's masked_fill over a [8, 49152] bool mask and numpy's boolean indexing take 0.2-0.5 ms
    on the 2-core machine), else torch's."""
    from drafttree.kernels import gemm

    n, vocab = z.shape
    ext = gemm.small_gemm() if z.device.type == "cpu" else None
    if ext is not None and hasattr(ext, "apply_token_bitmask") and z.is_contiguous() and z.dtype == torch.float32:
        ext.apply_token_bitmask(z, torch.from_numpy(bits))
        return z
    return z.masked_fill_(~unpack(bits, vocab).to(z.device), float("-inf"))


class Grammar:
    """A compiled constraint, shared by every generation that uses it; :meth:`start` gives one generation's state."""

    def start(self) -> GrammarState:
        raise NotImplementedError


# ------------------------------------------------------------------------------------------------ llguidance engine

class Guidance(Grammar):
    """A grammar in llguidance's form, for one tokenizer."""

    def __init__(self, tokenizer, text: str, vocab: int, end_ids: tuple[int, ...]):
        self.tokenizer, self.text, self.vocab, self.end_ids = tokenizer, text, vocab, end_ids

    def start(self) -> GuidanceState:
        return GuidanceState(self)


class GuidanceState(GrammarState):
    def __init__(self, grammar: Guidance):
        import llguidance

        super().__init__()
        self.m = llguidance.LLMatcher(grammar.tokenizer, grammar.text, log_level=0)
        self.vocab, self.end_ids = grammar.vocab, grammar.end_ids
        self._check()

    def _check(self) -> None:
        if self.m.is_error():
            raise RuntimeError(f"structured output: the grammar matcher failed: {self.m.get_error()}")

    def _fill(self, row: np.ndarray) -> None:
        self.m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        self._check()

    def _push(self, token: int) -> None:
        if not self.m.consume_token(token):
            raise RuntimeError(f"structured output: token {token} is not allowed here ({self.m.get_error()})")

    def _pop(self, n: int) -> None:
        self.m.rollback(n)

    def _stopped(self) -> bool:
        return self.m.is_stopped()


_TOKENIZERS: dict[tuple, tuple[object, object]] = {}
_LOCK = threading.Lock()


def guidance_tokenizer(hf_tokenizer, vocab: int, end_ids: tuple[int, ...]):
    """llguidance's view of a Hugging Face tokenizer (~0.3 s to build for SmolLM2; built once per tokenizer)."""
    import llguidance.hf

    key = (id(hf_tokenizer), vocab, end_ids)
    with _LOCK:
        hit = _TOKENIZERS.get(key)
        if hit is None or hit[0] is not hf_tokenizer:
            try:
                tok = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab, eos_token=list(end_ids) or None)
            except ValueError as e:
                raise DraftTreeError(f"structured output needs a fast Hugging Face tokenizer: {e}") from None
            hit = _TOKENIZERS[key] = (hf_tokenizer, tok)
        return hit[1]


def _grammar_text(kind: str, value) -> str:
    """llguidance's grammar for one user value, or a one-line error."""
    import llguidance

    if kind == "json_schema":
        if value is True or value == {}:
            value = {"type": "object"}  # OpenAI's json_object: any JSON object
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise DraftTreeError(f"json_schema is not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise DraftTreeError(f"json_schema must be a JSON schema object, got {type(value).__name__}")
        return llguidance.LLMatcher.grammar_from_json_schema(value)
    if kind == "choice":
        if (not isinstance(value, (list, tuple)) or not value
                or not all(isinstance(c, str) and c for c in value)):
            raise DraftTreeError("choice must be a non-empty list of non-empty strings")
        return llguidance.grammar_from("choice", list(value))
    if not isinstance(value, str) or not value:
        raise DraftTreeError(f"{kind} must be a non-empty string")
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(value)
    try:
        return llguidance.grammar_from("grammar", value)  # Lark, or GBNF (llama.cpp's) converted to Lark
    except ValueError as e:
        raise DraftTreeError(f"grammar: {e}") from None


def compile_grammar(hf_tokenizer, vocab: int, end_ids, **given) -> Grammar | None:
    """The one constraint among ``json_schema`` (a schema as a dict or JSON text; True: any JSON object), ``regex``,
    ``choice`` (a list of strings) and ``grammar`` (Lark or GBNF) that is not None, checked against this tokenizer;
    None when none is given. Bad input: a one-line :class:`DraftTreeError`."""
    import llguidance

    unknown = set(given) - set(KINDS)
    if unknown:
        raise DraftTreeError(f"unknown structured-output kind {sorted(unknown)[0]!r}; one of {', '.join(KINDS)}")
    asked = [(k, v) for k, v in given.items() if v is not None and v is not False]
    if not asked:
        return None
    if len(asked) > 1:
        raise DraftTreeError(f"give one structured-output constraint, not {' and '.join(k for k, _ in asked)}")
    kind, value = asked[0]
    text = _grammar_text(kind, value)
    ends = tuple(sorted(int(t) for t in end_ids))
    tok = guidance_tokenizer(hf_tokenizer, vocab, ends)
    error = llguidance.LLMatcher.validate_grammar(text, tok)
    if error and not error.startswith("WARNING"):
        raise DraftTreeError(f"{kind}: {error.strip().splitlines()[0]}")
    return Guidance(tok, text, vocab, ends)
