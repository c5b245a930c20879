"""``drafttree train`` (EAGLE head) and ``drafttree train-length`` (AdaEAGLE LDLP) subcommands."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields

from drafttree.errors import DraftTreeError


def _add_config_args(p: argparse.ArgumentParser, cls, skip: tuple[str, ...]) -> None:
    for f in fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        p.add_argument(flag, type=type(f.default) if f.default is not None else str, default=f.default)


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


def add_parser(sub) -> None:
    from drafttree.train.head import TrainConfig

    t = sub.add_parser("train", help="train an EAGLE head on extracted features (resumable)")
    t.add_argument("--features", required=True, help="feature directory from `drafttree data features`")
    t.add_argument("--out", required=True, help="run directory; the head is written to OUT/head")
    t.add_argument("--model", default="smollm2-135m-instruct", help="the target the features came from")
    t.add_argument("--dtype", default="bfloat16")
    t.add_argument("--device", default="auto")
    t.add_argument("--threads", type=int, default=None)
    t.add_argument("--resume", action="store_true", help="continue the run in --out after a crash or kill")
    _add_config_args(t, TrainConfig, skip=("features", "out"))
    t.set_defaults(func=cmd_train)

    try:
        from drafttree.train.length import add_length_parser
    except ModuleNotFoundError:
        return
    add_length_parser(sub)
