"""The server's scheduler: one thread owns the model and runs the batched decode loop for every request.

Requests wait in a bounded queue (full -> :class:`QueueFull`, answered 503 with Retry-After); between rounds
the waiting ones join the batch (up to ``max_batch`` rows), each round's tokens go to every request's
channel, a request whose client went away is cancelled and leaves the batch at the next round. Drafters are
pooled per method, so what a drafter learned about this target (calibration, gates) carries over.
"""

from __future__ import annotations

import asyncio
import collections
import random
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

import torch

from drafttree.accept import Sampling
from drafttree.batching import Sequence
from drafttree.detok import PrefixEnds, TextAssembler, min_tokens_of
from drafttree.drafters import make_drafter
from drafttree.errors import DraftTreeError
from drafttree.server.metrics import Metrics


class QueueFull(Exception):
    pass


@dataclass(eq=False)
class Job:
    """One request's generation and the channel its events go to (``("chunk", text, n_tokens, step, logprobs)``,
    ``("done", result_dict)`` or ``("error", status, message)``), thread-safe towards its event loop; ``logprobs``:
    the chunk's tokens' :class:`~drafttree.logprobs.TokenLogprob` entries when the request asked for them, else None."""

    ids: torch.Tensor
    method: str
    sampling: Sampling
    max_new_tokens: int
    stops: list[str]
    seed: int | None
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    seq: Sequence | None = None
    text: TextAssembler | None = None
    steps: int = 0
    cancelled: bool = False
    logprobs: int | None = None  # alternatives per token, when the request asked for log-probabilities
    end_ids: frozenset[int] | None = None  # tokens that end the generation (None: the model's end-of-sequence ones)
    include_stop: bool = False  # the text ends after a stop string, not before it
    skip_special: bool = True  # special tokens have no text (vLLM's skip_special_tokens)
    reported: int = 0  # tokens whose log-probabilities went out ...
    offset: int = 0  # ... and where the next one's text begins
    sent: list = field(default_factory=list)  # the (entry, offset) pairs that went out
    ends: PrefixEnds | None = None  # where each token's text ends (log-probability requests)
    ended: bool = False  # its last event ("done" or "error") went out
    arrived: float = field(default_factory=time.monotonic)
    first_at: float | None = None  # when its first token went out

    def push(self, *event) -> None:
        self.ended = self.ended or event[0] in ("done", "error")
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    def cancel(self) -> None:
        self.cancelled = True
        if self.seq is not None:
            self.seq.cancelled = True


class Scheduler:
    def __init__(self, sm, max_batch: int = 16, max_queue: int = 64):
        if max_batch <= 0 or max_queue <= 0:
            raise DraftTreeError(f"max_batch and max_queue must be > 0, got {max_batch} and {max_queue}")
        self.sm, self.max_batch, self.max_queue = sm, max_batch, max_queue
        self.decoder = sm.batch_decoder()
        # a model whose attention takes no packed rows serves one request at a time (BatchTarget.max_rows; a model
        # that verifies chains only: batching/one_by_one.py)
        self.max_batch = min(max_batch, self.decoder.target.max_rows or max_batch)
        self.pending: collections.deque[Job] = collections.deque()
        self.cond = threading.Condition()
        self.pool: dict[str, list] = collections.defaultdict(list)
        self.stopping = False
        self.served = 0
        self.metrics = Metrics()
        self.thread = threading.Thread(target=self._run, name="drafttree-scheduler", daemon=True)
        self.thread.start()

    # ---- called from the web server's threads ---------------------------------------------------------
    def submit(self, job: Job | list[Job]) -> None:
        """Queue a job, or a request's jobs (``n`` completions) all together or none of them."""
        jobs = job if isinstance(job, list) else [job]
        with self.cond:
            if len(self.pending) + len(jobs) > self.max_queue:
                raise QueueFull(f"{len(self.pending)} requests are already waiting (limit {self.max_queue})")
            self.pending.extend(jobs)
            self.cond.notify()

    def load(self) -> dict:
        return {"rows": self.decoder.rows, "waiting": len(self.pending), "max_batch": self.max_batch,
                "max_queue": self.max_queue, "served": self.served}

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify()
        self.thread.join(timeout=30)

    # ---- the model thread -----------------------------------------------------------------------------
    def _prepare(self, job: Job, drafter=None) -> None:
        """The job's sequence (drafter from the pool, seeded generator, text assembler), not yet in the batch."""
        sm = self.sm
        if drafter is None:
            drafter = self.pool[job.method].pop() if self.pool[job.method] else make_drafter(
                job.method, sm.target, sm.draft, sm.head, **(sm.method_options if job.method == sm.method else {}))
        gen = torch.Generator(device=sm.target.device)
        gen.manual_seed(job.seed if job.seed is not None else random.randrange(2**63))
        job.seq = Sequence(job.ids.to(sm.target.device), drafter, job.sampling, job.max_new_tokens,
                           frozenset(sm.eos_ids) if job.end_ids is None else job.end_ids, gen, tag=job,
                           logprobs=job.logprobs)
        if job.cancelled:  # cancel() sets the flag before it reads job.seq: one of the two sees the other
            job.seq.cancelled = True
        job.reported = job.offset = 0
        job.sent = []
        job.text = TextAssembler(sm.tokenizer, job.stops, job.include_stop, min_tokens_of(job.sampling),
                                 job.seq.eos_ids, job.skip_special)
        job.ends = None if job.logprobs is None else PrefixEnds(sm.tokenizer, job.skip_special)

    def _start_all(self, jobs: list[Job]) -> None:
        """Prefill the newcomers together (one packed forward); if that fails, one at a time, so that only a bad
        request gets its error."""
        ready = []
        for job in jobs:
            if not job.cancelled and self._guard(job, self._prepare):
                ready.append(job)
        if len(ready) > 1:
            try:
                firsts = self.decoder.add_many([j.seq for j in ready])
            except Exception:  # noqa: BLE001 - retried one by one below, where each error reaches its request
                dec, mine = self.decoder, {id(j.seq) for j in ready}
                keep = [i for i, s in enumerate(dec.active) if id(s) not in mine]
                dec.active = [dec.active[i] for i in keep]
                dec.target.keep(keep)
                dec.admission.drop([j.seq for j in ready])
                for job in ready:  # fresh sequences: the failed attempt may have emitted their first tokens
                    self._prepare(job, job.seq.drafter)
            else:  # delivered only once all joined (a failure here fails the batch: no request answered twice)
                for job, new in zip(ready, firsts):
                    if new is not None:  # None: its prefill ends in a later round, whose step delivers it
                        self._deliver(job, new)
                return
        for job in ready:
            self._guard(job, self._start_one)

    def _start_one(self, job: Job) -> None:
        new = self.decoder.add(job.seq)
        if new is not None:
            self._deliver(job, new)

    def _guard(self, job: Job, work) -> bool:
        """Run ``work(job)``; a bad request gets its error (400, or 500 for a bug), the server goes on."""
        try:
            work(job)
            return True
        except DraftTreeError as e:
            job.push("error", 400, str(e))
        except Exception as e:  # noqa: BLE001 - a bug in one request must not stop the server
            traceback.print_exc(file=sys.stderr)
            job.push("error", 500, f"internal server error: {type(e).__name__}: {e}")
            self.decoder.target.keep(list(range(len(self.decoder.active))))
        self.metrics.request_failed()
        return False

    def _deliver(self, job: Job, new: list[int]) -> None:
        seq = job.seq
        delta = job.text.feed(new, final=seq.finished and seq.stats.finish_reason == "stop")
        if job.text.stopped_at is not None and not seq.finished:
            seq.cancelled = True  # a stop string: the row leaves at the next round
            seq._finish("stop")
        if new or delta:
            job.steps += 1
            job.push("chunk", delta, len(new), job.steps, self._logprobs(job, seq.finished))
            if job.first_at is None:
                job.first_at = time.monotonic()
                self.metrics.first_token(job.first_at - job.arrived)
        if seq.finished:
            rest, lps = job.text.finish(), self._logprobs(job, True)
            if rest or lps:
                job.push("chunk", rest, 0, job.steps, lps)
            self.pool[job.method].append(seq.drafter)
            self.served += 1
            result = self._result(job)
            lengths = seq.stats.accept_lengths
            self.metrics.request_done(result["finish_reason"], result["prompt_tokens"], result["completion_tokens"],
                                      seq.stats.target_forwards, sum(lengths) - len(lengths),
                                      time.monotonic() - job.arrived, seq.stats.cached_tokens)
            job.push("done", result)

    def _logprobs(self, job: Job, final: bool) -> list | None:
        """(entry, text offset) of the tokens not yet reported whose text went out (all that count, once ``final``;
        text held back for a stop string holds back its tokens' entries too); EOS tokens are not reported."""
        if job.logprobs is None:
            return None
        tokens, entries, out = job.text.tokens, job.seq.stats.logprobs, []
        end = min(job.text.kept() if final else len(tokens), len(entries))
        ends = job.ends.update(tokens[:end])
        shown = len(job.text.emitted)
        while job.reported < end:
            i = job.reported
            if not final and ends[i] > shown:
                break
            if not (tokens[i] in self.sm.eos_ids and tokens[i] in job.seq.eos_ids):  # an end-of-sequence that ended it
                out.append((entries[i], job.offset))
            job.reported, job.offset = i + 1, ends[i]
        job.sent += out
        return out

    def _result(self, job: Job) -> dict:
        s = job.seq.stats
        lps = None
        if job.logprobs is not None:  # every entry that counts, with its text offset
            self._logprobs(job, True)
            lps = list(job.sent)
        return {"text": job.text.text, "prompt_tokens": int(job.ids.numel()), "completion_tokens": job.text.kept(),
                "cached_tokens": s.cached_tokens if self.sm.prefix_cache else None, "logprobs": lps,
                "finish_reason": "stop" if s.finish_reason == "stop" else "length",
                "drafttree": {"method": job.method, "tau": round(s.tau, 4), "target_forwards": s.target_forwards,
                              "tokens_per_second": round(s.tokens_per_second, 3),
                              "accept_lengths": s.accept_lengths, "wall_time": round(s.wall_time, 4)}}

    def _fail_all(self, err: Exception, joining: list[Job] = ()) -> None:
        """Every request in the batch (and those that were joining it) gets the error; the loop starts afresh."""
        traceback.print_exc(file=sys.stderr)
        jobs = {id(s.tag): s.tag for s in self.decoder.active + self.decoder.held_back}
        jobs.update((id(j), j) for j in joining)
        for job in jobs.values():
            if not job.ended:  # answered already (done, or its own error): nothing more to say
                job.push("error", 500, f"internal server error: {type(err).__name__}: {err}")
                self.metrics.request_failed()
        self.decoder = self.sm.batch_decoder()
        self.decoder.target.keep([])
        self.decoder.target.forget_buffers()  # a failed forward may have left them half-written

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.pending and not self.decoder.rows and not self.stopping:
                    self.cond.wait()
                if self.stopping:
                    for job in list(self.pending) + [s.tag for s in self.decoder.active + self.decoder.held_back]:
                        job.push("error", 503, "the server is shutting down")
                    return
                joining = []
                while self.pending and self.decoder.rows + len(joining) < self.max_batch:
                    joining.append(self.pending.popleft())
                self.decoder.waiting = len(self.pending)
            try:  # a failure anywhere in a round fails the batch's requests, never the loop (nothing would answer)
                self._start_all(joining)
                if not self.decoder.rows:
                    continue
                for seq, new in self.decoder.step():
                    if seq.stats.finish_reason == "cancelled":
                        self.pool[seq.tag.method].append(seq.drafter)
                        self.metrics.request_aborted()
                        continue
                    self._deliver(seq.tag, new)
            except Exception as e:  # noqa: BLE001
                self._fail_all(e, joining)
