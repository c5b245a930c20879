"""What generation returns: a finished answer (:class:`GenerationResult`), its pieces as they stream
(:class:`StreamChunk`, :class:`GenerationStream`). Kept apart from the API that makes them (api.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from drafttree.decode import DecodeStats
from drafttree.logprobs import TokenLogprob


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]  # the new token ids (EOS included when it ended the generation; none past a stop string)
    prompt_tokens: int
    method: str
    stats: DecodeStats = field(repr=False)
    logprobs: list[TokenLogprob] | None = field(default=None, repr=False)  # per token of ``tokens``, when asked for

    @property
    def new_tokens(self) -> int:
        """Tokens of the answer (``len(tokens)``); ``stats.new_tokens`` also counts any decoded past a stop string."""
        return len(self.tokens)

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

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens whose keys the prefix cache already held (``prefix_cache=True``), not computed again."""
        return self.stats.cached_tokens

    def to_dict(self) -> dict:
        s = self.stats
        return {
            "text": self.text, "method": self.method, "new_tokens": self.new_tokens,
            "prompt_tokens": self.prompt_tokens, "cached_tokens": s.cached_tokens,
            "tokens_per_second": round(s.tokens_per_second, 3),
            "tau": round(s.tau, 4), "target_forwards": s.target_forwards, "wall_time": round(s.wall_time, 4),
            "finish_reason": s.finish_reason, "accept_lengths": s.accept_lengths,
            "time_split": {"prefill": round(s.time_prefill, 4), "draft": round(s.time_draft, 4),
                           "verify": round(s.time_verify, 4), "other": round(s.time_other, 4)},
            "tokens": self.tokens,
            **({} if self.logprobs is None else {"logprobs": [asdict(t) for t in self.logprobs]}),
        }


@dataclass
class StreamChunk:
    """One target forward's worth of output: the tokens it accepted and the text they add. With stop strings, text
    that a stop string could still cut is held back, and so are its tokens (they come with a later chunk, or never
    when the stop string cuts them): the chunks' tokens are always the result's."""

    text: str
    tokens: list[int]
    step: int
    logprobs: list[TokenLogprob] | None = None  # per token of ``tokens``, when asked for (``logprobs=k``)


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
