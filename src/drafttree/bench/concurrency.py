"""``drafttree bench concurrency``: many users at once. For each number of concurrent users U, U x R requests
(first turns of the six tasks' questions, interleaved) are served at most U at a time by continuous batching:
R = 1 is a burst (U requests arrive together; the last rounds run with the slowest few rows), R > 1 a steady
load (each user sends its next request when the last one ends: a finished row's place goes to a newcomer).
Printed per method: aggregate tokens/s, tokens/s per user (R = 1: tokens / time until that user's last token;
R > 1: aggregate / U), tau and the mean verified tree size. Methods: ours (``auto``, ``ar`` = batched plain
decoding, any other; ``METHOD:prefix_cache=true``: with the prefix cache, its pool emptied before each run) and
``hf-ar`` (transformers' ``generate`` on the same padded batch, bursts only). With ``turns`` N > 1 each user holds
a conversation instead (a question of at least N turns): its next turn, with the answers so far, joins the batch
when its last answer ends, as a chat client of the server sends them; the mean time to a turn's first token is
printed too. With ``repeats`` every (U, method) runs that many times, methods interleaved, and the median run is
reported."""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from drafttree.batching.admission import PREFILL_CHUNK, check_chunk
from drafttree.bench.config import parse_method, positive_ints
from drafttree.bench.tasks import BUILTIN, load_tasks
from drafttree.errors import DraftTreeError


def interleaved_prompts(tasks: list[str], n: int, data_dir=None) -> list[str]:
    loaded = load_tasks(tasks, data_dir)
    out, i = [], 0
    while len(out) < n:
        added = False
        for t in loaded:
            if i < len(t.questions):
                out.append(t.questions[i].turns[0])
                added = True
                if len(out) == n:
                    break
        if not added:
            raise DraftTreeError(f"only {len(out)} questions in {', '.join(tasks)}; {n} users need {n}")
        i += 1
    return out


def interleaved_conversations(tasks: list[str], n: int, turns: int, data_dir=None) -> list[list[str]]:
    """``n`` distinct questions of at least ``turns`` turns (their first ``turns``), the tasks interleaved."""
    loaded = [[q.turns[:turns] for q in t.questions if len(q.turns) >= turns] for t in load_tasks(tasks, data_dir)]
    out = [c for row in itertools.zip_longest(*loaded) for c in row if c is not None][:n]
    if len(out) < n:
        raise DraftTreeError(f"only {len(out)} questions of {turns}+ turns in {', '.join(tasks)}; {n} users need {n}")
    return out


def model_for(sm, spec: str, cached: dict):
    """(the model that serves ``spec``, its method and options): ``prefix_cache=true`` is a model of its own over the
    same weights whose batches keep finished rows' states (``cached`` holds it once made)."""
    if getattr(sm.head, "kind", "") == "assistant":
        raise DraftTreeError("the concurrency benchmark packs sequences into rows; with a Gemma 4 assistant loaded "
                             "sequences decode one after another (it drafts for one at a time)")
    method, options = parse_method(spec)
    cache = options.pop("prefix_cache", False)
    if cache not in (True, False):
        raise DraftTreeError(f"prefix_cache={cache!r} in {spec!r}: choose true or false")
    if not cache:
        return sm, method, options
    if "sm" not in cached:
        from drafttree.api import SpeculativeModel

        cached["sm"] = SpeculativeModel(sm.target, draft=sm.draft, head=sm.head, prefix_cache=True)
    cached["sm"].batch_target().pool.clear()  # each run starts with nothing kept
    return cached["sm"], method, options


def run_conversations(sm, convs: list[list[str]], spec: str, max_new_tokens: int, max_batch: int,
                      cached: dict) -> dict:
    """Every conversation turn by turn, at most ``max_batch`` rows at a time: a turn (the conversation so far, its
    answers included) joins when the turn before it ends."""
    from drafttree.accept import Sampling
    from drafttree.batching import BatchDecoder, Sequence
    from drafttree.drafters import make_drafter

    lm, method, options = model_for(sm, spec, cached)
    method = lm._resolve_method(method)
    dec = BatchDecoder(lm.batch_target(), lm.verify_cost(), lm.batch_policy, prefill_chunk=lm.prefill_chunk)
    max_batch = min(max_batch, dec.target.max_rows or max_batch)  # one at a time where packed rows cannot attend
    messages: list[list[dict]] = [[] for _ in convs]
    done = [0] * len(convs)
    tokens, finish, ttft, taus, sizes = [0] * len(convs), [0.0] * len(convs), [], [], []
    prompt = reused = 0
    t0 = time.perf_counter()

    def next_turn(u: int) -> tuple[Sequence, float]:
        messages[u].append({"role": "user", "content": convs[u][done[u]]})
        ids = lm.encode_prompt(messages[u]).to(lm.target.device)
        drafter = make_drafter(method, lm.target, lm.draft, lm.head, **options)
        return Sequence(ids, drafter, Sampling(), max_new_tokens, frozenset(lm.eos_ids), tag=u), time.perf_counter()

    def ended(seq: Sequence) -> None:
        nonlocal prompt, reused
        u = seq.tag
        text = lm.tokenizer.decode([t for t in seq.tokens if t not in lm.eos_ids], skip_special_tokens=True)
        messages[u].append({"role": "assistant", "content": text})
        tokens[u] += len(seq.tokens)
        finish[u] = time.perf_counter() - t0
        taus.append(seq.stats.tau)
        sizes.extend(seq.stats.tree_sizes)
        prompt += seq.prompt_ids.numel()
        reused += seq.stats.cached_tokens
        done[u] += 1
        if done[u] < len(convs[u]):
            waiting.append(next_turn(u))

    waiting = [next_turn(u) for u in range(len(convs))]
    live: set[int] = set()
    held: dict[int, float] = {}  # newcomers whose prefill waits for a later round: when they were ready
    while waiting or dec.rows:
        joining, waiting = waiting[: max(0, max_batch - dec.rows)], waiting[max(0, max_batch - dec.rows):]
        dec.waiting = len(waiting)
        for (seq, ready), new in zip(joining, dec.add_many([s for s, _ in joining])):
            live.add(id(seq))
            if new is None:  # its prefill ends in a later round (admission.py)
                held[id(seq)] = ready
                continue
            ttft.append(time.perf_counter() - ready)
            if seq.finished:
                live.discard(id(seq))
                ended(seq)
        for seq, _ in dec.step():
            if id(seq) in held:
                ttft.append(time.perf_counter() - held.pop(id(seq)))
            if seq.finished and id(seq) in live:
                live.discard(id(seq))
                ended(seq)
    wall = time.perf_counter() - t0
    return {"wall": wall, "tokens": tokens, "finish": finish, "tau": statistics.mean(taus),
            "tree": statistics.mean(sizes) if sizes else 1.0, "ttft": statistics.mean(ttft),
            "cached_share": reused / max(1, prompt)}


def run_ours(sm, prompts: list[str], spec: str, max_new_tokens: int, max_batch: int | None = None,
             cached: dict | None = None) -> dict:
    """``spec``: a method, with options as in ``drafttree bench`` (``auto:costly_in_batches=true``)."""
    sm, method, options = model_for(sm, spec, {} if cached is None else cached)
    t0 = time.perf_counter()
    done: dict[int, float] = {}
    wait = 0.0  # the longest a user waited between two of its chunks (a newcomer's prefill stalls every row)
    for i, _chunk in sm.stream_batch(prompts, max_new_tokens, method=None if method == "auto" else method,
                                     max_batch=max_batch or len(prompts), method_options=options or None):
        now = time.perf_counter() - t0
        if i in done:
            wait = max(wait, now - done[i])
        done[i] = now
    wall = time.perf_counter() - t0
    results = sm.batch_results()
    tokens = [r.new_tokens for r in results]
    sizes = [s for r in results for s in r.stats.tree_sizes]
    return {"wall": wall, "tokens": tokens, "finish": [done[i] for i in range(len(prompts))], "longest_wait": wait,
            "tau": statistics.mean(r.tau for r in results), "tree": statistics.mean(sizes) if sizes else 1.0}


@torch.inference_mode()
def run_hf(sm, prompts: list[str], max_new_tokens: int) -> dict:
    """transformers' generate over the left-padded batch (greedy), stopping at EOS per row."""
    tok, model = sm.tokenizer, sm.target.model
    ids = [sm.encode_prompt(p).tolist() for p in prompts]
    width = max(map(len, ids))
    pad = tok.pad_token_id if tok.pad_token_id is not None else sorted(sm.eos_ids)[0]
    batch = torch.tensor([[pad] * (width - len(x)) + x for x in ids], device=sm.target.device)
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=sm.target.device)
    t0 = time.perf_counter()
    out = model.generate(batch, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=sorted(sm.eos_ids), pad_token_id=pad, top_k=None, top_p=None)
    wall = time.perf_counter() - t0
    tokens = []
    for row in out[:, width:].tolist():
        n = len(row)
        for j, t in enumerate(row):
            if t in sm.eos_ids:
                n = j + 1
                break
        tokens.append(n)
    return {"wall": wall, "tokens": tokens, "finish": [wall] * len(prompts), "tau": 1.0, "tree": 1.0}


def measure(sm, users: list[int], methods: list[str], max_new_tokens: int, tasks: list[str], data_dir=None,
            warmup: bool = True, requests_per_user: int = 1, repeats: int = 1, alone: bool = False,
            turns: int = 1) -> list[dict]:
    """With ``alone``, ``auto``'s rows also serve the same requests one at a time (``alone_tps``): the batch's
    gain over serving them alone, on the same work (the 1-user run is one request, a different one). ``turns`` > 1:
    each user a conversation of that many turns (:func:`run_conversations`)."""
    R = max(1, requests_per_user)
    if R > 1 and "hf-ar" in methods:
        raise DraftTreeError("hf-ar serves one padded batch: use it with --requests-per-user 1")
    if turns > 1 and (R > 1 or alone or "hf-ar" in methods):
        raise DraftTreeError("--turns serves conversations of our methods: without --requests-per-user, --alone or "
                             "hf-ar")
    cached: dict = {}
    if turns > 1:
        return _measure_conversations(sm, users, methods, max_new_tokens,
                                      interleaved_conversations(tasks, max(users), turns, data_dir), warmup, repeats,
                                      cached)
    prompts = interleaved_prompts(tasks, max(users) * R, data_dir)
    if warmup:
        for m in methods:  # first calls pay for allocations, calibration and kernel selection
            (run_hf(sm, prompts[:2], 8) if m == "hf-ar" else run_ours(sm, prompts[:2], m, 8, cached=cached))
    rows = []
    for u in users:
        if warmup and u * R > 2:
            _warm_batch(sm, methods, prompts[: u * R], u, cached)
        runs: dict[str, list[dict]] = {m: [] for m in methods}
        for rep in range(max(1, repeats)):
            # interleaved, the order reversed every other repeat: a change in machine load (or whatever the run
            # before leaves behind) hits every method alike
            for m in (methods if rep % 2 == 0 else methods[::-1]):
                batch = prompts[: u * R]
                runs[m].append(run_hf(sm, batch, max_new_tokens) if m == "hf-ar"
                               else run_ours(sm, batch, m, max_new_tokens, max_batch=u, cached=cached))
        for m in methods:
            aggs = [sum(r["tokens"]) / r["wall"] for r in runs[m]]
            r = runs[m][sorted(range(len(aggs)), key=aggs.__getitem__)[len(aggs) // 2]]  # the median run
            agg = sum(r["tokens"]) / r["wall"]
            per_user = statistics.mean(n / f for n, f in zip(r["tokens"], r["finish"])) if R == 1 else agg / u
            row = {"users": u, "method": m, "aggregate_tps": agg, "per_user_tps": per_user,
                   "tokens": sum(r["tokens"]), "wall": r["wall"], "tau": r["tau"], "mean_tree": r["tree"],
                   "requests": u * R, "all_aggregate_tps": [round(a, 2) for a in aggs]}
            if "longest_wait" in r:
                row["longest_wait_s"] = round(r["longest_wait"], 4)
            if m == "auto" and "ar" in runs and len(runs[m]) > 1:  # each repeat's auto run over its ar run (adjacent
                # in time: the host's drift between repeats, 10-20% here, cancels in a pair, not in a ratio of medians)
                row["paired_vs_ar"] = [round(sum(a["tokens"]) / a["wall"] / (sum(b["tokens"]) / b["wall"]), 4)
                                       for a, b in zip(runs["auto"], runs["ar"])]
            if alone and m == "auto":
                one = r if u * R == 1 else run_ours(sm, prompts[: u * R], m, max_new_tokens, max_batch=1)
                row["alone_tps"] = sum(one["tokens"]) / one["wall"]
            rows.append(row)
            spread = f"   runs {', '.join(f'{a:.1f}' for a in aggs)}" if len(aggs) > 1 else ""
            wait = f"   longest wait {row['longest_wait_s']:.2f} s" if "longest_wait_s" in row else ""
            print(f"[concurrency] {u:3d} users  {m:10s} aggregate {row['aggregate_tps']:7.1f} tok/s   per user "
                  f"{row['per_user_tps']:6.2f} tok/s   tau {row['tau']:.2f}   tree {row['mean_tree']:.1f}"
                  f"{wait}{spread}",
                  file=sys.stderr, flush=True)
    return rows


def _warm_batch(sm, methods: list[str], prompts: list[str], users: int, cached: dict) -> None:
    """A short untimed burst of every method at this batch size: the first run at a new size grows the shared cache
    to its rows and the longest prompt, and meets the size's first shapes; charged to whichever method ran first
    (in stop 66's burst of 64 the first pair measured 0.77x, the next ones 0.93-1.05x)."""
    for m in methods:
        if m == "hf-ar":
            run_hf(sm, prompts[:users], 4)
        else:
            run_ours(sm, prompts, m, 4, max_batch=users, cached=cached)


def _measure_conversations(sm, users, methods, max_new_tokens, convs, warmup, repeats, cached) -> list[dict]:
    if warmup:
        for m in methods:
            run_conversations(sm, [c[:2] for c in convs[:2]], m, 8, 2, cached)
    rows = []
    for u in users:
        runs: dict[str, list[dict]] = {m: [] for m in methods}
        for rep in range(max(1, repeats)):
            for m in (methods if rep % 2 == 0 else methods[::-1]):
                runs[m].append(run_conversations(sm, convs[:u], m, max_new_tokens, u, cached))
        for m in methods:
            aggs = [sum(r["tokens"]) / r["wall"] for r in runs[m]]
            r = runs[m][sorted(range(len(aggs)), key=aggs.__getitem__)[len(aggs) // 2]]
            agg = sum(r["tokens"]) / r["wall"]
            rows.append({"users": u, "method": m, "aggregate_tps": agg, "per_user_tps": agg / u,
                         "tokens": sum(r["tokens"]), "wall": r["wall"], "tau": r["tau"], "mean_tree": r["tree"],
                         "requests": u * len(convs[0]), "ttft": r["ttft"], "cached_share": r["cached_share"],
                         "all_aggregate_tps": [round(a, 2) for a in aggs]})
            print(f"[concurrency] {u:3d} users  {m:10s} aggregate {agg:7.1f} tok/s   per user {agg / u:6.2f} tok/s   "
                  f"tau {r['tau']:.2f}   first token {1000 * r['ttft']:6.0f} ms   prompt cached "
                  f"{100 * r['cached_share']:.0f}%", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict], methods: list[str]) -> str:
    users = sorted({r["users"] for r in rows})
    get = {(r["users"], r["method"]): r for r in rows}
    alone = get.get((1, "auto"))
    same = any("alone_tps" in r for r in rows)  # the same requests served one at a time, measured
    both = "auto" in methods and "ar" in methods
    # longest wait: the longest a user waited between two of its chunks (the median run's)
    lines = ["| users | " + " | ".join(f"{m} aggregate tok/s (per user)" for m in methods)
             + (" | auto vs ar | auto vs auto alone |" if both else " |")
             + (" auto vs the same requests one at a time |" if same else ""),
             "|---|" + "---|" * len(methods) + ("---|---|" if both else "") + ("---|" if same else "")]
    for u in users:
        cells = [f"{get[(u, m)]['aggregate_tps']:.1f} ({get[(u, m)]['per_user_tps']:.2f})"
                 + (f"; longest wait {get[(u, m)]['longest_wait_s']:.2f} s" if "longest_wait_s" in get[(u, m)] else "")
                 for m in methods]
        if "ttft" in get[(u, methods[0])]:  # conversations: how long a turn waits for its first token
            cells = [f"{c}; first token {1000 * get[(u, m)]['ttft']:.0f} ms, "
                     f"{100 * get[(u, m)]['cached_share']:.0f}% of prompts cached" for c, m in zip(cells, methods)]
        extra = ""
        if "auto" in methods and "ar" in methods:
            a, b = get[(u, "auto")], get[(u, "ar")]
            pairs = a.get("paired_vs_ar")
            extra = f" {a['aggregate_tps'] / b['aggregate_tps']:.2f}x" + (
                f" (runs paired: median {statistics.median(pairs):.2f}x, {min(pairs):.2f}-{max(pairs):.2f}x) |"
                if pairs else " |")
            extra += f" {a['aggregate_tps'] / alone['aggregate_tps']:.2f}x |" if alone else " – |"
        if same:
            a = get.get((u, "auto"), {})
            extra += (f" {a['aggregate_tps'] / a['alone_tps']:.2f}x ({a['alone_tps']:.1f} tok/s alone) |"
                      if "alone_tps" in a else " – |")
        lines.append(f"| {u} | " + " | ".join(cells) + " |" + extra)
    return "\n".join(lines) + "\n"


def cmd_concurrency(args) -> int:
    import drafttree

    if args.threads:
        torch.set_num_threads(args.threads)
    users = positive_ints(args.users, "--users")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if args.requests_per_user <= 0 or args.repeats <= 0:
        raise DraftTreeError("--requests-per-user and --repeats must be positive")
    if args.requests_per_user > 1 and "hf-ar" in methods:
        raise DraftTreeError("hf-ar serves one padded batch: use it with --requests-per-user 1")
    if args.turns <= 0:
        raise DraftTreeError(f"--turns must be positive, got {args.turns}")
    check_chunk(args.prefill_chunk)
    sm = drafttree.SpeculativeModel.from_pretrained(args.model, dtype=args.dtype, device=args.device)
    sm.prefill_chunk = args.prefill_chunk
    rows = measure(sm, users, methods, args.max_new_tokens, tasks, args.data_dir,
                   requests_per_user=args.requests_per_user, repeats=args.repeats, alone=args.alone, turns=args.turns)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"command": "drafttree bench concurrency " + " ".join(sys.argv[3:]), "model": sm.target.name,
            "dtype": str(sm.target.dtype).replace("torch.", ""), "device": str(sm.target.device),
            "threads": torch.get_num_threads(), "max_new_tokens": args.max_new_tokens, "tasks": tasks,
            "auto_is": sm.method, "requests_per_user": args.requests_per_user, "repeats": args.repeats,
            "alone": args.alone, "turns": args.turns, "prefill_chunk": args.prefill_chunk}
    (out / "concurrency.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    md = (f"`{meta['command']}` — {meta['model']}, {meta['dtype']}, {meta['device']}, {meta['threads']} threads, "
          f"{args.max_new_tokens} new tokens per request, {load_words(meta)}, T=0; auto = {sm.method}\n\n"
          + table(rows, methods))
    (out / "concurrency.md").write_text(md)
    plot(rows, methods, out / "concurrency.png")
    print(md)
    return 0


def load_words(meta: dict) -> str:
    r, n, turns = meta.get("requests_per_user", 1), meta.get("repeats", 1), meta.get("turns", 1)
    load = "one burst (every user's request at once)" if r == 1 else f"steady load ({r} requests per user in turn)"
    if turns > 1:
        load = f"a conversation per user ({turns} turns, each sent when the last answer ends)"
    return load + (f", median of {n} interleaved runs" if n > 1 else "")


def plot(rows: list[dict], methods: list[str], path: Path) -> None:
    """Aggregate tokens/s against concurrent users, one line per method (log-scaled users)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for m in methods:
        pts = sorted((r["users"], r["aggregate_tps"]) for r in rows if r["method"] == m)
        ax.plot([u for u, _ in pts], [t for _, t in pts], marker="o", label=m)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent users")
    ax.set_ylabel("aggregate tokens / s")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render_section(run_dir: Path, img_dir: Path, slug: str) -> str:
    """The benchmark document's section for a ``bench concurrency`` run directory."""
    import shutil

    data = json.loads((run_dir / "concurrency.json").read_text())
    meta, rows = data["meta"], data["rows"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    text = [f"## Many users at once: {meta['model']}, {meta['dtype']}, {meta['device']}, {meta['threads']} threads, "
            f"{meta['max_new_tokens']} new tokens per request, {load_words(meta)}, T=0", "", "Command:", "", "```sh",
            meta["command"],
            "```", "", f"Aggregate tokens/s (tokens/s per user in brackets; a user's rate is its tokens over the "
            f"time until its last token, prefill and queueing included). auto = {meta['auto_is']}.", "",
            table(rows, methods)]
    if (run_dir / "concurrency.png").exists():
        img_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(run_dir / "concurrency.png", img_dir / f"{slug}-concurrency.png")
        text += ["", f"![aggregate tokens/s against users](img/{slug}-concurrency.png)", ""]
    return "\n".join(text)


def add_parser(rsub) -> None:
    c = rsub.add_parser("concurrency", help="aggregate and per-user throughput with U concurrent users (batched)")
    c.add_argument("--users", default="1,4,16,64", help="comma-separated numbers of concurrent users")
    c.add_argument("--methods", default="auto,ar,hf-ar", help="ours (auto, ar, ...) and hf-ar")
    c.add_argument("--tasks", default=",".join(BUILTIN), help="question sets the prompts come from")
    c.add_argument("--data-dir", default=None, help="folder with alpaca.jsonl")
    c.add_argument("--max-new-tokens", type=int, default=64)
    c.add_argument("--requests-per-user", type=int, default=1,
                   help="1: one burst; R > 1: each user sends R requests in turn (steady load)")
    c.add_argument("--turns", type=int, default=1,
                   help="N > 1: each user a conversation of N turns (questions with N+ turns, e.g. "
                        "data/heldout/chat_turns.jsonl), the next turn sent when the last answer ends")
    c.add_argument("--repeats", type=int, default=1, help="runs per (users, method), interleaved; median reported")
    c.add_argument("--alone", action="store_true",
                   help="also serve auto's requests one at a time: the batch's gain on the same requests")
    c.add_argument("--prefill-chunk", type=int, default=PREFILL_CHUNK,
                   help="prompt tokens a round prefills at most while rows decode (chunked prefill; 0: at once)")
    c.add_argument("--model", default="smollm2-135m-instruct")
    c.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    c.add_argument("--device", default="auto")
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--out", default="runs/concurrency")
    c.set_defaults(func=cmd_concurrency)
