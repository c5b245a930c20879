"""The public API: ``SpeculativeModel.from_pretrained(...)``, ``.generate(...)`` and ``.stream(...)``."""

from __future__ import annotations

import dataclasses
import gc
import random
import threading
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import torch

from drafttree.accept import Sampling
from drafttree.batching.admission import PREFILL_CHUNK, check_chunk
from drafttree.batching.policy import DraftWhilePays
from drafttree.chain_target import target_for
from drafttree.decode import DecodeStats, decode
from drafttree.detok import TextAssembler, min_tokens_of
from drafttree.drafters import Drafter, check_method, make_drafter
from drafttree.drafters.options import parse_options
from drafttree.errors import DraftTreeError
from drafttree.grammar import compile_grammar
from drafttree.inputs import (
    INTERRUPTED,
    SEED_MASK,
    check_flags,
    check_options,
    check_positive_int,
    encode_text,
    end_token_ids,
    is_batch,
    seed_value,
    stop_strings,
    token_ids,
)
from drafttree.logprobs import check_top
from drafttree.models import DEFAULT_MODEL, LoadedModel, check_same_vocabulary, load_model
from drafttree.penalties import LogitAdjust
from drafttree.results import GenerationResult, GenerationStream, StreamChunk

_frozen = False


def _freeze_gc() -> None:
    """Collect, then move every live object to the permanent generation (once per process: a later load's objects
    are few, and frozen objects that become cyclic garbage are never collected)."""
    global _frozen
    gc.collect()
    gc.freeze()
    _frozen = True


class SpeculativeModel:
    """A target model plus a drafting method; generates exactly what the target alone would generate."""

    def __init__(self, target: LoadedModel, method: str = "auto", draft: LoadedModel | None = None,
                 head=None, prefix_cache: bool = False, **method_options):
        """``prefix_cache``: a prompt that begins with what the last generation's cache holds (a chat's earlier
        turns, the same system prompt) computes only the rest; the cost of a turn then stays flat as a
        conversation grows. Off by default: the reused keys come from other forwards than a fresh prefill's, so a
        generation's logits may differ in the last bits from the same call on a fresh cache (the distribution is
        the model's either way, and every method still gives plain decoding's tokens on the same cache)."""
        if not isinstance(prefix_cache, bool):
            raise DraftTreeError(f"prefix_cache must be true or false, got {prefix_cache!r}")
        self.target = target
        self.draft = draft
        if draft is not None:
            check_same_vocabulary(target, draft)
        self.head = head
        self.method = self._resolve_method(method)
        self.method_options = method_options
        self.prefix_cache = prefix_cache
        self._runner = target_for(target.model, feature_layers=getattr(head, "aux_layers", None),
                                 keep_prefix=prefix_cache)
        self._drafters: dict[tuple, Drafter] = {}
        self._batch_target = None
        self.batch_policy = DraftWhilePays()  # rounds draft while drafts pay (batching/policy.py says why)
        self.prefill_chunk = PREFILL_CHUNK  # prompt tokens a decoding batch's round prefills at most (admission.py)
        self._verify_cost = None
        self._batch_results: list[GenerationResult | None] = []
        self.tokenizer = target.tokenizer
        self.eos_ids = target.eos_token_ids()
        # the caches are the model's, one generation's at a time (see _exclusive): whose they are, and how many
        # generation steps are running now (a generation started inside another's step runs within it)
        self._lock = threading.RLock()
        self._owners: list[object] = []
        self._stepping = 0

    @property
    def prefill_chunk(self) -> int:
        """Prompt tokens a round of a decoding batch prefills at most (batching/admission.py); 0: no bound."""
        return self._prefill_chunk

    @prefill_chunk.setter
    def prefill_chunk(self, tokens: int) -> None:
        self._prefill_chunk = check_chunk(tokens)

    @classmethod
    def from_pretrained(cls, model: str = DEFAULT_MODEL, method: str = "auto", draft_model: str | None = None,
                        head: str | None = "auto", dtype: str | torch.dtype = "auto", device: str = "auto",
                        show_progress: bool = True, prefix_cache: bool = False, freeze_gc: bool = True,
                        draft_vocab: int | None = None, **method_options) -> SpeculativeModel:
        """Load a target (and a draft LM or EAGLE head if the method needs one).

        ``head='auto'`` uses the head shipped for the target when there is one; ``method='auto'`` is
        ``hybrid``: context n-grams plus the head and/or draft LM when loaded, in one ranked tree sized for this
        machine (the root alone, plain decoding, where no tree pays). ``freeze_gc``: after the process's first load,
        its objects (~390k after importing torch and transformers) go to the collector's permanent generation
        (``gc.freeze``, as vLLM does after start-up), so that a full collection while decoding scans only what
        decoding made: one took 0.3 s in the middle of a burst of 64 users. ``draft_vocab``: the head (a model's own
        MTP layer, an EAGLE-1 head) drafts over the first that many token ids only (``heads.restrict_draft_vocab``).
        """
        if not isinstance(prefix_cache, bool):  # fail before loading anything
            raise DraftTreeError(f"prefix_cache must be true or false, got {prefix_cache!r}")
        if draft_vocab is not None:
            from drafttree.heads import check_draft_vocab

            check_draft_vocab(draft_vocab)
        spec = check_method("hybrid" if method == "auto" else method)
        needs = "model" if method == "auto" else spec.needs
        parse_options(spec.schema, method, method_options)
        if needs == "draft" and not draft_model:
            raise DraftTreeError(f"method {method!r} needs a draft model (draft_model=... / --draft-model)")
        if head and head != "auto":
            if head != "mtp":  # mtp: the MTP layer in the model's own checkpoint
                from drafttree.heads.loading import head_dir

                head = str(head_dir(Path(head).expanduser()))  # a hub id: its cached snapshot
                if not Path(head).exists():  # said before the model loads
                    raise DraftTreeError(f"head not found: {head}")
            if needs not in ("head", "model", "any"):
                raise DraftTreeError(f"method {method!r} does not use an EAGLE head: leave out head=/--head, or "
                                     "load with a method that drafts with it (auto, hybrid, eagle2, ...)")
        target = load_model(model, dtype=dtype, device=device, show_progress=show_progress)
        draft = None
        if draft_model:
            draft = load_model(draft_model, dtype=target.dtype, device=target.device, show_progress=show_progress)
        eagle_head = None
        if head and needs in ("head", "model", "any"):
            from drafttree.heads import load_head_for

            eagle_head = load_head_for(target, None if head == "auto" else head, required=needs == "head")
        if draft_vocab is not None:
            from drafttree.heads import restrict_draft_vocab

            restrict_draft_vocab(eagle_head, draft_vocab, target)
        lm = cls(target, method=method, draft=draft, head=eagle_head, prefix_cache=prefix_cache, **method_options)
        if freeze_gc and not _frozen:
            _freeze_gc()
        return lm

    def _resolve_method(self, method: str) -> str:
        if method == "auto":  # every loaded source in one ranked tree (context n-grams alone when nothing is loaded:
            # sized on the cost curve, the root alone where no tree pays; lookup's fixed trees lost to ar at L on an
            # AVX2 CPU, docs/benchmark-notes.md stop 43)
            return "hybrid"
        needs = check_method(method).needs
        if needs == "draft" and self.draft is None:
            raise DraftTreeError(f"method {method!r} needs a draft model (draft_model=... / --draft-model)")
        if needs == "head" and self.head is None:
            raise DraftTreeError(f"method {method!r} needs an EAGLE head for {self.target.name!r}")
        if needs == "model" and self.head is None and self.draft is None:
            raise DraftTreeError(f"method {method!r} needs an EAGLE head or a draft model (draft_model=...)")
        return method

    def forget_prefix(self) -> None:
        """Drop what the prefix cache holds (the target's, every draft LM's and the batches' pool): the next prompt is
        computed whole, as by a model just loaded."""
        self._runner.forget()
        if self._batch_target is not None and self._batch_target.pool is not None:
            self._batch_target.pool.clear()
        for d in self._drafters.values():
            d.keep_prefix(self.prefix_cache)

    def drafter(self, method: str | None = None, options: dict | None = None) -> Drafter:
        """The drafter for ``method`` (built once per method and options). Without ``options``, the
        options given at construction apply to the construction method."""
        method = self._resolve_method(method or self.method)
        if options is None:
            options = self.method_options if method == self.method else {}
        check_options(options)
        key = (method, tuple(sorted((k, str(v)) for k, v in options.items())))
        if key not in self._drafters:
            self._drafters[key] = make_drafter(method, self.target, self.draft, self.head, **dict(options))
            self._drafters[key].keep_prefix(self.prefix_cache)
        return self._drafters[key]

    # ---- prompts -------------------------------------------------------------------------------------
    def prompt_ids(self, prompt, chat: bool = True) -> torch.Tensor:
        """Token ids of a prompt: text or chat messages through the tokenizer, or token ids as they are (a 1-D
        integer tensor, a [1, n] one, or a list of ints), checked against the vocabulary before any forward sees
        them (an id out of range would be a raw IndexError on a CPU and a device-side assert on CUDA)."""
        ids = token_ids(prompt, self.target.vocab_size)
        return self.encode_prompt(prompt, chat) if ids is None else ids

    def encode_prompt(self, prompt: str | list[dict], chat: bool = True,
                      tools: list[dict] | None = None) -> torch.Tensor:
        """Token ids of text or chat messages (the chat template, given ``tools`` where it has a use for them)."""
        return encode_text(self.tokenizer, prompt, chat, tools)

    # ---- generation ----------------------------------------------------------------------------------
    def stream(self, prompt: str | list[dict] | torch.Tensor, max_new_tokens: int = 256, temperature: float = 0.0,
               top_p: float = 1.0, top_k: int = 0, stop: list[str] | str | None = None, seed: int | None = None,
               chat: bool = True, method: str | None = None, record_rounds: bool = False,
               method_options: dict | None = None, drafter: Drafter | None = None,
               logprobs: int | None = None, stop_token_ids: list[int] | None = None, ignore_eos: bool = False,
               include_stop: bool = False, min_p: float = 0.0, presence_penalty: float = 0.0,
               frequency_penalty: float = 0.0, repetition_penalty: float = 1.0, logit_bias: dict | None = None,
               min_tokens: int = 0, json_schema: dict | str | bool | None = None, regex: str | None = None,
               choice: list[str] | None = None, grammar: str | None = None) -> GenerationStream:
        """Generate lazily: one :class:`StreamChunk` per target forward, as soon as its tokens are accepted.

        ``logprobs=k`` (0..20): each new token's log-probability under the target and its k likeliest alternatives,
        in ``chunk.logprobs`` and ``result.logprobs`` (logprobs.py: from the verify forwards' own logits).

        ``stop_token_ids``: tokens that end the generation as the model's end-of-sequence tokens do (counted in the
        tokens, their text dropped, as vLLM); ``ignore_eos``: the end-of-sequence tokens do not end it (generation
        runs to ``max_new_tokens``, as benchmark clients ask); ``include_stop``: the text ends after the stop string
        found instead of before it, and keeps an end token's text. None of them changes a sampled token, only where
        the output ends.

        ``min_p``, ``presence_penalty``, ``frequency_penalty``, ``repetition_penalty``, ``logit_bias`` ({token id:
        bias}) and ``min_tokens`` (end tokens banned before it) change the target's distribution as vLLM defines
        them (penalties.py); every method then gives exactly what plain decoding with the same settings gives.

        Structured output (grammar.py), at most one of: ``json_schema`` (a JSON schema as a dict or JSON text; True:
        any JSON object, OpenAI's ``json_object``), ``regex``, ``choice`` (the text is one of these strings),
        ``grammar`` (Lark or llama.cpp's GBNF). Every token is then the target's own choice among those the grammar
        allows, with any method: the text of plain decoding under the same grammar.

        ``drafter``: a :class:`~drafttree.drafters.base.Drafter` object of your own instead of a method name
        (a new drafting idea is one small class; the decode loop keeps it lossless)."""
        check_positive_int(max_new_tokens, "max_new_tokens")
        check_flags(chat=chat, include_stop=include_stop, record_rounds=record_rounds)
        sampling = self.sampling(temperature, top_p, top_k, min_p, presence_penalty, frequency_penalty,
                                 repetition_penalty, logit_bias, min_tokens, max_new_tokens, json_schema, regex, choice,
                                 grammar)
        logprobs = check_top(logprobs)
        ids = self.prompt_ids(prompt, chat)
        if ids.numel() == 0:
            raise DraftTreeError("empty prompt")
        ctx = self._runner.max_positions
        if ids.numel() >= ctx:
            raise DraftTreeError(f"prompt is {ids.numel()} tokens but the context window is {ctx} tokens")
        if drafter is None:
            drafter = self.drafter(method, method_options)
            label = method or self.method
        else:
            label = getattr(drafter, "name", type(drafter).__name__)
        stops = stop_strings(stop)
        ends = self.end_ids(stop_token_ids, ignore_eos)
        gen = torch.Generator(device=self.target.device)
        gen.manual_seed(seed_value(seed) if seed is not None else random.randrange(2**63))
        stream = GenerationStream(iter(()))
        text = TextAssembler(self.tokenizer, stops, include_stop, min_tokens_of(sampling), ends)
        stream._it = self._exclusive(self._run(ids, drafter, sampling, max_new_tokens, text, ends, gen, stream,
                                               record_rounds, label, logprobs))
        return stream

    def _exclusive(self, steps: Iterator, batch: bool = False) -> Iterator:
        """A generation's steps with the model's caches to itself. Its first step makes it the model's generation, and
        one started later (a stream left open, another thread's call) ends it: its next step raises instead of
        decoding from caches another generation has rewritten. A generation started inside another's step (a batch of
        prompts decoded one by one) runs within it. ``batch``: rows an abandoned batch left in the batched cache are
        dropped first. Steps hold a lock, so threads take turns step by step (:meth:`generate` holds it throughout)."""
        mine = None
        try:
            while True:
                with self._lock:
                    if mine is None:
                        mine = object()
                        self._owners = (self._owners if self._stepping else []) + [mine]
                        if batch and self._batch_target is not None and self._batch_target.rows:
                            self._batch_target.keep([])
                    elif mine not in self._owners:
                        raise DraftTreeError(INTERRUPTED)
                    self._stepping += 1
                    try:
                        item = next(steps)
                    except StopIteration:
                        return
                    finally:
                        self._stepping -= 1
                yield item
        finally:
            with self._lock:
                if mine in self._owners:
                    self._owners.remove(mine)

    def sampling(self, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, presence_penalty=0.0, frequency_penalty=0.0,
                 repetition_penalty=1.0, logit_bias=None, min_tokens=0, max_new_tokens=None, json_schema=None,
                 regex=None, choice=None, grammar=None) -> Sampling:
        """The sampling settings of a generation, checked (one-line errors); a structured-output constraint compiled
        for this tokenizer (grammar.py)."""
        adjust = LogitAdjust.of(presence_penalty, frequency_penalty, repetition_penalty, logit_bias, min_tokens,
                                vocab=self.target.vocab_size)
        if adjust is not None and max_new_tokens is not None and adjust.min_tokens > max_new_tokens:
            raise DraftTreeError(f"min_tokens ({adjust.min_tokens}) must not exceed max_new_tokens ({max_new_tokens})")
        sampling = Sampling.of(temperature, top_p, top_k, min_p, adjust)  # checked before a grammar is compiled
        structured = compile_grammar(self.tokenizer, self.target.vocab_size, self.eos_ids, json_schema=json_schema,
                                     regex=regex, choice=choice, grammar=grammar)
        return sampling if structured is None else dataclasses.replace(sampling, grammar=structured)

    def end_ids(self, stop_token_ids=None, ignore_eos: bool = False) -> frozenset[int]:
        """The tokens that end a generation: the target's end-of-sequence tokens (none with ``ignore_eos``) and
        ``stop_token_ids`` (checked against the vocabulary)."""
        return end_token_ids(stop_token_ids, ignore_eos, self.target.vocab_size, self.eos_ids)

    def _run(self, ids, drafter, sampling, max_new_tokens, text, ends, gen, stream, record_rounds, method, logprobs):
        stats = DecodeStats()
        steps = decode(self._runner, drafter, ids, sampling, max_new_tokens, ends, gen, stats, record_rounds,
                       logprobs)
        step = sent = 0
        for new in steps:
            delta = text.feed(new, final=stats.finish_reason == "stop")
            step += 1
            end = max(sent, text.releasable())  # tokens go out with their text: none past a stop string
            lps = None if logprobs is None else stats.logprobs[sent:end]
            yield StreamChunk(delta, text.tokens[sent:end], step, lps)
            sent = end
            if text.stopped_at is not None:
                stats.finish_reason = "stop"
                steps.close()
                break
        rest, kept = text.finish(), text.kept()
        if rest or kept > sent:
            yield StreamChunk(rest, text.tokens[sent:kept], step,
                              None if logprobs is None else stats.logprobs[sent:kept])
        stream.result = GenerationResult(text.text, text.tokens[:kept], int(ids.numel()), method, stats,
                                         None if logprobs is None else stats.logprobs[:kept])

    def generate(self, prompt: str | list[dict] | torch.Tensor | list, max_new_tokens: int = 256,
                 **kwargs) -> GenerationResult | list[GenerationResult]:
        """Generate to completion; see :meth:`stream` for the parameters. A list of prompts (strings, message
        lists or token tensors) is decoded as one batch (:meth:`stream_batch`) and gives a list of results."""
        if is_batch(prompt):
            single = sorted(set(kwargs) & {"record_rounds", "drafter"})
            if single:
                raise DraftTreeError(f"{' and '.join(single)} apply to one prompt; a list of prompts is decoded as a "
                                     "batch (generate each prompt alone to use them)")
            with self._lock:  # another thread's call waits for this one
                for _ in self.stream_batch(prompt, max_new_tokens, **kwargs):
                    pass
                return self.batch_results()
        kwargs.pop("max_batch", None)  # one prompt is a batch of one
        with self._lock:
            s = self.stream(prompt, max_new_tokens, **kwargs)
            for _ in s:
                pass
            return s.result

    def stream_batch(self, prompts: list, max_new_tokens: int = 256, **kwargs) -> Iterator[tuple[int, StreamChunk]]:
        """Decode several prompts together (one target forward verifies every row's tree), yielding
        ``(prompt index, chunk)`` as each row's tokens are accepted; at most ``max_batch`` rows at a time, the
        others join as rows finish. Greedy output equals each prompt decoded alone; with ``seed``, row i
        samples from its own generator seeded ``seed + i``. ``self.batch_results()`` afterwards. The batch's cache
        buffers stay allocated for the next batch (``self.batch_target().forget_buffers()`` frees them). Takes
        :meth:`stream`'s settings (not ``record_rounds`` nor ``drafter``) and ``max_batch``."""
        return self._exclusive(self._stream_batch(prompts, max_new_tokens, **kwargs), batch=True)

    def _stream_batch(self, prompts: list, max_new_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0,
                     top_k: int = 0, stop: list[str] | str | None = None, seed: int | None = None, chat: bool = True,
                     method: str | None = None, method_options: dict | None = None,
                     max_batch: int | None = None, logprobs: int | None = None, stop_token_ids: list[int] | None = None,
                     ignore_eos: bool = False, include_stop: bool = False, min_p: float = 0.0,
                     presence_penalty: float = 0.0, frequency_penalty: float = 0.0, repetition_penalty: float = 1.0,
                     logit_bias: dict | None = None, min_tokens: int = 0, json_schema: dict | str | bool | None = None,
                     regex: str | None = None, choice: list[str] | None = None,
                     grammar: str | None = None) -> Iterator[tuple[int, StreamChunk]]:
        from drafttree.batching import BatchDecoder, Sequence

        check_positive_int(max_new_tokens, "max_new_tokens")
        check_positive_int(max_batch, "max_batch", none_ok=True)
        check_flags(chat=chat, include_stop=include_stop)
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise DraftTreeError(f"prompts must be a non-empty list, got {type(prompts).__name__}")
        sampling = self.sampling(temperature, top_p, top_k, min_p, presence_penalty, frequency_penalty,
                                 repetition_penalty, logit_bias, min_tokens, max_new_tokens, json_schema, regex, choice,
                                 grammar)
        logprobs = check_top(logprobs)
        stops = stop_strings(stop)
        ends = self.end_ids(stop_token_ids, ignore_eos)
        if seed is not None:
            seed_value(seed)  # checked before any prompt is encoded
        ids = [self.prompt_ids(p, chat) for p in prompts]
        ctx = self._runner.max_positions
        for i, x in enumerate(ids):
            if x.numel() == 0 or x.numel() >= ctx:
                raise DraftTreeError(f"prompt {i} is {x.numel()} tokens; it must be 1..{ctx - 1} (context window)")
        method = self._resolve_method(method or self.method)
        options = method_options if method_options is not None else (
            self.method_options if method == self.method else {})
        check_options(options)
        if self.one_at_a_time:  # the prompts decode one by one
            yield from self._one_by_one(ids, seed, options, max_new_tokens, temperature, top_p, top_k, stop, chat,
                                        method, logprobs, stop_token_ids, ignore_eos, include_stop, min_p,
                                        presence_penalty, frequency_penalty, repetition_penalty, logit_bias,
                                        min_tokens, json_schema, regex, choice, grammar)
            return
        seqs, texts = [], []
        for i, x in enumerate(ids):
            gen = torch.Generator(device=self.target.device)
            gen.manual_seed((seed_value(seed) + i) & SEED_MASK if seed is not None else random.randrange(2**63))
            drafter = make_drafter(method, self.target, self.draft, self.head, **dict(options))
            seqs.append(Sequence(x.to(self.target.device), drafter, sampling, max_new_tokens, ends, gen, tag=i,
                                 logprobs=logprobs))
            texts.append(TextAssembler(self.tokenizer, stops, include_stop, min_tokens_of(sampling), ends))
        dec = BatchDecoder(self.batch_target(), self.verify_cost(), self.batch_policy,
                           prefill_chunk=self.prefill_chunk)
        waiting, limit = list(seqs), min(max_batch or len(seqs), dec.target.max_rows or len(seqs))
        self._batch_results = [None] * len(seqs)
        steps = [0] * len(seqs)
        sent = [0] * len(seqs)  # each one's tokens handed out so far

        def chunks(seq, new):
            i = seq.tag
            text = texts[i]
            delta = text.feed(new, final=seq.finished and seq.stats.finish_reason == "stop")
            steps[i] += 1
            if text.stopped_at is not None and not seq.finished:
                seq.cancelled = True
                seq._finish("stop")
            a = sent[i]
            end = sent[i] = max(a, text.releasable())  # tokens go out with their text: none past a stop string
            lps = None if logprobs is None else seq.stats.logprobs[a:end]
            out = [(i, StreamChunk(delta, text.tokens[a:end], steps[i], lps))]
            if seq.finished:
                rest, kept = text.finish(), text.kept()
                if rest or kept > end:
                    out.append((i, StreamChunk(rest, text.tokens[end:kept], steps[i],
                                               None if logprobs is None else seq.stats.logprobs[end:kept])))
                self._batch_results[i] = GenerationResult(text.text, text.tokens[:kept], int(seq.prompt_ids.numel()),
                                                          method, seq.stats, None if logprobs is None
                                                          else seq.stats.logprobs[:kept])
            return out

        while waiting or dec.rows:
            joining, waiting = waiting[: max(0, limit - dec.rows)], waiting[max(0, limit - dec.rows):]
            dec.waiting = len(waiting)
            for seq, new in zip(joining, dec.add_many(joining)):  # newcomers prefilled together
                if new is not None:  # None: its prefill ends in a later round (admission.py)
                    yield from chunks(seq, new)
            for seq, new in dec.step():
                yield from chunks(seq, new)

    def _one_by_one(self, ids, seed, options, max_new_tokens, *settings) -> Iterator[tuple[int, StreamChunk]]:
        """A list of prompts on a target that decodes one sequence at a time (chain_target.py), in order: prompt i
        seeded ``seed + i`` as in a batch."""
        (temperature, top_p, top_k, stop, chat, method, logprobs, stop_token_ids, ignore_eos, include_stop, min_p,
         presence, frequency, repetition, bias, min_tokens, json_schema, regex, choice, grammar) = settings
        self._batch_results = [None] * len(ids)
        for i, x in enumerate(ids):
            s = self.stream(x, max_new_tokens, temperature, top_p, top_k, stop,
                            None if seed is None else (seed_value(seed) + i) & SEED_MASK, chat, method, False, options,
                            None, logprobs, stop_token_ids, ignore_eos, include_stop, min_p, presence, frequency,
                            repetition, bias, min_tokens, json_schema, regex, choice, grammar)
            for chunk in s:
                yield i, chunk
            self._batch_results[i] = s.result

    def batch_results(self) -> list[GenerationResult]:
        """The results of the last finished :meth:`stream_batch`, in prompt order."""
        return list(self._batch_results)

    def batch_target(self):
        """The batched verifier over this target (built once)."""
        from drafttree.batching import BatchTarget

        if self._batch_target is None:
            from drafttree.batching.prefix_pool import PrefixPool

            self._batch_target = BatchTarget(self.target.model, getattr(self.head, "aux_layers", None),
                                             prefix_pool=PrefixPool() if self.prefix_cache else None)
        return self._batch_target

    @property
    def one_at_a_time(self) -> bool:
        """Whether sequences decode one after another, never packed in a batch: recurrent layers verify one chain at
        a time (chain_target.py), and a Gemma 4 assistant attends to one sequence's keys (heads/assistant.py)."""
        return self._runner.chains_only or getattr(self.head, "kind", "") == "assistant"

    @property
    def max_positions(self) -> int:
        """The context window, in tokens (prompt and output together), of what serves batches: the batched target's,
        or the single-sequence one's for a target that verifies chains only."""
        return self._runner.max_positions if self.one_at_a_time else self.batch_target().max_positions

    def batch_decoder(self):
        """A fresh batched decode loop over this target (the server's scheduler feeds one): rows packed into one
        forward, or one sequence at a time for a target that verifies chains only (batching/one_by_one.py)."""
        if self.one_at_a_time:
            from drafttree.batching.one_by_one import OneByOneDecoder

            return OneByOneDecoder(self._runner)
        from drafttree.batching import BatchDecoder

        return BatchDecoder(self.batch_target(), self.verify_cost(), self.batch_policy,
                            prefill_chunk=self.prefill_chunk)

    def verify_cost(self):
        """This machine's verify-cost curve for the target (measured once, cached on disk)."""
        from drafttree.budget import cost_model_for

        if self._verify_cost is None:
            self._verify_cost = cost_model_for(self._runner, self.target.name)
        return self._verify_cost


__all__ = ["GenerationResult", "GenerationStream", "SpeculativeModel", "StreamChunk", "asdict"]
