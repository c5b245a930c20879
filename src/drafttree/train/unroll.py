"""Head training pieces shared by the EAGLE trainer and the LDLP: samples, batches, the unrolled draft steps,
their losses and the held-out evaluation."""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from drafttree.errors import DraftTreeError
from drafttree.heads.model import EagleHead

# ------------------------------------------------------------------------------------------ data


def choose_draft_vocab(samples: list[dict], size: int, vocab_size: int, always: list[int]) -> torch.Tensor | None:
    """The ``size`` most frequent response tokens (+ ``always``, e.g. EOS), sorted by id."""
    if not size or size >= vocab_size:
        return None
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in samples:
        counts += torch.bincount(s["input_ids"][s["loss_mask"]], minlength=vocab_size)
    for t in always:
        counts[t] = counts.max() + 1
    ids = counts.topk(size).indices
    return ids.sort().values


def vocab_coverage(samples: list[dict], draft_vocab: torch.Tensor | None, vocab_size: int) -> float:
    if draft_vocab is None:
        return 1.0
    inside = torch.zeros(vocab_size, dtype=torch.bool)
    inside[draft_vocab] = True
    tot = hit = 0
    for s in samples:
        toks = s["input_ids"][s["loss_mask"]]
        tot += toks.numel()
        hit += int(inside[toks].sum())
    return hit / max(1, tot)


def split_samples(samples: list[dict], eval_samples: int, seed: int,
                  eval_after: int = 0) -> tuple[list[dict], list[dict]]:
    """(train, held-out): ``eval_samples`` conversations (at most a tenth) held out, drawn only from index
    ``eval_after`` on, so a head trained on the first ``eval_after`` samples is measured on unseen ones."""
    if eval_after and not 0 < eval_after < len(samples):
        raise DraftTreeError(f"eval-after {eval_after} leaves no sample to hold out (there are {len(samples)})")
    order = list(range(eval_after, len(samples)))
    random.Random(seed).shuffle(order)
    n_eval = min(eval_samples, max(1, len(order) // 10))
    held = set(order[:n_eval])
    return [s for i, s in enumerate(samples) if i not in held], [samples[i] for i in sorted(held)]


def group_by_length(samples: list[dict], order: list[int], batch_tokens: int, max_len: int) -> list[list[int]]:
    """``order`` sorted by length and cut into batches whose padded size stays within ``batch_tokens``."""
    batches: list[list[int]] = []
    cur: list[int] = []
    width = 0
    for i in sorted(order, key=lambda i: min(max_len, samples[i]["input_ids"].numel())):
        n = min(max_len, samples[i]["input_ids"].numel())
        if cur and max(width, n) * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, width = [], 0
        cur.append(i)
        width = max(width, n)
    if cur:
        batches.append(cur)
    return batches


def make_batches(samples: list[dict], batch_tokens: int, max_len: int, seed: int) -> list[list[int]]:
    """Shuffle, then group samples of similar length so that padded batches stay near ``batch_tokens``."""
    rng = random.Random(seed)
    order = list(range(len(samples)))
    rng.shuffle(order)
    batches = []
    chunk = 256  # sort by length within shuffled chunks
    for c in range(0, len(order), chunk):
        batches += group_by_length(samples, order[c:c + chunk], batch_tokens, max_len)
    rng.shuffle(batches)
    return batches


def collate(samples: list[dict], idx: list[int], max_len: int, key: str = "hidden"):
    """Padded (ids, loss mask, valid, last hidden states, head inputs): the inputs are ``samples[key]``."""
    n = max(min(max_len, samples[i]["input_ids"].numel()) for i in idx)
    B = len(idx)
    first = samples[idx[0]]
    ids = torch.zeros(B, n, dtype=torch.long)
    mask = torch.zeros(B, n, dtype=torch.bool)
    valid = torch.zeros(B, n, dtype=torch.bool)
    feats = torch.zeros(B, n, first["hidden"].shape[-1], dtype=first["hidden"].dtype)
    inputs = feats if key == "hidden" else torch.zeros(B, n, first[key].shape[-1], dtype=first[key].dtype)
    for r, i in enumerate(idx):
        s = samples[i]
        m = min(max_len, s["input_ids"].numel())
        ids[r, :m] = s["input_ids"][:m]
        mask[r, :m] = s["loss_mask"][:m]
        valid[r, :m] = True
        feats[r, :m] = s["hidden"][:m]
        if key != "hidden":
            inputs[r, :m] = s[key][:m]
    return ids, mask, valid, feats, inputs


# ------------------------------------------------------------------------------------ the unrolled loss


def unrolled_forward(head: EagleHead, feats, ids, mask, valid, steps: int, noise: float, train: bool,
                     inputs=None):
    """Run ``steps`` draft steps for every anchor position at once (``inputs``: what the head reads at step 1,
    the fused layers of an EAGLE-3 head; by default ``feats``, the last hidden states).

    Pair t = (feature t, token t+1). Step 1 is teacher-forced (true features); step s >= 2 feeds the
    head's step s-1 output for the same anchor, at position t+s-1, attending the true pairs <= t and its
    own steps 2..s (like a drafted chain). Returns a list over steps of (pred [B,T',H], target feature
    [B,T',H], loss mask [B,T']) where T' = T-1 and step s predicts the feature at t+s.
    """
    from transformers import DynamicCache

    B, T, H = feats.shape
    Tp = T - 1
    dev = feats.device
    dtype = head.fc.weight.dtype
    x = (feats if inputs is None else inputs)[:, :-1].float()
    if train and noise > 0:
        x = x + (torch.rand_like(x) - 0.5) * (2 * noise * 512 / max(T, 512))
    cache = DynamicCache()
    minval = torch.finfo(torch.float32).min
    base = mask[:, 1:] & valid[:, 1:]  # the pair's token t+1 is a response token
    outs = []
    inp = x
    causal = torch.tril(torch.ones(Tp, Tp, dtype=torch.bool, device=dev))
    diag = torch.eye(Tp, dtype=torch.bool, device=dev)
    for s in range(1, steps + 1):
        shift = s - 1
        next_ids = torch.zeros(B, Tp, dtype=torch.long, device=dev)
        next_ids[:, : Tp - shift] = ids[:, 1 + shift:]
        pos = (torch.arange(Tp, device=dev) + shift)[None].expand(B, Tp)
        allowed = torch.cat([causal] + [diag] * shift, dim=1)  # true pairs <= t, own steps 2..s
        amask = torch.zeros(Tp, Tp * s, device=dev).masked_fill_(~allowed, minval)[None, None]
        pred = head(inp, next_ids, pos, amask.to(dtype), cache)
        tgt = torch.zeros(B, Tp, H, device=dev)
        tgt[:, : Tp - shift] = feats[:, 1 + shift:].float()
        lm = torch.zeros(B, Tp, dtype=torch.bool, device=dev)
        if Tp - shift > 0:
            # every token of the drafted chain t+1 .. t+s is a real response token
            ok = base.clone()
            for j in range(1, s):
                ok[:, : Tp - j] &= base[:, j:]
                ok[:, Tp - j:] = False
            lm = ok
        outs.append((pred, tgt, lm))
        inp = pred
    return outs


def step_losses(head: EagleHead, outs, small_w: torch.Tensor, step_decay: float = 0.8, v_weight: float = 1.0,
                p_weight: float = 0.1):
    """``small_w``: the target's LM-head rows of the draft vocabulary (its distribution, renormalised over them)."""
    total = 0.0
    logs = {}
    eagle3 = getattr(head, "kind", "eagle") == "eagle3"
    for s, (pred, tgt, lm) in enumerate(outs, 1):
        w = step_decay ** (s - 1)
        denom = lm.sum().clamp(min=1)
        # losses only where they count (response positions): the LM-head products dominate the cost
        pred, tgt = pred[lm], tgt[lm]
        with torch.no_grad():
            tlogits = F.linear(tgt.to(small_w.dtype), small_w).float()
            tp = torch.softmax(tlogits, -1)
        if eagle3:  # its own LM head over the draft vocabulary; no feature regression
            vloss = torch.zeros((), device=pred.device)
            dlogits = head.draft_logits(pred).float()
        else:
            vloss = F.smooth_l1_loss(pred.float(), tgt, reduction="none").mean(-1).sum() / denom
            dlogits = F.linear(pred.to(small_w.dtype), small_w).float()
        plogp = torch.log_softmax(dlogits, -1)
        ploss = -(tp * plogp).sum(-1).sum() / denom
        total = total + w * (ploss if eagle3 else v_weight * vloss + p_weight * ploss)
        with torch.no_grad():
            acc = (dlogits.argmax(-1) == tlogits.argmax(-1)).sum().float() / denom
        logs[f"acc{s}"] = float(acc)
        logs[f"v{s}"] = float(vloss.detach())
        logs[f"p{s}"] = float(ploss.detach())
    return total, logs


def target_greedy(lm_w: torch.Tensor, feats: torch.Tensor, chunk: int = 512) -> torch.Tensor:
    """argmax of the target's LM head at every position (full vocabulary), in chunks."""
    out = [F.linear(feats[i:i + chunk].to(lm_w.dtype), lm_w).argmax(-1) for i in range(0, feats.shape[0], chunk)]
    return torch.cat(out)


def shifted(x: torch.Tensor, s: int) -> torch.Tensor:
    """x[..., t + s] at index t for the T-1 anchors (pair positions) along the last axis, -1 past the end."""
    tp = x.shape[-1] - 1
    out = torch.full((*x.shape[:-1], tp), -1, dtype=x.dtype, device=x.device)
    n = min(tp, x.shape[-1] - s)
    if n > 0:
        out[..., :n] = x[..., s:s + n]
    return out


@torch.no_grad()
def chain_checks(head: EagleHead, batch, depth: int, lm_w: torch.Tensor, chunk: int = 4096):
    """Draft a greedy chain of ``depth`` tokens from every anchor of a padded batch (``collate``'s tuple) and
    check each against the target's greedy token (full-vocabulary argmax of its LM head on the true feature).
    Returns (anchors [B, T-1]: the pair's next token is a response token, [correct at step k [B, T-1]])."""
    ids, mask, valid, feats, inputs = batch
    outs = unrolled_forward(head, feats, ids, mask, valid, depth, 0.0, train=False, inputs=inputs)
    B, T, H = feats.shape
    greedy = target_greedy(lm_w, feats.reshape(B * T, H), chunk).view(B, T)  # the target's token after each
    vocab_ids = head.draft_vocab.to(feats.device) if head.draft_vocab is not None else None
    # the draft LM head's dtype: an EAGLE-1 head's rows are the target's (bf16 when the target is), whatever
    # precision the head itself trains in
    draft_dtype = (head.draft_head_weight() if hasattr(head, "draft_head_weight") else head.lm_head.weight).dtype
    correct = []
    for k, (pred, _tgt, lm) in enumerate(outs):
        flat = pred.reshape(-1, pred.shape[-1]).to(draft_dtype)
        d = torch.cat([head.draft_logits(flat[i:i + chunk]).argmax(-1) for i in range(0, flat.shape[0], chunk)])
        d = d.view(B, T - 1)
        d = vocab_ids[d] if vocab_ids is not None else d
        # step k+1 from anchor t predicts the token after position t+k+1
        correct.append((d == shifted(greedy, k + 1)) & lm)
    return outs[0][2], correct


@torch.no_grad()
def evaluate(head: EagleHead, samples: list[dict], depth: int, max_len: int, device,
             target_lm_w: torch.Tensor | None = None, batch_tokens: int = 4096) -> dict:
    """Held-out top-1 accuracy of the head's draft at chain steps 1..depth against the target's greedy token,
    and the chain's expected accepted length. Conversations run ``batch_tokens`` padded tokens at a time
    (right padding: no real position attends a padded one, so batching changes no check)."""
    head.eval()
    lm_w = head.lm_head.weight if target_lm_w is None else target_lm_w
    key = "aux" if getattr(head, "kind", "eagle") == "eagle3" else "hidden"
    hit = torch.zeros(depth)
    chain_ok = torch.zeros(depth)
    n = 0
    for idx in group_by_length(samples, list(range(len(samples))), batch_tokens, max_len):
        batch = tuple(t.to(device) for t in collate(samples, idx, max_len, key))
        base, correct = chain_checks(head, batch, depth, lm_w)
        n += int(base.sum())
        all_ok = base.clone()
        for k, c in enumerate(correct):
            hit[k] += float((c & base).sum())
            all_ok &= c
            chain_ok[k] += float(all_ok.sum())
    head.train()
    n = max(1, n)
    acc = (hit / n).tolist()
    chain = (chain_ok / n).tolist()
    return {"top1": [round(a, 4) for a in acc], "chain_all_correct": [round(c, 4) for c in chain],
            "expected_chain_tau": round(1.0 + sum(chain), 4), "positions": n}
