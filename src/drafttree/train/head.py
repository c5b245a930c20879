"""Train an EAGLE head (EAGLE-1/2 layout, or EAGLE-3 with ``head_kind='eagle3'``) on extracted target features.

EAGLE-3: the head reads the fused ``aux`` features (inputs of three target layers) and is trained with
cross-entropy only, against the target's next-token distribution restricted to the draft vocabulary, over
``ttt_steps`` unrolled steps (no feature regression: its own output lives in its own space).

Loss (EAGLE-1): SmoothL1 between the predicted and the target's next feature, plus ``p_weight`` x the
cross-entropy against the target's own next-token distribution (its frozen LM head applied to the true
feature), on response positions only, with uniform noise on the input features. Optionally unrolled for
``ttt_steps`` draft steps (EAGLE-3's training-time test): step s feeds the head its own step s-1
prediction, attending to the true prefix and to its own earlier steps, exactly as drafting a chain does;
losses are weighted ``step_decay**(s-1)``.

Reduced draft vocabulary: the loss and the draft logits use the ``draft_vocab`` most frequent response
tokens (EAGLE-3's d2t idea); the target distribution is renormalised over them.

Built on ``accelerate`` (``accelerate launch -m drafttree.cli train ...`` spreads batches over
processes). Checkpoints (weights, optimizer state, progress) are safetensors + JSON written atomically;
``resume`` continues from the last one.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from drafttree.errors import DraftTreeError
from drafttree.heads.eagle3 import Eagle3Head
from drafttree.heads.model import EagleHead
from drafttree.models import resolve_dtype
from drafttree.train.data import load_feature_dir
from drafttree.train.unroll import (
    choose_draft_vocab,
    collate,
    evaluate,
    make_batches,
    split_samples,
    step_losses,
    unrolled_forward,
    vocab_coverage,
)


def _opt(default, help: str):
    """A training option with its ``--help`` text (read by ``drafttree train``'s argument parser)."""
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    features: str
    out: str
    num_layers: int = _opt(1, "decoder layers in an EAGLE-1 head")
    fc_bias: int = _opt(1, "1: the EAGLE-1 fc has a bias; 0 for heads meant for vLLM, whose EAGLE-1 fc has none")
    draft_vocab: int = _opt(8192, "draft vocabulary size: the most frequent response tokens (0 = the full "
                                  "vocabulary; an --init-head keeps its own)")
    epochs: int = _opt(10, "passes over the training conversations")
    lr: float = _opt(5e-4, "peak learning rate (AdamW; linear warm-up, then cosine decay to the last step)")
    min_lr_ratio: float = _opt(0.1, "the final learning rate as a fraction of --lr")
    warmup_steps: int = _opt(200, "optimizer steps of linear warm-up")
    batch_tokens: int = _opt(8192, "padded tokens per batch and process (conversations grouped by length up to this)")
    max_len: int = _opt(2048, "conversations are cut to this many tokens")
    v_weight: float = _opt(1.0, "EAGLE-1: weight of the feature-regression (smooth L1) loss")
    p_weight: float = _opt(0.1, "EAGLE-1: weight of the token cross-entropy loss")
    noise: float = _opt(0.1, "uniform noise half-width on the input features, scaled by 512/max(len, 512) as in EAGLE")
    ttt_steps: int = _opt(1, "unrolled draft steps per position (EAGLE-3's training-time test; it uses 7)")
    step_decay: float = _opt(0.8, "loss weight of unrolled step i (from 1) is step_decay**(i-1)")
    grad_clip: float = _opt(0.5, "gradient-norm clip")
    weight_decay: float = _opt(0.0, "AdamW weight decay")
    eval_samples: int = _opt(64, "held-out conversations (at most a tenth of them), never trained on, scored "
                                 "every --eval-every steps and at each epoch end")
    eval_every: int = _opt(500, "steps between held-out evaluations (0: at epoch ends only)")
    eval_depth: int = _opt(5, "draft steps scored by the held-out evaluation")
    save_every: int = _opt(200, "steps between checkpoints (--resume continues from the last)")
    seed: int = _opt(0, "seed of the held-out split, batch order and initialisation")
    mixed_precision: str = _opt("auto", "auto (bf16 on CUDA and on CPUs with AVX-512 bf16 or AMX, else float32: "
                                        "torch's bf16 products elsewhere run ~50-100x slower) | bf16 | no")
    head_kind: str = _opt("eagle1", "eagle1 (fc 2H->H, feature regression + CE) | eagle3 (the features' aux "
                                    "layers fused, CE against the target's distribution only)")
    max_steps: int = _opt(0, "stop after this many optimizer steps; the schedule ends there (0 = all epochs)")
    max_seconds: float = _opt(0.0, "stop after this many seconds of this invocation (a lent machine's budget); "
                                   "from the measured step rate the schedule is re-planned to end there (0 = no limit)")
    init_head: str = _opt("", "continue this head (weights, architecture and draft vocabulary) on the features")
    eval_after: int = _opt(0, "draw the held-out conversations only from this sample index on (e.g. those an "
                              "--init-head never trained on)")
    extra_features: str = _opt("", "another feature directory of the same target (e.g. sampled answers to the "
                                   "training prompts) added to the training set only, never held out; a new head's "
                                   "draft vocabulary counts their tokens too")


# ------------------------------------------------------------------------------------ checkpointing


def _save_checkpoint(ckpt_dir: Path, head: EagleHead, opt: torch.optim.Optimizer, progress: dict) -> None:
    tmp = ckpt_dir.with_name(ckpt_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.detach().float().contiguous().cpu() for k, v in head.trainable_state().items()},
              str(tmp / "head.safetensors"))
    opt_tensors, opt_meta = {}, {"param_groups": [], "steps": {}}
    names = {id(p): n for n, p in head.named_parameters()}
    for g in opt.param_groups:
        opt_meta["param_groups"].append({k: v for k, v in g.items() if k != "params"})
        for p in g["params"]:
            st = opt.state.get(p)
            if not st:
                continue
            name = names[id(p)]
            opt_tensors[f"{name}.exp_avg"] = st["exp_avg"].contiguous().cpu()
            opt_tensors[f"{name}.exp_avg_sq"] = st["exp_avg_sq"].contiguous().cpu()
            opt_meta["steps"][name] = float(st["step"])
    save_file(opt_tensors or {"empty": torch.zeros(1)}, str(tmp / "optimizer.safetensors"))
    (tmp / "optimizer.json").write_text(json.dumps(opt_meta))
    (tmp / "progress.json").write_text(json.dumps(progress, indent=1))
    if ckpt_dir.exists():
        old = ckpt_dir.with_name(ckpt_dir.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(ckpt_dir, old)
        os.replace(tmp, ckpt_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, ckpt_dir)


def _load_checkpoint(ckpt_dir: Path, head: EagleHead, opt: torch.optim.Optimizer) -> dict:
    state = load_file(str(ckpt_dir / "head.safetensors"))
    head.load_state_dict({k: v.to(head.fc.weight.dtype) for k, v in state.items()}, strict=True)
    tensors = load_file(str(ckpt_dir / "optimizer.safetensors"))
    meta = json.loads((ckpt_dir / "optimizer.json").read_text())
    for g, gm in zip(opt.param_groups, meta["param_groups"]):
        g.update(gm)
    for name, p in head.named_parameters():
        if name in meta["steps"]:
            opt.state[p] = {"step": torch.tensor(meta["steps"][name]),
                            "exp_avg": tensors[f"{name}.exp_avg"].to(p.device),
                            "exp_avg_sq": tensors[f"{name}.exp_avg_sq"].to(p.device)}
    return json.loads((ckpt_dir / "progress.json").read_text())


def _sync_gradients(head, n_proc: int) -> None:
    """Average gradients over the processes of a distributed run (gloo on CPU, NCCL on GPUs)."""
    if n_proc <= 1:
        return
    import torch.distributed as dist

    for p in head.parameters():
        if p.requires_grad:  # every process reduces every parameter, used or not, so the collectives pair up
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= n_proc


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


# ------------------------------------------------------------------------------------------- train


def _init_head(cfg: TrainConfig, target):
    """The head to continue from, trained as loaded (architecture, variants, weights); its draft vocabulary is
    kept (``--draft-vocab`` does not apply): its LM-head rows are the ones it learnt to rank."""
    from drafttree.heads import load_head
    from drafttree.heads.mtp import find_mtp

    if find_mtp(cfg.init_head) is not None:
        raise DraftTreeError(f"--init-head {cfg.init_head} is a model's own MTP layer: it drafts as published, "
                             "training continues drafttree's EAGLE heads")
    init = load_head(cfg.init_head, target, dtype=torch.float32)  # as stored, not rounded to the target's dtype
    want = "eagle3" if cfg.head_kind == "eagle3" else "eagle"
    if init.kind != want:
        raise DraftTreeError(f"--init-head {cfg.init_head} is an {init.kind} head, not {cfg.head_kind}")
    if init.draft_vocab is None and cfg.draft_vocab:
        raise DraftTreeError(f"--init-head {cfg.init_head} drafts over the full vocabulary: pass --draft-vocab 0")
    if init.draft_vocab is not None and cfg.draft_vocab and len(init.draft_vocab) != cfg.draft_vocab:
        print(f"[drafttree] --init-head keeps its draft vocabulary of {len(init.draft_vocab)} tokens "
              f"(--draft-vocab {cfg.draft_vocab} applies to new heads only)", flush=True)
    return init


class _TimeBudget:
    """``--max-seconds``: after a few steps, the last step is re-planned from the measured rate (evaluations
    included) so that the cosine schedule ends when the time does; every process plans the same step."""

    def __init__(self, seconds: float, step: int, n_proc: int, every: int = 10):
        if seconds < 0:
            raise DraftTreeError(f"--max-seconds must be >= 0, got {seconds}")
        self.active, self.seconds, self.n_proc, self.every = seconds > 0, seconds, n_proc, every
        self.t0, self.step0 = time.time(), step

    def plan(self, step: int, total: int, cap: int, device) -> int:
        """The last step: ``total`` between planning points, else what fits in the time left, at most ``cap``."""
        done = step - self.step0
        if done % self.every:
            return total
        elapsed = time.time() - self.t0
        fits = step if elapsed >= self.seconds else step + int((self.seconds - elapsed) * done / elapsed)
        if self.n_proc > 1:  # the slowest process decides, so that collectives keep pairing up
            import torch.distributed as dist

            t = torch.tensor([fits], device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            fits = int(t)
        return max(step, min(cap, fits))


def _clock(progress: dict) -> dict:
    """What a held-out score cost so far: wall seconds (evaluations included), tokens trained on, and the CPU
    threads per process (accuracy against CPU-hours: ``drafttree train-curves``)."""
    return {"seconds": round(progress["seconds"], 1), "tokens": progress["tokens"], "threads": torch.get_num_threads(),
            "processes": progress.get("processes", 1)}


def _extra_samples(path: str, manifest: dict, with_aux: bool) -> list[dict]:
    """Training-only samples from a second feature directory, which must match the first one's target and layers."""
    man_path = Path(path) / "manifest.json"
    if not man_path.exists():
        raise DraftTreeError(f"--extra-features {path}: no manifest.json (run `drafttree data features`)")
    extra_manifest = json.loads(man_path.read_text())  # checked before any shard is read
    for key in ("name", "hidden_size", "vocab_size"):
        theirs, ours = extra_manifest.get("target", {}).get(key), manifest["target"].get(key)
        if theirs != ours:
            raise DraftTreeError(f"--extra-features {path} belongs to another target ({key} {theirs}; "
                                 f"--features has {ours})")
    if with_aux and extra_manifest.get("aux_layers") != manifest.get("aux_layers"):
        layers = ",".join(map(str, manifest["aux_layers"]))
        held = extra_manifest.get("aux_layers") or "no aux-layer features"
        raise DraftTreeError(f"--extra-features {path} holds {held}, --features holds layers {layers}: re-extract "
                             f"it with `drafttree data features --aux-layers {layers}`")
    return load_feature_dir(path, with_aux=with_aux)[1]


# options that decide the samples, batches and head: a resumed run must keep them (--epochs/--max-steps may grow)
_RESUME_FIXED = ("features", "extra_features", "eval_samples", "eval_after", "seed", "head_kind", "draft_vocab",
                 "batch_tokens", "max_len", "init_head", "num_layers")


def training_precision(choice: str, device: torch.device) -> str:
    """``auto`` -> ``bf16`` where bf16 matrix products are fast, else ``no`` (float32). On a CPU without AVX-512
    bf16 or AMX (e.g. AVX2 only), torch's bf16 ``mm`` measured 0.3-1 GFLOP/s against float32's 30-56: a head
    step took ~50 s instead of ~1 s."""
    if choice not in ("auto", "bf16", "no"):
        raise DraftTreeError(f"mixed precision must be auto, bf16 or no, got {choice!r}")
    if choice != "auto":
        return choice
    # the inference dtype's own policy (models.resolve_dtype): bf16 where the device runs it fast, float32 elsewhere
    return "bf16" if resolve_dtype("auto", device) is torch.bfloat16 else "no"


def train_head(target, cfg: TrainConfig, resume: bool = False, show_progress: bool = True) -> dict:
    """Train a head for ``target`` (a LoadedModel) from ``cfg.features``; writes ``cfg.out``."""
    from accelerate import Accelerator

    out = Path(cfg.out)
    ckpt = out / "checkpoint"
    if out.exists() and (ckpt / "progress.json").exists() and not resume:
        raise DraftTreeError(f"{out} already holds a training run; pass --resume to continue it or pick another --out")
    manifest, samples = load_feature_dir(cfg.features, with_aux=cfg.head_kind == "eagle3")
    sig = manifest["target"]
    if sig["hidden_size"] != target.config.hidden_size or sig["vocab_size"] != target.vocab_size:
        raise DraftTreeError(f"features in {cfg.features} were extracted from {sig['name']} "
                             f"(hidden {sig['hidden_size']}, vocab {sig['vocab_size']}), not {target.name}")
    precision = training_precision(cfg.mixed_precision, target.device)
    if cfg.head_kind not in ("eagle1", "eagle3"):
        raise DraftTreeError(f"head kind must be eagle1 or eagle3, got {cfg.head_kind!r}")
    key = "aux" if cfg.head_kind == "eagle3" else "hidden"
    if key == "aux" and not manifest.get("aux_layers"):
        raise DraftTreeError(f"{cfg.features} holds no aux-layer features: re-extract them with "
                             "`drafttree data features --aux-layers auto` to train an EAGLE-3 head")
    train_set, eval_set = split_samples(samples, cfg.eval_samples, cfg.seed, cfg.eval_after)
    if not train_set:
        raise DraftTreeError("no training samples left after the held-out split")
    n_extra = 0
    if cfg.extra_features:
        extra = _extra_samples(cfg.extra_features, manifest, key == "aux")
        train_set, n_extra = train_set + extra, len(extra)
    # a target on the CPU trains on the CPU (several processes: gloo); on GPUs each process takes its own
    acc = Accelerator(mixed_precision=precision, cpu=target.device.type == "cpu")
    dev = acc.device
    target.model.to(dev)
    eos = sorted(target.eos_token_ids())
    init = _init_head(cfg, target) if cfg.init_head else None
    if init is not None and cfg.head_kind == "eagle3" and list(init.aux_layers) != list(manifest["aux_layers"]):
        raise DraftTreeError(f"--init-head {cfg.init_head} fuses layers {init.aux_layers}, the features hold "
                             f"{manifest['aux_layers']}")
    draft_vocab = init.draft_vocab.cpu() if init is not None else choose_draft_vocab(
        train_set, cfg.draft_vocab, target.vocab_size, eos)
    coverage = vocab_coverage(eval_set, draft_vocab, target.vocab_size)
    torch.manual_seed(cfg.seed)
    if init is not None:  # the loaded head itself: its architecture, variants and weights as published
        head = init.to(dev).float().requires_grad_(True)
    elif cfg.head_kind == "eagle3":
        head = Eagle3Head(target.model, draft_vocab=draft_vocab, aux_layers=manifest["aux_layers"],
                          target_name=target.name).to(dev).float()
    else:
        head = EagleHead(target.model, cfg.num_layers, draft_vocab, target_name=target.name,
                         fc_bias=bool(cfg.fc_bias)).to(dev).float()
    head.train()
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=cfg.lr, betas=(0.9, 0.95),
                            weight_decay=cfg.weight_decay)
    raw = head  # not wrapped in DDP: the unrolled loss calls the head several times per step, so gradients
    # are averaged across processes by hand (``_sync_gradients``) before each optimizer step
    progress = {"epoch": 0, "batch": 0, "step": 0, "history": [], "config": asdict(cfg), "seconds": 0.0,
                "tokens": 0}
    if resume and (ckpt / "progress.json").exists():
        progress = _load_checkpoint(ckpt, raw, opt)
        was = progress.get("config", {})
        changed = [k for k in _RESUME_FIXED if k in was and was[k] != getattr(cfg, k)]
        if changed:
            flags = ", ".join("--" + k.replace("_", "-") for k in changed)
            raise DraftTreeError(f"{out} was started with other {flags} ({', '.join(repr(was[k]) for k in changed)}):"
                                 " resume with the same options, or pick another --out")
        if acc.is_main_process:
            print(f"[drafttree] resuming at epoch {progress['epoch']} batch {progress['batch']} "
                  f"(step {progress['step']})", flush=True)
    per_epoch = [make_batches(train_set, cfg.batch_tokens, cfg.max_len, cfg.seed + e) for e in range(cfg.epochs)]
    n_proc = acc.num_processes
    progress["processes"] = n_proc  # recorded with each held-out score (CPU-hours)
    # the same number of steps on every process (collectives must pair up): trim, or repeat batches when an
    # epoch has fewer batches than processes
    per_epoch = [b[: len(b) // n_proc * n_proc] if len(b) >= n_proc else [b[i % len(b)] for i in range(n_proc)]
                 for b in per_epoch]
    total_steps = sum(len(b) for b in per_epoch) // acc.num_processes
    if cfg.max_steps:
        total_steps = min(total_steps, cfg.max_steps)
    lm_w = target.model.get_output_embeddings().weight.detach()
    if precision == "no":  # the frozen rows too: a bf16 target's would take the slow bf16 products
        lm_w = lm_w.float()
    small_w = lm_w if raw.draft_vocab is None else lm_w[raw.draft_vocab.to(lm_w.device)].contiguous()
    t_start = time.time() - progress["seconds"]
    budget = _TimeBudget(cfg.max_seconds, progress["step"], n_proc)
    step_cap = total_steps  # what the data and --max-steps allow; a time plan may shrink or regrow within it
    bar = tqdm(total=total_steps, initial=progress["step"], desc="train head", unit="step",
               disable=not (show_progress and acc.is_main_process))
    info = {"train_samples": len(train_set), "eval_samples": len(eval_set), "extra_samples": n_extra,
            "train_loss_tokens": int(sum(int(s["loss_mask"].sum()) for s in train_set)),
            "draft_vocab": 0 if draft_vocab is None else int(draft_vocab.numel()),
            "draft_vocab_coverage": round(coverage, 4)}
    last_eval = None
    done = False
    for epoch in range(progress["epoch"], cfg.epochs):
        batches = per_epoch[epoch][acc.process_index::acc.num_processes]
        for b in range(progress["batch"] if epoch == progress["epoch"] else 0, len(batches)):
            if (cfg.max_steps and progress["step"] >= cfg.max_steps) or progress["step"] >= total_steps:
                done = True
                break
            ids, mask, valid, feats, inputs = (t.to(dev) for t in collate(train_set, batches[b], cfg.max_len, key))
            for g in opt.param_groups:
                g["lr"] = lr_at(progress["step"], total_steps, cfg)
            with acc.autocast():
                outs = unrolled_forward(raw, feats, ids, mask, valid, cfg.ttt_steps, cfg.noise, train=True,
                                        inputs=inputs)
                loss, logs = step_losses(raw, outs, small_w, cfg.step_decay, cfg.v_weight, cfg.p_weight)
            opt.zero_grad(set_to_none=True)
            acc.backward(loss)
            _sync_gradients(raw, n_proc)
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(raw.parameters(), cfg.grad_clip)
            opt.step()
            progress["step"] += 1
            progress["batch"] = b + 1
            progress["epoch"] = epoch
            progress["tokens"] += int(valid.sum())
            progress["seconds"] = time.time() - t_start
            bar.update(1)
            if budget.active:
                total_steps = budget.plan(progress["step"], total_steps, step_cap, dev)
                bar.total = total_steps
            bar.set_postfix(ep=epoch, loss=f"{float(loss.detach()):.3f}", acc1=f"{logs['acc1']:.3f}",
                            tok_s=f"{progress['tokens'] / max(1e-9, progress['seconds']):.0f}")
            if cfg.eval_every and progress["step"] % cfg.eval_every == 0 and acc.is_main_process:
                last_eval = evaluate(raw, eval_set, cfg.eval_depth, cfg.max_len, dev, lm_w, cfg.batch_tokens)
                progress["history"].append({"step": progress["step"], "epoch": epoch, "eval": last_eval,
                                            "loss": float(loss.detach()), **logs, **_clock(progress)})
                bar.write(f"[eval step {progress['step']}] top1 {last_eval['top1']} "
                          f"chain tau {last_eval['expected_chain_tau']}")
            if cfg.save_every and progress["step"] % cfg.save_every == 0 and acc.is_main_process:
                _save_checkpoint(ckpt, raw, opt, progress)
        if done:
            break
        progress["epoch"], progress["batch"] = epoch + 1, 0
        if acc.is_main_process:
            last_eval = evaluate(raw, eval_set, cfg.eval_depth, cfg.max_len, dev, lm_w, cfg.batch_tokens)
            progress["history"].append({"step": progress["step"], "epoch": epoch + 1, "eval": last_eval,
                                        **_clock(progress)})
            bar.write(f"[epoch {epoch + 1}] held-out top1 by step {last_eval['top1']}, "
                      f"chain tau {last_eval['expected_chain_tau']}")
            _save_checkpoint(ckpt, raw, opt, progress)
    bar.close()
    history = progress["history"]
    if history and history[-1]["step"] == progress["step"]:  # scored at this step (or a finished run resumed)
        last_eval = history[-1]["eval"]
    else:  # the summary scores the head as saved (--max-steps stops between evaluations)
        last_eval = evaluate(raw, eval_set, cfg.eval_depth, cfg.max_len, dev, lm_w, cfg.batch_tokens)
        history.append({"step": progress["step"], "epoch": progress["epoch"], "eval": last_eval, **_clock(progress)})
    summary = {**info, "steps": progress["step"], "train_seconds": round(progress["seconds"], 1),
               "threads": torch.get_num_threads(),
               "tokens_seen": progress["tokens"], "eval": last_eval, "processes": n_proc}
    if n_proc > 1:  # every process must hold the same weights after synchronised steps
        flat = torch.cat([p.detach().double().reshape(-1) for p in raw.parameters()])
        weights = torch.linspace(1.0, 2.0, flat.numel(), dtype=torch.float64, device=flat.device)
        sums = acc.gather(torch.stack([flat.sum(), (flat * weights).sum()])[None].to(dev))
        summary["replicas_in_sync"] = bool((sums == sums[:1]).all())  # identical steps: bitwise equal weights
    if acc.is_main_process:
        _save_checkpoint(ckpt, raw, opt, progress)
        raw.save(out / "head", dtype=torch.bfloat16, extra={"training": summary})
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    if n_proc > 1:  # every rank waits for the writes, then the process group ends before interpreter exit:
        # a rank leaving with gloo's threads alive aborted at exit ("terminate called without an active exception")
        acc.wait_for_everyone()
        _end_process_group()
    return summary


def _end_process_group() -> None:
    """Destroy the default process group (accelerate leaves it to interpreter exit, which races gloo's threads)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
