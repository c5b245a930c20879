"""Lossless decoding on any torch device, with tiny random models (no weights to download or carry).

The test suite runs on the CPU (CI has no GPU); this script is what we run where a GPU is lent:
``python scripts/check_device.py --device cuda``. For Llama, Qwen2 and Gemma-3 targets in float32 it checks that
every method (an EAGLE-1 and an EAGLE-3 head, a draft LM with a smaller vocabulary) gives plain decoding's tokens,
that a batch of prompts gives each prompt's own tokens, that seeded sampling reproduces, and it times the stock
model under ``torch.compile`` next to our forward (``drafttree calibrate --compare-compile``'s measurement).
Exits non-zero on the first mismatch.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from conftest import tiny_causal_lm  # noqa: E402

from drafttree.api import SpeculativeModel  # noqa: E402
from drafttree.heads import Eagle3Head  # noqa: E402
from drafttree.heads.model import EagleHead  # noqa: E402
from drafttree.models import LoadedModel  # noqa: E402

METHODS = ["ar", "lookup", "eagle2", "eagle1", "eagle-chain", "hybrid", "auto"]
DRAFT_METHODS = ["draft", "hybrid"]


class TinyTokenizer:
    """Just enough of a tokenizer for token-id prompts: the vocabulary the target and the draft LM share."""

    eos_token_id = 1
    pad_token_id = 1

    def get_vocab(self) -> dict[str, int]:
        return {f"t{i}": i for i in range(56)}

    def decode(self, ids, **kwargs) -> str:
        return " ".join(f"t{int(i)}" for i in ids)

    def convert_ids_to_tokens(self, ids):
        return [f"t{int(i)}" for i in ids]


def sharpened(head: torch.nn.Module, seed: int) -> torch.nn.Module:
    """A random head whose guesses are sometimes right: its weights scaled up (like the tests' heads)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.mul_(3.0)
    return head.eval()


def check_arch(arch: str, device: torch.device, n_tokens: int) -> list[str]:
    failures = []
    tok = TinyTokenizer()
    target = LoadedModel(tiny_causal_lm(arch, vocab=64, hidden=32, layers=4, seed=1).to(device), tok,
                         f"tiny-{arch}", "")
    draft = LoadedModel(tiny_causal_lm("llama", vocab=60, hidden=32, layers=2, seed=7).to(device), tok,
                        "tiny-draft", "")
    prompts = [torch.tensor([3, 9, 4, 9, 4, 9, 4, 11, 5, 6] * 2), torch.tensor([7, 8, 7, 8, 2, 3])]
    heads = {"eagle1": sharpened(EagleHead(target.model).to(device), 5),
             "eagle3": sharpened(Eagle3Head(target.model, draft_vocab=torch.arange(2, 50)).to(device), 6)}
    for kind, head in heads.items():
        sm = SpeculativeModel(target, head=head, draft=draft)
        refs = [sm.generate(p, max_new_tokens=n_tokens, method="ar").tokens for p in prompts]
        methods = list(dict.fromkeys(METHODS + DRAFT_METHODS))
        taus = {}
        for method in methods:
            for p, ref in zip(prompts, refs):
                res = sm.generate(p, max_new_tokens=n_tokens, method=method)
                taus[method] = max(taus.get(method, 0.0), res.tau)
                if res.tokens != ref:
                    failures.append(f"{arch}/{kind}/{method}: {res.tokens} != {ref}")
        batch = sm.generate(prompts, max_new_tokens=n_tokens, method="auto")
        if [r.tokens for r in batch] != refs:
            failures.append(f"{arch}/{kind}/batch of {len(prompts)}: {[r.tokens for r in batch]} != {refs}")
        plain = sm.generate(prompts[0], max_new_tokens=n_tokens, method="ar", temperature=1.0, seed=11).tokens
        for method in methods:  # with a seed every method gives plain sampling's text (noise.py)
            got = sm.generate(prompts[0], max_new_tokens=n_tokens, method=method, temperature=1.0, seed=11).tokens
            if got != plain:
                failures.append(f"{arch}/{kind}/{method} seeded T=1 is not plain sampling's text: {got} != {plain}")
        print(f"{arch} {kind}: {len(methods)} methods x {len(prompts)} prompts, batch, seeded T=1 "
              f"{'ok' if not failures else 'FAILED'}; best tau per method: "
              + ", ".join(f"{m} {t:.2f}" for m, t in taus.items()), flush=True)
    return failures


def time_model_shape(config_path: str, device: torch.device, sizes=(1, 4, 16, 64), mode: str | None = None) -> None:
    """Verify cost of a real model's shape (random bf16 weights): our forward vs torch.compile, interleaved."""
    import json

    from transformers import AutoConfig, AutoModelForCausalLM

    from drafttree.bench.compiled import compiled_vs_ours
    from drafttree.budget import weight_bytes
    from drafttree.target import TargetModel

    raw = json.loads(Path(config_path).read_text())
    cfg = AutoConfig.for_model(raw.pop("model_type"), **{k: v for k, v in raw.items() if not k.startswith("_")})
    models = []
    for _ in range(2):  # ours, and an untouched copy to compile
        torch.manual_seed(0)
        models.append(AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to(device).eval())
    curves = compiled_vs_ours(TargetModel(models[0]), models[1], context=256, sizes=sizes, reps=9, mode=mode)
    mib = weight_bytes(models[0]) / 2**20
    for name, c in curves.items():
        print(f"{Path(config_path).stem} ({mib:.0f} MiB bf16) {name}{'' if name == 'ours' else f' ({mode})'}: "
              + ", ".join(f"{n} tok {1000 * s:.2f} ms" for n, s in zip(c.sizes, c.seconds)), flush=True)
    del models
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--archs", default="llama,qwen2,gemma3")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile beside our forward")
    ap.add_argument("--cost", action="append", default=[],
                    help="a config.json (scripts/model-configs/): time our forward and torch.compile's for a model of "
                         "that shape with random weights, bf16 (cost only: random weights accept nothing)")
    ap.add_argument("--compile-mode", default=None, help="torch.compile mode for --cost (e.g. reduce-overhead)")
    args = ap.parse_args()
    device = torch.device(args.device)
    print(f"torch {torch.__version__} on {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""), flush=True)
    t0 = time.time()
    failures = []
    for arch in filter(None, args.archs.split(",")):
        failures += check_arch(arch, device, args.tokens)
    if args.compile:
        from drafttree.bench.compiled import compiled_vs_ours
        from drafttree.target import TargetModel

        model = tiny_causal_lm("llama", vocab=64, hidden=32, layers=4, seed=1).to(device)
        stock = tiny_causal_lm("llama", vocab=64, hidden=32, layers=4, seed=1).to(device)
        curves = compiled_vs_ours(TargetModel(model), stock, context=64, sizes=(1, 4, 16), reps=5)
        for name, c in curves.items():
            print(f"{name}: " + ", ".join(f"{n} tokens {1000 * s:.2f} ms" for n, s in zip(c.sizes, c.seconds)))
    for path in args.cost:
        time_model_shape(path, device, mode=args.compile_mode)
    for f in failures:
        print("MISMATCH", f)
    print(f"{'FAILED' if failures else 'all identical'} in {time.time() - t0:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
