"""``drafttree train`` (EAGLE head) and ``drafttree train-length`` (AdaEAGLE LDLP) subcommands."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields

from drafttree.errors import DraftTreeError, positive_int


def _add_config_args(p: argparse.ArgumentParser, cls, skip: tuple[str, ...]) -> None:
    for f in fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        p.add_argument(flag, type=type(f.default) if f.default is not None else str, default=f.default,
                       help=f"{f.metadata.get('help', '')} (default: {f.default!r})".lstrip())


def cmd_train(args) -> int:
    from drafttree.models import load_model
    from drafttree.train.head import TrainConfig, train_head

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    if cfg.epochs <= 0 or cfg.lr <= 0 or cfg.batch_tokens <= 0 or cfg.ttt_steps <= 0:
        raise DraftTreeError("epochs, lr, batch-tokens and ttt-steps must be > 0")
    target = load_model(args.model, dtype=args.dtype, device=args.device)
    summary = train_head(target, cfg, resume=args.resume)
    print(json.dumps(summary, indent=1))
    return 0


def cmd_eval_head(args) -> int:
    """Held-out accuracy of one or more heads on the same held-out conversations (the training split's)."""
    import torch

    from drafttree.heads import load_head_for
    from drafttree.models import load_model
    from drafttree.train.data import load_feature_dir
    from drafttree.train.unroll import evaluate, split_samples

    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_model(args.model, dtype=args.dtype, device=args.device)
    heads = [load_head_for(target, None if h == "auto" else h, required=True) for h in args.head]
    for h in heads:
        if h.kind in ("assistant", "dflash"):
            what = "a Gemma 4 assistant" if h.kind == "assistant" else "a DFlash drafter"
            raise DraftTreeError(f"{h.path} is {what}: eval-head measures EAGLE heads on extracted features; measure "
                                 "it with `drafttree bench --head DIR`")
    manifest, samples = load_feature_dir(args.features, with_aux=any(h.kind == "eagle3" for h in heads))
    if manifest["target"]["hidden_size"] != target.config.hidden_size:
        raise DraftTreeError(f"features in {args.features} do not belong to {target.name}")
    for h in heads:
        if h.kind == "eagle3" and list(h.aux_layers) != list(manifest.get("aux_layers") or []):
            raise DraftTreeError(f"head {h.path} fuses layers {h.aux_layers}; {args.features} holds "
                                 f"{manifest.get('aux_layers')}")
    _, held = split_samples(samples, args.eval_samples, args.seed, args.eval_after)
    lm_w = target.model.get_output_embeddings().weight.detach()
    report = {str(h.path): evaluate(h, held, args.depth, 2048, target.device, lm_w) for h in heads}
    print(json.dumps({"held_out_samples": len(held), "eval_after": args.eval_after, "heads": report}, indent=1))
    return 0


def cmd_train_curves(args) -> int:
    """Held-out accuracy against CPU-hours for one or more runs: a markdown table, and a plot with --plot."""
    from drafttree.train.curves import describe, markdown_table, plot, run_points

    if args.assume_threads is not None and args.assume_threads < 1:
        raise DraftTreeError("--assume-threads must be >= 1")
    curves = {}
    for r in args.run:
        points = run_points(r, args.assume_threads)  # checks the run first
        label = describe(r)
        curves[label if label not in curves else f"{r} {label}"] = points
    print(markdown_table(curves))
    if args.plot:
        plot(curves, args.plot)
        print(f"plot: {args.plot}")
    return 0


def add_parser(sub) -> None:
    from drafttree.train.head import TrainConfig

    t = sub.add_parser("train", help="train an EAGLE head on extracted features (resumable)")
    t.add_argument("--features", required=True, help="feature directory from `drafttree data features`")
    t.add_argument("--out", required=True, help="run directory; the head is written to OUT/head")
    t.add_argument("--model", default="smollm2-135m-instruct", help="the target the features came from")
    t.add_argument("--dtype", default="bfloat16", help="the target's dtype (the head trains in float32)")
    t.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    t.add_argument("--threads", type=positive_int, default=None, help="CPU threads (default: torch's choice)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out after a crash or kill")
    _add_config_args(t, TrainConfig, skip=("features", "out"))
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval-head", help="held-out draft accuracy of heads, side by side on the same conversations")
    e.add_argument("--features", required=True, help="feature directory from `drafttree data features`")
    e.add_argument("--head", action="append", required=True, help="head directory or `auto`; repeat to compare")
    e.add_argument("--model", default="smollm2-135m-instruct")
    e.add_argument("--dtype", default="float32")
    e.add_argument("--device", default="auto")
    e.add_argument("--threads", type=positive_int, default=None)
    e.add_argument("--eval-samples", type=int, default=64)
    e.add_argument("--eval-after", type=int, default=0, help="held-out samples drawn from this index on, as in "
                   "`drafttree train --eval-after`")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--depth", type=int, default=5, help="draft steps to score")
    e.set_defaults(func=cmd_eval_head)

    c = sub.add_parser("train-curves", help="held-out accuracy against CPU-hours of training runs, side by side")
    c.add_argument("run", nargs="+", help="run directories of `drafttree train` (their --out)")
    c.add_argument("--plot", default=None, help="write a PNG plot here")
    c.add_argument("--assume-threads", type=int, default=None,
                   help="threads of runs written before runs recorded them")
    c.set_defaults(func=cmd_train_curves)

    try:
        from drafttree.train.length import add_length_parser
    except ModuleNotFoundError:
        return
    add_length_parser(sub)
