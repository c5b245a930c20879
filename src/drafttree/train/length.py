"""``drafttree train-length``: labels and training for AdaEAGLE's draft length predictor (LDLP).

Labels: at every response position of the self-distilled data, the head drafts a greedy chain of
``k_max`` tokens (its own predicted features fed back, exactly as at inference) and the label is the
number of leading draft tokens the target accepts (its greedy token from the true features): the
oracle-optimal chain length. Computed for all positions of a sample at once with the unrolled forward.

Loss: asymmetric L1, lam * |k - k*| when under-predicting, |k - k*| when over-predicting. lam > 1 because
under-predicting throws away tokens the target would have accepted (each costs a share of a full target
forward), while over-predicting only wastes draft steps, ~15-20x cheaper than a target step here.
The minimiser of this loss is the lam/(1+lam) quantile of the label given the input (lam=3: the 75th).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from drafttree.errors import DraftTreeError, positive_int
from drafttree.heads.length import LengthPredictor
from drafttree.train.data import load_feature_dir
from drafttree.train.unroll import chain_checks, collate, group_by_length, split_samples


@torch.no_grad()
def make_labels(head, samples: list[dict], k_max: int, max_len: int, device, show_progress: bool = True,
                batch_tokens: int = 4096):
    """(emb [N, H], feat [N, H], label [N]) for every response anchor of ``samples``, ``batch_tokens`` padded
    tokens of conversations per unrolled forward."""
    head.eval()
    embs, feats, labels = [], [], []
    batches = group_by_length(samples, list(range(len(samples))), batch_tokens, max_len)
    bar = tqdm(total=len(samples), desc="LDLP labels", unit="sample", disable=not show_progress)
    for idx in batches:
        batch = tuple(t.to(device) for t in collate(samples, idx, max_len))
        base, correct = chain_checks(head, batch, k_max, head.lm_head.weight)
        ok = base.clone()
        count = torch.zeros_like(base, dtype=torch.long)
        for c in correct:
            ok &= c
            count += ok.long()
        rows, cols = base.nonzero(as_tuple=True)  # pair t: (feature t, token t+1); the LDLP sees token t and f_t
        ids, f = batch[0], batch[3]
        embs.append(head.embed_tokens(ids[rows, cols]).float().cpu())
        feats.append(f[rows, cols].float().cpu())
        labels.append(count[rows, cols].cpu())
        bar.update(len(idx))
    bar.close()
    head.train()
    return torch.cat(embs), torch.cat(feats), torch.cat(labels)


def asymmetric_l1(pred: torch.Tensor, label: torch.Tensor, lam: float) -> torch.Tensor:
    diff = label.float() - pred
    return torch.where(diff > 0, lam * diff, -diff).mean()


def train_length_predictor(target, head, features: str, out: str, k_max: int = 8, lam: float = 3.0,
                           epochs: int = 8, lr: float = 1e-3, batch: int = 512, width: int = 256,
                           max_samples: int = 0, eval_samples: int = 64, seed: int = 0, max_len: int = 2048,
                           eval_after: int = 0, show_progress: bool = True, batch_tokens: int = 4096) -> dict:
    if getattr(head, "kind", "eagle") != "eagle":
        raise DraftTreeError("the AdaEAGLE length predictor reads the target's last hidden state: train it for "
                             "EAGLE-1/2 heads, not for this EAGLE-3 head")
    out_p = Path(out)
    out_p.mkdir(parents=True, exist_ok=True)
    label_file = out_p / f"ldlp-labels-k{k_max}.safetensors"
    manifest, samples = load_feature_dir(features, with_aux=False)
    if manifest["target"]["hidden_size"] != target.config.hidden_size:
        raise DraftTreeError(f"features in {features} do not belong to {target.name}")
    train_s, eval_s = split_samples(samples, eval_samples, seed, eval_after)  # the head's held-out split
    if max_samples:
        train_s = train_s[:max_samples]
    dev = target.device
    t0 = time.time()
    if label_file.exists():
        d = load_file(str(label_file))
    else:
        tr = make_labels(head, train_s, k_max, max_len, dev, show_progress, batch_tokens)
        ev = make_labels(head, eval_s, k_max, max_len, dev, show_progress, batch_tokens)
        d = {"train_emb": tr[0], "train_feat": tr[1], "train_label": tr[2],
             "eval_emb": ev[0], "eval_feat": ev[1], "eval_label": ev[2]}
        save_file({k: v.contiguous() for k, v in d.items()}, str(label_file))
    label_seconds = time.time() - t0
    torch.manual_seed(seed)
    model = LengthPredictor(target.config.hidden_size, width=width, k_max=k_max)
    x_tr = torch.cat([d["train_emb"], d["train_feat"]], -1)
    model.mean.copy_(x_tr.mean(0))
    model.std.copy_(x_tr.std(0).clamp(min=1e-4))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    n = d["train_label"].numel()
    steps = epochs * math.ceil(n / batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    rng = random.Random(seed)
    bar = tqdm(total=steps, desc="train LDLP", unit="step", disable=not show_progress)
    for _ in range(epochs):
        order = list(range(n))
        rng.shuffle(order)
        for b in range(0, n, batch):
            idx = torch.tensor(order[b:b + batch])
            pred = model(d["train_emb"][idx], d["train_feat"][idx])
            loss = asymmetric_l1(pred, d["train_label"][idx], lam)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
    bar.close()
    model.eval()
    with torch.no_grad():
        raw = model(d["eval_emb"], d["eval_feat"])
    pred = raw.round().clamp(0, k_max).long()
    lab = d["eval_label"].long()
    hist = lambda t: torch.bincount(t, minlength=k_max + 1).tolist()  # noqa: E731
    report = {
        "k_max": k_max, "lambda": lam, "epochs": epochs, "train_positions": n, "eval_positions": int(lab.numel()),
        "eval_mae": round(float((pred - lab).abs().float().mean()), 4),
        "eval_mae_raw": round(float((raw - lab).abs().mean()), 4),
        "eval_under_rate": round(float((pred < lab).float().mean()), 4),
        "eval_label_mean": round(float(lab.float().mean()), 4), "eval_pred_mean": round(float(pred.float().mean()), 4),
        "label_hist": hist(lab), "pred_hist": hist(pred),
        "train_label_hist": hist(d["train_label"].long()),
        "label_seconds": round(label_seconds, 1), "train_seconds": round(time.time() - t0 - label_seconds, 1),
    }
    model.save(out_p, {"trained": report, "head": str(getattr(head, "path", ""))})
    (out_p / "ldlp-report.json").write_text(json.dumps(report, indent=1))
    return report


def cmd_train_length(args) -> int:
    from drafttree.heads import load_head_for
    from drafttree.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.k_max <= 0 or args.lam <= 0 or args.epochs <= 0 or args.batch_tokens <= 0:
        raise DraftTreeError("--k-max, --lam, --epochs and --batch-tokens must be > 0")
    target = load_model(args.model, dtype=args.dtype, device=args.device)
    head = load_head_for(target, args.head, required=True)
    if head.kind in ("assistant", "dflash"):
        what = "a Gemma 4 assistant" if head.kind == "assistant" else "a DFlash drafter"
        raise DraftTreeError(f"{head.path} is {what}: the AdaEAGLE length predictor reads an EAGLE-1/2 head's states")
    if str(getattr(head, "layout", "")).startswith("mtp-"):
        raise DraftTreeError(f"{head.path} is a model's own MTP layer: the AdaEAGLE length predictor is trained for "
                             "drafttree's EAGLE-1/2 heads")
    out = args.out or str(head.path)
    report = train_length_predictor(target, head, args.features, out, k_max=args.k_max, lam=args.lam,
                                    epochs=args.epochs, lr=args.lr, max_samples=args.max_samples,
                                    eval_samples=args.eval_samples, seed=args.seed, eval_after=args.eval_after,
                                    batch_tokens=args.batch_tokens)
    print(json.dumps(report, indent=1))
    return 0


def add_length_parser(sub) -> None:
    p: argparse.ArgumentParser = sub.add_parser("train-length", help="train AdaEAGLE's draft length predictor")
    p.add_argument("--features", required=True, help="feature directory (the head's training data)")
    p.add_argument("--head", default=None, help="head directory (default: the head shipped for --model)")
    p.add_argument("--out", default=None, help="where ldlp.json/ldlp.safetensors go (default: the head's dir)")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--dtype", default="auto", help="the target's dtype (auto: bfloat16 where its products are "
                   "fast, else float32: torch's bf16 products on other CPUs run ~50-100x slower)")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--k-max", type=int, default=8)
    p.add_argument("--lam", type=float, default=3.0, help="under-prediction penalty (asymmetric L1)")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--max-samples", type=int, default=0, help="label at most this many training samples")
    p.add_argument("--eval-samples", type=int, default=64)
    p.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens of conversations labelled per "
                   "forward (raise it on a GPU)")
    p.add_argument("--eval-after", type=int, default=0, help="hold out only samples from this index on (as the "
                   "head's training did)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_train_length)
