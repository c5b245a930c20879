"""Stop 81 probe: would a weight-quantized copy of the target (round-to-nearest, symmetric, per output channel or per
group; every decoder linear, the LM head kept) draft well for it? Teacher-forced on the target's own greedy and T=1
answers (96 tokens) to 12 held-out prompts (data/heldout, 2 per class, float32): top-1 agreement along the greedy
text, and at T=1 the sum of min(p, q) and the agreement of the two argmaxes under the same Gumbel noise (8 draws).
python logs/s81_quant_twin_accept.py   (output: logs/s81_quant_twin_accept.log)"""

import copy
import json

import torch

import drafttree

torch.set_num_threads(2)

torch.manual_seed(0)

sm = drafttree.load(dtype="float32")
model = sm.target.model
files = ["chat_turns", "email", "math_steps", "code_edit", "multilingual", "structured"]
prompts = []
for f in files:
    with open(f"/work/main/data/heldout/{f}.jsonl") as fh:
        prompts += [json.loads(x)["turns"][0] for x in fh][:2]
seqs = {}
for temp in (0.0, 1.0):
    seqs[temp] = []
    for i, p in enumerate(prompts):
        ids = sm.prompt_ids(p).reshape(-1)
        r = sm.generate(p, 96, temperature=temp, seed=i, method="ar")
        seqs[temp].append((ids, torch.tensor(r.tokens)))


def quantize(w, bits, group):
    out_f, in_f = w.shape
    g = in_f if group == 0 else group
    x = w.float().reshape(out_f, in_f // g, g)
    qmax = 2 ** (bits - 1) - 1
    scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-8) / qmax
    q = (x / scale).round().clamp(-qmax - 1, qmax)
    return (q * scale).reshape(out_f, in_f).to(w.dtype)


def variant(bits, group, lm_head_bits=None):
    m = copy.deepcopy(model)
    with torch.no_grad():
        for name, mod in m.named_modules():
            if isinstance(mod, torch.nn.Linear) and "lm_head" not in name:
                mod.weight.copy_(quantize(mod.weight, bits, group))
    return m


@torch.no_grad()
def logits_of(m, ids, gen):
    full = torch.cat([ids, gen])[None]
    out = m(full).logits[0, len(ids) - 1 : len(ids) - 1 + len(gen)]
    return out.float()


ref = {t: [logits_of(model, a, b) for a, b in s] for t, s in seqs.items()}
for bits, group in ((8, 0), (7, 0), (6, 0), (6, 64), (4, 32), (4, 64), (4, 0)):
    m = variant(bits, group)
    top1 = n = 0
    coup = mn = 0.0
    cn = 0
    for (a, b), lr in zip(seqs[0.0], ref[0.0]):
        lq = logits_of(m, a, b)
        top1 += (lq.argmax(-1) == lr.argmax(-1)).sum().item()
        n += len(b)
    for (a, b), lr in zip(seqs[1.0], ref[1.0]):
        lq = logits_of(m, a, b)
        lp, lqq = lr.log_softmax(-1), lq.log_softmax(-1)
        mn += torch.minimum(lp.exp(), lqq.exp()).sum(-1).sum().item()
        for _ in range(8):
            g = -torch.log(-torch.log(torch.rand_like(lp).clamp(1e-20, 1)))
            coup += ((lp + g).argmax(-1) == (lqq + g).argmax(-1)).float().sum().item()
        cn += len(b)
    print(
        f"int{bits} group {group or 'channel'}: greedy top-1 agreement {top1 / n:.3f}; T=1 sum min(p,q) {mn / cn:.3f}, "
        f"gumbel-coupled {coup / (8 * cn):.3f}",
        flush=True,
    )
