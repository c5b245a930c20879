"""``GET /metrics``: the server's counters in Prometheus' text format, as vLLM exposes its own (requests, tokens,
latencies, and what speculation bought: tokens per target forward, draft tokens accepted)."""

from __future__ import annotations

import threading
from collections import Counter


class Metrics:
    """Counters the scheduler thread adds to as requests end; read by the web server's threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self.finished: Counter[str] = Counter()  # by finish reason
        self.failed = 0
        self.prompt_tokens = self.generation_tokens = self.forwards = self.accepted = 0
        self.cached_tokens = 0  # prompt tokens the prefix cache held (--enable-prefix-caching)
        self.latency_sum = self.first_token_sum = 0.0
        self.first_tokens = 0

    def request_done(self, reason: str, prompt_tokens: int, generation_tokens: int, forwards: int, accepted: int,
                     latency: float, cached_tokens: int = 0) -> None:
        """``accepted``: the drafted tokens its forwards accepted (tokens past a stop string included)."""
        with self._lock:
            self.cached_tokens += cached_tokens
            self.finished[reason] += 1
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += generation_tokens
            self.forwards += forwards
            self.accepted += accepted
            self.latency_sum += latency

    def request_aborted(self) -> None:
        """A request whose client went away before it ended."""
        with self._lock:
            self.finished["abort"] += 1

    def request_failed(self) -> None:
        with self._lock:
            self.failed += 1

    def first_token(self, seconds: float) -> None:
        with self._lock:
            self.first_tokens += 1
            self.first_token_sum += seconds

    def render(self, model: str, running: int, waiting: int) -> str:
        """The exposition text (version 0.0.4)."""
        label = f'model_name="{_escape(model)}"'
        with self._lock:
            done = sum(self.finished.values())
            rows = [
                ("drafttree_num_requests_running", "gauge", "requests decoding now (rows of the batch)",
                 [("", running)]),
                ("drafttree_num_requests_waiting", "gauge", "requests queued for a row", [("", waiting)]),
                ("drafttree_request_success_total", "counter", "requests answered, by finish reason",
                 [(f',finished_reason="{r}"', n) for r, n in sorted(self.finished.items())] or [("", 0)]),
                ("drafttree_request_failure_total", "counter", "requests that ended in an error", [("", self.failed)]),
                ("drafttree_prompt_tokens_total", "counter", "prompt tokens of answered requests",
                 [("", self.prompt_tokens)]),
                ("drafttree_prompt_tokens_cached_total", "counter", "prompt tokens of answered requests that the "
                 "prefix cache held (not computed again)", [("", self.cached_tokens)]),
                ("drafttree_generation_tokens_total", "counter", "tokens generated for answered requests",
                 [("", self.generation_tokens)]),
                ("drafttree_target_forwards_total", "counter", "target forwards of answered requests (each row of "
                 "a batched forward counts once; prefill included)", [("", self.forwards)]),
                ("drafttree_accepted_draft_tokens_total", "counter", "drafted tokens the target accepted (tokens "
                 "its forwards did not produce themselves)", [("", self.accepted)]),
                ("drafttree_e2e_request_latency_seconds", "summary", "from arrival to the last token",
                 [("_sum", self.latency_sum, ""), ("_count", done - self.finished["abort"], "")]),
                ("drafttree_time_to_first_token_seconds", "summary", "from arrival to the first token",
                 [("_sum", self.first_token_sum, ""), ("_count", self.first_tokens, "")]),
            ]
        out = []
        for name, kind, doc, samples in rows:
            out += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]
            for sample in samples:
                if len(sample) == 3:  # a summary's _sum / _count
                    out.append(f"{name}{sample[0]}{{{label}}} {_number(sample[1])}")
                else:
                    out.append(f"{name}{{{label}{sample[0]}}} {_number(sample[1])}")
        return "\n".join(out) + "\n"


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(x) -> str:
    return str(x) if isinstance(x, int) else repr(float(x))
