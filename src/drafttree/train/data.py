"""Training data for draft heads: read prompts, self-distil answers, extract target features.

Three resumable stages, each an append-only file or a directory of finished shards:
  1. ``read_prompts``: JSON/JSONL in ShareGPT (``conversations``), OpenAI (``messages``) or Alpaca
     (``instruction``/``input``) format, or a plain text file (prompts separated by blank lines);
  2. ``self_distill``: the target answers every user turn (batched greedy generation, chat template);
     one JSONL line per (conversation, turn) with the exact prompt and response token ids;
  3. ``extract_features``: one forward per sample; the LM head's input feature at every position, the
     token ids and the loss mask (response tokens only) go into sharded safetensors + ``manifest.json``.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm
from transformers import DynamicCache

from drafttree.cache import GrowingCache, cache_arg
from drafttree.errors import DraftTreeError
from drafttree.models import LoadedModel
from drafttree.target import forward_catching, layer_count, recurrent_layers

# ---------------------------------------------------------------------------------------------- prompts


def _turns_from_record(rec: dict) -> list[dict]:
    """Normalise one record to a list of {'role', 'content'} messages (assistant turns kept as context)."""
    if "messages" in rec:
        msgs = rec["messages"]
        return [{"role": m["role"], "content": m["content"]} for m in msgs if m.get("content") is not None]
    if "conversations" in rec:
        role = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "system": "system"}
        out = []
        for m in rec["conversations"]:
            r = role.get(str(m.get("from", m.get("role", ""))).lower())
            text = m.get("value", m.get("content"))
            if r and isinstance(text, str):
                out.append({"role": r, "content": text})
        return out
    if "instruction" in rec:
        text = rec["instruction"] if not rec.get("input") else f"{rec['instruction']}\n\n{rec['input']}"
        return [{"role": "user", "content": text}]
    if "turns" in rec:
        return [{"role": "user", "content": t} for t in rec["turns"]]
    if "prompt" in rec and isinstance(rec["prompt"], str):
        return [{"role": "user", "content": rec["prompt"]}]
    raise DraftTreeError(
        "unknown prompt format: expected 'messages', 'conversations', 'instruction', 'turns' or 'prompt' keys, "
        f"got {sorted(rec)[:6]}"
    )


def read_prompts(path: str | Path) -> list[dict]:
    """Return ``[{'id': str, 'messages': [...]}]``; user turns are what the target will answer."""
    path = Path(path)
    if not path.is_file():
        raise DraftTreeError(f"prompt file not found: {path}")
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise DraftTreeError(f"prompt file is empty: {path}")
    records: list[dict]
    if path.suffix in (".txt", ".md"):
        paras = [p.strip() for p in text.split("\n\n") if p.strip()]
        records = [{"id": f"{path.stem}-{i}", "messages": [{"role": "user", "content": p}]}
                   for i, p in enumerate(paras)]
        return records
    try:
        if path.suffix == ".json":
            raw = json.loads(text)
            if isinstance(raw, dict):
                raw = raw.get("data") or raw.get("examples") or [raw]
        else:
            raw = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise DraftTreeError(f"{path}: not valid JSON/JSONL ({e})") from None
    records = []
    for i, rec in enumerate(raw):
        if not isinstance(rec, dict):
            raise DraftTreeError(f"{path}: record {i} is not a JSON object")
        msgs = _turns_from_record(rec)
        if not any(m["role"] == "user" and m["content"].strip() for m in msgs):
            continue
        records.append({"id": str(rec.get("id", rec.get("question_id", f"{path.stem}-{i}"))), "messages": msgs})
    if not records:
        raise DraftTreeError(f"{path}: no usable prompts (no non-empty user turn)")
    return records


# --------------------------------------------------------------------------------------- self-distil


def _chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


@torch.inference_mode()
def batched_greedy(model, prompts: list[list[int]], max_new_tokens: int, eos: set[int], pad: int,
                   device) -> list[list[int]]:
    """Greedy answers for a batch of prompts (left padding, in-place cache; finished rows are dropped).

    Faster than ``generate`` here: no per-step mask rebuilding beyond the 2-D mask, logits only for the
    last position, and the batch shrinks as answers end. Each answer ends with its EOS when it has one. A model
    with recurrent layers (chain_target.py) answers one prompt at a time on transformers' own cache: its state
    would take the left padding in.
    """
    if recurrent_layers(model) is not None:
        return [_greedy_alone(model, p, max_new_tokens, eos, device) for p in prompts]
    B = len(prompts)
    width = max(len(p) for p in prompts)
    ids = torch.full((B, width), pad, dtype=torch.long)
    mask = torch.zeros((B, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    cache = GrowingCache()
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                **{cache_arg(model): cache})
    nxt = out.logits[:, -1].argmax(-1)
    nextpos = pos[:, -1] + 1
    rows = list(range(B))  # original index of each live row
    answers: list[list[int]] = [[] for _ in range(B)]
    finished = [False] * B
    dead = 0
    for step in range(max_new_tokens):
        toks = nxt.tolist()
        for r, orig in enumerate(rows):
            if not finished[orig]:
                answers[orig].append(toks[r])
                if toks[r] in eos:
                    finished[orig] = True
                    dead += 1
        if step + 1 == max_new_tokens or all(finished[o] for o in rows):
            break
        if dead * 4 >= len(rows):  # drop finished rows once they are a quarter of the batch
            keep = [r for r, o in enumerate(rows) if not finished[o]]
            sel = torch.tensor(keep, device=device)
            cache.select_rows(sel)
            mask, nxt, nextpos = mask[sel], nxt[sel], nextpos[sel]
            rows = [rows[r] for r in keep]
            dead = 0
        mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=mask.dtype, device=device)], 1)
        out = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=nextpos[:, None], use_cache=True,
                    **{cache_arg(model): cache})
        nxt = out.logits[:, -1].argmax(-1)
        nextpos = nextpos + 1
    return answers


@torch.inference_mode()
def _greedy_alone(model, prompt: list[int], max_new_tokens: int, eos: set[int], device) -> list[int]:
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([prompt], device=device)
    answer: list[int] = []
    for _ in range(max_new_tokens):
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{cache_arg(model): cache})
        answer.append(int(out.logits[0, -1].argmax()))
        if answer[-1] in eos:
            break
        ids = torch.tensor([[answer[-1]]], device=device)
    return answer


def _sampled_answers(model, prompts, max_new_tokens, pad, temperature, seed, device) -> list[list[int]]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attn = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        attn[i, width - len(p):] = 1
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(input_ids=ids.to(device), attention_mask=attn.to(device), max_new_tokens=max_new_tokens,
                             pad_token_id=pad, do_sample=True, temperature=temperature, top_p=1.0, top_k=0,
                             **{cache_arg(model): GrowingCache()})
    return out[:, width:].tolist()


def _done_keys(path: Path) -> set[tuple[str, int]]:
    done = set()
    if path.exists():
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a crash: it will be regenerated
                done.add((rec["id"], rec["turn"]))
    return done


def self_distill(
    target: LoadedModel, prompts: list[dict], out_path: str | Path, batch_size: int = 16,
    max_new_tokens: int = 256, max_prompt_tokens: int = 1024, temperature: float = 0.0,
    seed: int = 0, show_progress: bool = True,
) -> dict:
    """The target answers each user turn; earlier turns are answered first and put back in the history.

    Appends to ``out_path`` (JSONL) and skips (id, turn) pairs already there, so a killed run resumes.
    """
    tok, model = target.tokenizer, target.model
    if not getattr(tok, "chat_template", None):
        raise DraftTreeError(f"{target.name} has no chat template; self-distillation needs one")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done = _done_keys(out_path)
    history: dict[str, list[dict]] = {}
    if done and out_path.exists():
        with open(out_path, encoding="utf-8") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                history[(rec["id"], rec["turn"])] = rec["messages"]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    eos = target.eos_token_ids()
    gen = torch.Generator().manual_seed(seed)
    stats = {"samples": 0, "response_tokens": 0, "skipped_long": 0}
    max_turns = max(sum(m["role"] == "user" for m in p["messages"]) for p in prompts)
    total = sum(sum(m["role"] == "user" for m in p["messages"]) for p in prompts)
    bar = tqdm(total=total, initial=len(done), desc="self-distil", unit="turn", disable=not show_progress)
    with open(out_path, "a", encoding="utf-8") as out:
        for turn in range(max_turns):
            todo = []
            for p in prompts:
                users = [i for i, m in enumerate(p["messages"]) if m["role"] == "user"]
                if turn >= len(users) or (p["id"], turn) in done:
                    continue
                if turn == 0:
                    hist = p["messages"][: users[0] + 1]
                else:
                    prev = history.get((p["id"], turn - 1))
                    if prev is None:
                        continue  # previous turn skipped (too long)
                    hist = prev + [p["messages"][users[turn]]]
                ids = _chat_ids(tok, hist)
                if len(ids) > max_prompt_tokens:
                    stats["skipped_long"] += 1
                    bar.update(1)
                    continue
                todo.append((p["id"], hist, ids))
            # shuffled chunks, each sorted by length: little padding, and every category progresses
            # evenly, so stopping early still leaves a representative sample
            random.Random(seed + turn).shuffle(todo)
            chunk = batch_size * 8
            todo = [t for c in range(0, len(todo), chunk) for t in sorted(todo[c:c + chunk], key=lambda t: len(t[2]))]
            for b in range(0, len(todo), batch_size):
                batch = todo[b:b + batch_size]
                if temperature > 0:
                    rows = _sampled_answers(model, [t[2] for t in batch], max_new_tokens, pad, temperature,
                                            int(torch.randint(0, 2**31, (1,), generator=gen)), target.device)
                else:
                    rows = batched_greedy(model, [t[2] for t in batch], max_new_tokens, eos, pad, target.device)
                for (pid, hist, ids), row in zip(batch, rows):
                    resp = []
                    finish = "length"
                    for t in row:
                        resp.append(t)
                        if t in eos:
                            finish = "stop"
                            break
                    text = tok.decode(resp, skip_special_tokens=True)
                    msgs = hist + [{"role": "assistant", "content": text}]
                    rec = {"id": pid, "turn": turn, "prompt_ids": ids, "response_ids": resp,
                           "finish": finish, "messages": msgs}
                    out.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    history[(pid, turn)] = msgs
                    stats["samples"] += 1
                    stats["response_tokens"] += len(resp)
                out.flush()
                bar.update(len(batch))
                bar.set_postfix(resp_tokens=stats["response_tokens"])
    bar.close()
    return stats


# ------------------------------------------------------------------------------------------ features


def iter_distilled(path: str | Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise DraftTreeError(f"{path}: line {n + 1} is not valid JSON (a cut write? re-run distill)") from None
            if "prompt_ids" not in rec or "response_ids" not in rec:
                raise DraftTreeError(f"{path}: line {n + 1} lacks prompt_ids/response_ids (not a distill file)")
            yield rec


def _write_atomic_json(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def target_signature(target: LoadedModel) -> dict:
    cfg = target.config
    arch = (getattr(cfg, "architectures", None) or [type(target.model).__name__])[0]
    return {"name": target.name, "architecture": arch,
            "model_type": cfg.model_type, "hidden_size": cfg.hidden_size, "vocab_size": target.vocab_size}


def extract_features(
    target: LoadedModel, distilled: str | Path, out_dir: str | Path, shard_size: int = 256,
    max_tokens: int = 2048, batch_tokens: int = 4096, show_progress: bool = True,
    aux_layers: list[int] | None = None,
) -> dict:
    """Write ``shard-XXXXX.safetensors`` files of {input_ids, loss_mask, hidden, offsets} + a manifest.

    ``hidden`` is the last hidden state after the final norm (EAGLE-1's input and, through the LM head, every
    head's target distribution); with ``aux_layers``, ``aux`` holds the inputs of those layers side by side
    (what an EAGLE-3 head fuses). Resumable: finished shards are listed in the manifest with the distill-file
    line range they cover.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    man_path = out_dir / "manifest.json"
    sig = target_signature(target)
    n_layers = layer_count(target.model)
    if aux_layers is not None and (not aux_layers or any(not 0 <= i < n_layers for i in aux_layers)):
        raise DraftTreeError(f"aux layers {aux_layers} out of range for {target.name} ({n_layers} layers)")
    manifest = {"format": "drafttree-features-v1", "target": sig, "feature": "last_hidden_state_post_norm",
                "dtype": "bfloat16", "aux_layers": aux_layers, "shards": []}
    if man_path.exists():
        old = json.loads(man_path.read_text())
        if old.get("target", {}).get("hidden_size") != sig["hidden_size"] or old["target"].get("vocab_size") != sig[
                "vocab_size"]:
            raise DraftTreeError(f"{out_dir} holds features of another target ({old.get('target')})")
        if old.get("aux_layers") != aux_layers:
            was = ",".join(map(str, old["aux_layers"])) if old.get("aux_layers") else "none"
            raise DraftTreeError(f"{out_dir} holds features with aux layers {old.get('aux_layers')}, not "
                                 f"{aux_layers}: resume with --aux-layers {was} or use another --out")
        manifest = old
    start = max((s["end"] for s in manifest["shards"]), default=0)
    records = list(iter_distilled(distilled))
    if not records:
        raise DraftTreeError(f"{distilled}: no samples")
    todo = records[start:]
    base = target.model.base_model
    bar = tqdm(total=len(records), initial=start, desc="features", unit="sample", disable=not show_progress)
    buf: list[tuple[list[int], list[int], torch.Tensor, torch.Tensor | None]] = []
    line = start

    def flush(upto: int):
        nonlocal buf
        if not buf:
            return
        idx = len(manifest["shards"])
        name = f"shard-{idx:05d}.safetensors"
        ids = torch.tensor([t for b in buf for t in b[0]], dtype=torch.int32)
        mask = torch.tensor([t for b in buf for t in b[1]], dtype=torch.uint8)
        hid = torch.cat([b[2] for b in buf]).to(torch.bfloat16).contiguous()
        lens = torch.tensor([0] + [len(b[0]) for b in buf], dtype=torch.int64).cumsum(0)
        tensors = {"input_ids": ids, "loss_mask": mask, "hidden": hid, "offsets": lens}
        if aux_layers is not None:
            tensors["aux"] = torch.cat([b[3] for b in buf]).to(torch.bfloat16).contiguous()
        tmp = out_dir / (name + ".tmp")
        save_file(tensors, str(tmp))
        os.replace(tmp, out_dir / name)
        manifest["shards"].append({"file": name, "start": upto - len(buf), "end": upto, "samples": len(buf),
                                   "tokens": int(ids.numel()), "loss_tokens": int(mask.sum())})
        _write_atomic_json(man_path, manifest)
        buf = []

    # one shard at a time; inside it, samples sorted by length and batched by a token budget (right
    # padding is harmless for a causal model's features), written back in file order
    for s0 in range(0, len(todo), shard_size):
        part = todo[s0:s0 + shard_size]
        seqs = [(rec["prompt_ids"] + rec["response_ids"])[:max_tokens] for rec in part]
        feats: list[torch.Tensor | None] = [None] * len(part)
        auxes: list[torch.Tensor | None] = [None] * len(part)
        order = sorted(range(len(part)), key=lambda i: len(seqs[i]))
        i = 0
        while i < len(order):
            group = [order[i]]
            while i + len(group) < len(order) and (len(group) + 1) * len(seqs[order[i + len(group)]]) <= batch_tokens:
                group.append(order[i + len(group)])
            width = max(len(seqs[j]) for j in group)
            ids = torch.zeros(len(group), width, dtype=torch.long)
            for r, j in enumerate(group):
                ids[r, : len(seqs[j])] = torch.tensor(seqs[j])
            with torch.inference_mode():
                # the layers' inputs caught as decoding catches them (Gemma 3n's stacked streams: the active one)
                out, aux = forward_catching(base, aux_layers, input_ids=ids.to(target.device), use_cache=False)
                hidden = out.last_hidden_state
            for r, j in enumerate(group):
                feats[j] = hidden[r, : len(seqs[j])].to(torch.bfloat16).cpu()
                if aux is not None:
                    auxes[j] = aux[r, : len(seqs[j])].to(torch.bfloat16).cpu()
            i += len(group)
            bar.update(len(group))
        for rec, seq, f, a in zip(part, seqs, feats, auxes):
            m = ([0] * len(rec["prompt_ids"]) + [1] * len(rec["response_ids"]))[: len(seq)]
            buf.append((seq, m, f, a))
        line += len(part)
        flush(line)
    bar.close()
    return {"shards": len(manifest["shards"]), "samples": sum(s["samples"] for s in manifest["shards"]),
            "tokens": sum(s["tokens"] for s in manifest["shards"]),
            "loss_tokens": sum(s["loss_tokens"] for s in manifest["shards"])}


def load_feature_dir(path: str | Path, with_aux: bool = True) -> tuple[dict, list[dict]]:
    """Read a feature directory: (manifest, samples) with samples as {input_ids, loss_mask, hidden} tensors
    (and ``aux`` when stored and ``with_aux``: three times the size of ``hidden``, needed by EAGLE-3 only).

    Missing or corrupt shards are clear errors.
    """
    keys = ("input_ids", "loss_mask", "hidden", "offsets") + (("aux",) if with_aux else ())
    path = Path(path)
    man_path = path / "manifest.json"
    if not man_path.exists():
        raise DraftTreeError(f"{path}: no manifest.json (not a feature directory; run `drafttree data features`)")
    try:
        manifest = json.loads(man_path.read_text())
    except json.JSONDecodeError:
        raise DraftTreeError(f"{man_path}: corrupt manifest") from None
    if not manifest.get("shards"):
        raise DraftTreeError(f"{path}: the manifest lists no shards")
    samples = []
    for s in manifest["shards"]:
        f = path / s["file"]
        if not f.exists():
            raise DraftTreeError(f"{path}: shard {s['file']} listed in the manifest is missing")
        try:
            with safe_open(str(f), framework="pt") as st:
                names = set(st.keys())  # noqa: SIM118 - a safetensors handle, not a dict
                t = {k: st.get_tensor(k) for k in keys if k in names}
        except Exception as e:  # safetensors raises several types for truncated/corrupt files
            raise DraftTreeError(f"{path}: shard {s['file']} is corrupt ({e})") from None
        off = t["offsets"].tolist()
        if len(off) != s["samples"] + 1 or off[-1] != t["input_ids"].numel():
            raise DraftTreeError(f"{path}: shard {s['file']} does not match its manifest entry")
        for a, b in zip(off[:-1], off[1:]):
            samples.append({"input_ids": t["input_ids"][a:b].long(), "loss_mask": t["loss_mask"][a:b].bool(),
                            "hidden": t["hidden"][a:b], **({"aux": t["aux"][a:b]} if "aux" in t else {})})
    return manifest, samples
