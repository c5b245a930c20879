"""The public API: ``SpeculativeModel.from_pretrained(...)``, ``.generate(...)`` and ``.stream(...)``."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import torch

from drafttree.accept import Sampling
from drafttree.batching.policy import AlwaysDraft
from drafttree.decode import DecodeStats, decode
from drafttree.detok import TextAssembler
from drafttree.drafters import Drafter, check_method, make_drafter
from drafttree.drafters.options import parse_options
from drafttree.errors import DraftTreeError
from drafttree.models import DEFAULT_MODEL, LoadedModel, check_same_vocabulary, load_model
from drafttree.target import TargetModel


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]  # the new token ids (EOS included when it ended the generation)
    prompt_tokens: int
    method: str
    stats: DecodeStats = field(repr=False)

    @property
    def new_tokens(self) -> int:
        return self.stats.new_tokens

    @property
    def tau(self) -> float:
        return self.stats.tau

    @property
    def tokens_per_second(self) -> float:
        return self.stats.tokens_per_second

    @property
    def target_forwards(self) -> int:
        return self.stats.target_forwards

    @property
    def wall_time(self) -> float:
        return self.stats.wall_time

    @property
    def finish_reason(self) -> str:
        return self.stats.finish_reason

    def to_dict(self) -> dict:
        s = self.stats
        return {
            "text": self.text, "method": self.method, "new_tokens": s.new_tokens,
            "prompt_tokens": self.prompt_tokens, "tokens_per_second": round(s.tokens_per_second, 3),
            "tau": round(s.tau, 4), "target_forwards": s.target_forwards, "wall_time": round(s.wall_time, 4),
            "finish_reason": s.finish_reason, "accept_lengths": s.accept_lengths,
            "time_split": {"prefill": round(s.time_prefill, 4), "draft": round(s.time_draft, 4),
                           "verify": round(s.time_verify, 4), "other": round(s.time_other, 4)},
            "tokens": self.tokens,
        }


@dataclass
class StreamChunk:
    """One target forward's worth of output: the tokens it accepted and the text they add."""

    text: str
    tokens: list[int]
    step: int


class GenerationStream:
    """Iterator of :class:`StreamChunk`; ``.result`` holds the full :class:`GenerationResult` afterwards."""

    def __init__(self, it: Iterator[StreamChunk]):
        self._it = it
        self.result: GenerationResult | None = None

    def __iter__(self):
        return self

    def __next__(self) -> StreamChunk:
        return next(self._it)

    def close(self) -> None:
        self._it.close()


class SpeculativeModel:
    """A target model plus a drafting method; generates exactly what the target alone would generate."""

    def __init__(self, target: LoadedModel, method: str = "auto", draft: LoadedModel | None = None,
                 head=None, **method_options):
        self.target = target
        self.draft = draft
        if draft is not None:
            check_same_vocabulary(target, draft)
        self.head = head
        self.method = self._resolve_method(method)
        self.method_options = method_options
        self._runner = TargetModel(target.model, feature_layers=getattr(head, "aux_layers", None))
        self._drafters: dict[tuple, Drafter] = {}
        self._batch_target = None
        self.batch_policy = AlwaysDraft()  # per-row budgets decide (batching/policy.py says why)
        self._verify_cost = None
        self._batch_results: list[GenerationResult | None] = []
        self.tokenizer = target.tokenizer
        self.eos_ids = target.eos_token_ids()

    @classmethod
    def from_pretrained(cls, model: str = DEFAULT_MODEL, method: str = "auto", draft_model: str | None = None,
                        head: str | None = "auto", dtype: str | torch.dtype = "auto", device: str = "auto",
                        show_progress: bool = True, **method_options) -> SpeculativeModel:
        """Load a target (and a draft LM or EAGLE head if the method needs one).

        ``head='auto'`` uses the head shipped for the target when there is one; ``method='auto'`` is
        ``hybrid``: context n-grams plus the head and/or draft LM when loaded, in one ranked tree sized for this
        machine (the root alone, plain decoding, where no tree pays).
        """
        needs = "model"
        if method != "auto":  # fail before loading anything
            spec = check_method(method)
            needs = spec.needs
            parse_options(spec.schema, method, method_options)
        if needs == "draft" and not draft_model:
            raise DraftTreeError(f"method {method!r} needs a draft model (draft_model=... / --draft-model)")
        target = load_model(model, dtype=dtype, device=device, show_progress=show_progress)
        draft = None
        if draft_model:
            draft = load_model(draft_model, dtype=target.dtype, device=target.device, show_progress=show_progress)
        eagle_head = None
        if head and needs in ("head", "model", "any"):
            from drafttree.heads import load_head_for

            eagle_head = load_head_for(target, None if head == "auto" else head, required=needs == "head")
        return cls(target, method=method, draft=draft, head=eagle_head, **method_options)

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

    def drafter(self, method: str | None = None, options: dict | None = None) -> Drafter:
        """The drafter for ``method`` (built once per method and options). Without ``options``, the
        options given at construction apply to the construction method."""
        method = self._resolve_method(method or self.method)
        if options is None:
            options = self.method_options if method == self.method else {}
        key = (method, tuple(sorted((k, str(v)) for k, v in options.items())))
        if key not in self._drafters:
            self._drafters[key] = make_drafter(method, self.target, self.draft, self.head, **dict(options))
        return self._drafters[key]

    # ---- prompts -------------------------------------------------------------------------------------
    def encode_prompt(self, prompt: str | list[dict], chat: bool = True) -> torch.Tensor:
        tok = self.tokenizer
        if isinstance(prompt, str):
            if not prompt.strip():
                raise DraftTreeError("empty prompt")
            if chat and getattr(tok, "chat_template", None):
                prompt = [{"role": "user", "content": prompt}]
            else:
                return torch.tensor(tok(prompt, add_special_tokens=True).input_ids, dtype=torch.long)
        if not isinstance(prompt, list) or not prompt or not all(
                isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
            raise DraftTreeError("messages must be a non-empty list of {'role': ..., 'content': ...} objects")
        if not getattr(tok, "chat_template", None):
            raise DraftTreeError("this model has no chat template: pass a plain string with chat=False")
        ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return torch.tensor(ids, dtype=torch.long).reshape(-1)

    # ---- generation ----------------------------------------------------------------------------------
    def stream(self, prompt: str | list[dict] | torch.Tensor, max_new_tokens: int = 256, temperature: float = 0.0,
               top_p: float = 1.0, top_k: int = 0, stop: list[str] | str | None = None, seed: int | None = None,
               chat: bool = True, method: str | None = None, record_rounds: bool = False,
               method_options: dict | None = None, drafter: Drafter | None = None) -> GenerationStream:
        """Generate lazily: one :class:`StreamChunk` per target forward, as soon as its tokens are accepted.

        ``drafter``: a :class:`~drafttree.drafters.base.Drafter` object of your own instead of a method name
        (a new drafting idea is one small class; the decode loop keeps it lossless)."""
        if max_new_tokens is None or max_new_tokens <= 0:
            raise DraftTreeError(f"max_new_tokens must be > 0, got {max_new_tokens}")
        sampling = Sampling(float(temperature), float(top_p), int(top_k))
        ids = prompt.reshape(-1) if isinstance(prompt, torch.Tensor) else self.encode_prompt(prompt, chat)
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
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not s for s in stops):
            raise DraftTreeError("stop strings must be non-empty")
        gen = torch.Generator(device=self.target.device)
        gen.manual_seed(seed if seed is not None else random.randrange(2**63))
        stream = GenerationStream(iter(()))
        stream._it = self._run(ids, drafter, sampling, max_new_tokens, stops, gen, stream, record_rounds, label)
        return stream

    def _run(self, ids, drafter, sampling, max_new_tokens, stops, gen, stream, record_rounds, method):
        stats = DecodeStats()
        text = TextAssembler(self.tokenizer, stops)
        steps = decode(self._runner, drafter, ids, sampling, max_new_tokens, self.eos_ids, gen, stats,
                       record_rounds)
        step = 0
        for new in steps:
            delta = text.feed(new, final=stats.finish_reason == "stop")
            step += 1
            yield StreamChunk(delta, new, step)
            if text.stopped_at is not None:
                stats.finish_reason = "stop"
                steps.close()
                break
        rest = text.finish()
        if rest:
            yield StreamChunk(rest, [], step)
        stream.result = GenerationResult(text.text, text.tokens, int(ids.numel()), method, stats)

    def generate(self, prompt: str | list[dict] | torch.Tensor | list, max_new_tokens: int = 256,
                 **kwargs) -> GenerationResult | list[GenerationResult]:
        """Generate to completion; see :meth:`stream` for the parameters. A list of prompts (strings, message
        lists or token tensors) is decoded as one batch (:meth:`stream_batch`) and gives a list of results."""
        if is_batch(prompt):
            for _ in self.stream_batch(prompt, max_new_tokens, **kwargs):
                pass
            return self.batch_results()
        s = self.stream(prompt, max_new_tokens, **kwargs)
        for _ in s:
            pass
        return s.result

    def stream_batch(self, prompts: list, max_new_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0,
                     top_k: int = 0, stop: list[str] | str | None = None, seed: int | None = None, chat: bool = True,
                     method: str | None = None, method_options: dict | None = None,
                     max_batch: int | None = None) -> Iterator[tuple[int, StreamChunk]]:
        """Decode several prompts together (one target forward verifies every row's tree), yielding
        ``(prompt index, chunk)`` as each row's tokens are accepted; at most ``max_batch`` rows at a time, the
        others join as rows finish. Greedy output equals each prompt decoded alone; with ``seed``, row i
        samples from its own generator seeded ``seed + i``. ``self.batch_results()`` afterwards."""
        from drafttree.batching import BatchDecoder, Sequence

        if max_new_tokens is None or max_new_tokens <= 0:
            raise DraftTreeError(f"max_new_tokens must be > 0, got {max_new_tokens}")
        if max_batch is not None and max_batch <= 0:
            raise DraftTreeError(f"max_batch must be > 0, got {max_batch}")
        sampling = Sampling(float(temperature), float(top_p), int(top_k))
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not s for s in stops):
            raise DraftTreeError("stop strings must be non-empty")
        ids = [p.reshape(-1) if isinstance(p, torch.Tensor) else self.encode_prompt(p, chat) for p in prompts]
        ctx = self._runner.max_positions
        for i, x in enumerate(ids):
            if x.numel() == 0 or x.numel() >= ctx:
                raise DraftTreeError(f"prompt {i} is {x.numel()} tokens; it must be 1..{ctx - 1} (context window)")
        method = self._resolve_method(method or self.method)
        options = method_options if method_options is not None else (
            self.method_options if method == self.method else {})
        seqs, texts = [], []
        for i, x in enumerate(ids):
            gen = torch.Generator(device=self.target.device)
            gen.manual_seed(seed + i if seed is not None else random.randrange(2**63))
            drafter = make_drafter(method, self.target, self.draft, self.head, **dict(options))
            seqs.append(Sequence(x.to(self.target.device), drafter, sampling, max_new_tokens, frozenset(self.eos_ids),
                                 gen, tag=i))
            texts.append(TextAssembler(self.tokenizer, stops))
        dec = BatchDecoder(self.batch_target(), self.verify_cost(), self.batch_policy)
        waiting, limit = list(seqs), max_batch or len(seqs)
        self._batch_results = [None] * len(seqs)
        steps = [0] * len(seqs)

        def chunks(seq, new):
            i = seq.tag
            text = texts[i]
            delta = text.feed(new, final=seq.finished and seq.stats.finish_reason == "stop")
            steps[i] += 1
            if text.stopped_at is not None and not seq.finished:
                seq.cancelled = True
                seq._finish("stop")
            out = [(i, StreamChunk(delta, new, steps[i]))]
            if seq.finished:
                rest = text.finish()
                if rest:
                    out.append((i, StreamChunk(rest, [], steps[i])))
                self._batch_results[i] = GenerationResult(text.text, text.tokens, int(seq.prompt_ids.numel()),
                                                          method, seq.stats)
            return out

        while waiting or dec.rows:
            joining, waiting = waiting[: max(0, limit - dec.rows)], waiting[max(0, limit - dec.rows):]
            for seq, new in zip(joining, dec.add_many(joining)):  # newcomers prefilled together
                yield from chunks(seq, new)
            for seq, new in dec.step():
                yield from chunks(seq, new)

    def batch_results(self) -> list[GenerationResult]:
        """The results of the last finished :meth:`stream_batch`, in prompt order."""
        return list(self._batch_results)

    def batch_target(self):
        """The batched verifier over this target (built once)."""
        from drafttree.batching import BatchTarget

        if self._batch_target is None:
            self._batch_target = BatchTarget(self.target.model, getattr(self.head, "aux_layers", None))
        return self._batch_target

    def verify_cost(self):
        """This machine's verify-cost curve for the target (measured once, cached on disk)."""
        from drafttree.budget import cost_model_for

        if self._verify_cost is None:
            self._verify_cost = cost_model_for(self._runner, self.target.name)
        return self._verify_cost


def is_batch(prompt) -> bool:
    """A list of prompts (strings, token tensors or message lists), not one chat (a list of message dicts)."""
    return isinstance(prompt, (list, tuple)) and bool(prompt) and not isinstance(prompt[0], dict)


__all__ = ["GenerationResult", "GenerationStream", "SpeculativeModel", "StreamChunk", "asdict"]
