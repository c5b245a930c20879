"""Probe (stop 75): recurrent / hybrid model types through drafttree's ChainTarget against Hugging Face's greedy
generate, float32: ar / lookup / auto alone, eagle2 and auto with a random EAGLE-3 head, T=1 seeded vs ar.
python logs/s75_chain_matrix.py [dtype] [types...]"""
import sys
import traceback

import torch

sys.path.insert(0, "logs")
sys.path.insert(0, "tests")
from s75_recurrent_probe import TYPES, build  # noqa: E402
from test_architectures import IdsTokenizer  # noqa: E402

from drafttree.api import SpeculativeModel  # noqa: E402
from drafttree.heads import Eagle3Head  # noqa: E402
from drafttree.models import LoadedModel  # noqa: E402

DTYPE = getattr(torch, sys.argv[1]) if len(sys.argv) > 1 and hasattr(torch, sys.argv[1]) else torch.float32
ONLY = [a for a in sys.argv[1:] if not hasattr(torch, a)]
N = 20


def main(t):
    try:
        m = build(t, TYPES[t]).to(DTYPE)
        with torch.no_grad():
            m.get_output_embeddings().weight.mul_(4.0)
    except Exception as e:
        return f"BUILD {type(e).__name__}: {str(e)[:120]}"
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, 96, (n,), generator=g) for n in (7, 19)]
    prompts[1][10:16] = prompts[1][:6]
    try:
        refs = [m.generate(p[None], do_sample=False, max_new_tokens=N, min_new_tokens=N)[0, p.numel():].tolist()
                for p in prompts]
    except Exception as e:
        return f"HF {type(e).__name__}: {str(e)[:120]}"
    lm = LoadedModel(m, IdsTokenizer(), f"tiny-{t}", "")
    res = []
    try:
        sm = SpeculativeModel(lm, method="lookup")
        for method in ("ar", "lookup", "auto"):
            outs = [sm.generate(p, max_new_tokens=N, method=method, ignore_eos=True) for p in prompts]
            ok = [o.tokens for o in outs] == refs
            res.append(f"{method}={'ok' if ok else 'DIFF'}(tau {sum(o.tau for o in outs) / 2:.2f})")
        torch.manual_seed(3)
        head = Eagle3Head(m, draft_vocab=torch.arange(2, 96), target_name=lm.name).eval().to(DTYPE)
        hm = SpeculativeModel(lm, method="eagle2", head=head)
        for method in ("eagle2", "auto"):
            ok = [hm.generate(p, max_new_tokens=N, method=method, ignore_eos=True).tokens for p in prompts] == refs
            res.append(f"e3-{method}={'ok' if ok else 'DIFF'}")
        alone = [sm.generate(p, max_new_tokens=N, method="ar", ignore_eos=True, temperature=1.0, seed=5).tokens
                 for p in prompts]
        ok = [sm.generate(p, max_new_tokens=N, method="lookup", ignore_eos=True, temperature=1.0, seed=5).tokens
              for p in prompts] == alone
        res.append(f"t1-lookup={'ok' if ok else 'DIFF'}")
    except Exception as e:
        traceback.print_exc(limit=-3)
        res.append(f"ERR {type(e).__name__}: {str(e)[:160]}")
    return "  ".join(res)


if __name__ == "__main__":
    for t in ONLY or TYPES:
        print(f"{t:18s} {main(t)}", flush=True)
