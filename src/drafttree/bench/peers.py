"""Peer methods: Hugging Face ``generate`` through its public API, on the same loaded target.

* ``hf-ar``: plain ``model.generate`` (greedy at T=0, multinomial sampling otherwise);
* ``hf-lookup``: prompt lookup decoding, ``prompt_lookup_num_tokens=10``;
* ``hf-assisted``: assisted generation with ``assistant_model=<draft>.model`` (the assistant's own
  ``generation_config`` drives its draft length, transformers' defaults).

Sampling settings are passed explicitly (top_k=0, top_p=1, no penalties), so the model's generation_config
cannot change what is compared. tau is not observable through this API (reported as null); target forwards
are counted with a forward hook on the target module.
"""

from __future__ import annotations

import torch

from drafttree.errors import DraftTreeError

HF_METHODS = ["hf-ar", "hf-lookup", "hf-assisted"]
PROMPT_LOOKUP_TOKENS = 10


def needs_draft(method: str) -> bool:
    return method in ("hf-assisted", "draft")


class ForwardCounter:
    """Counts top-level forward calls of a module while active (context manager)."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.count = 0
        self._handle = None

    def _hook(self, *_):
        self.count += 1

    def __enter__(self):
        self.count = 0
        self._handle = self.module.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc):
        self._handle.remove()
        return False


class GrammarLogits:
    """A transformers logits processor: what the grammar allows after the output so far (assisted generation calls it
    on each candidate's prefix, and on shorter prefixes after a rejection: the state follows them)."""

    def __init__(self, grammar, prompt_len: int):
        self.state, self.prompt_len = grammar.start(), prompt_len

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        from drafttree.grammar import mask_logits
        from drafttree.tree import DraftTree

        if input_ids.shape[0] != 1:
            raise DraftTreeError("structured output through transformers runs one sequence at a time")
        self.state.sync(input_ids[0, self.prompt_len:].tolist())
        return mask_logits(scores.float().contiguous().clone(), self.state.bitmasks(DraftTree.root_only(0)))


def hf_generate(method: str, target, input_ids: torch.Tensor, max_new_tokens: int, temperature: float,
                eos_ids, seed: int | None, draft=None, grammar=None) -> tuple[list[int], int]:
    """Run one Hugging Face generation; return (new token ids, target forward calls).

    ``target``/``draft`` are :class:`drafttree.models.LoadedModel`; ``input_ids`` a 1-D prompt tensor; ``grammar``:
    a structured-output constraint (grammar.py) applied as a logits processor, so transformers' methods decode under
    the same constraint as ours.
    """
    if method not in HF_METHODS:
        raise DraftTreeError(f"unknown Hugging Face method {method!r}; choose one of {', '.join(HF_METHODS)}")
    model = target.model
    ids = input_ids.reshape(1, -1).to(target.device)
    eos = sorted(int(e) for e in eos_ids)
    pad = target.tokenizer.pad_token_id
    kw = dict(
        max_new_tokens=int(max_new_tokens), min_new_tokens=0, eos_token_id=eos,
        pad_token_id=pad if pad is not None else (eos[0] if eos else None),
        num_beams=1, repetition_penalty=1.0, no_repeat_ngram_size=0, return_dict_in_generate=False, use_cache=True,
    )
    if temperature > 0:  # pure temperature sampling, like ours (top_k=0 and top_p=1 switch those filters off)
        kw.update(do_sample=True, temperature=float(temperature), top_k=0, top_p=1.0)
    else:
        kw.update(do_sample=False)
    if method == "hf-lookup":
        kw["prompt_lookup_num_tokens"] = PROMPT_LOOKUP_TOKENS
    elif method == "hf-assisted":
        if draft is None:
            raise DraftTreeError("method 'hf-assisted' needs a draft model (--draft-model)")
        kw["assistant_model"] = draft.model
    if grammar is not None:
        from transformers import LogitsProcessorList

        kw["logits_processor"] = LogitsProcessorList([GrammarLogits(grammar, ids.shape[1])])
    if seed is not None:
        torch.manual_seed(seed)
        if target.device.type == "cuda":
            torch.cuda.manual_seed_all(seed)
    with torch.inference_mode(), ForwardCounter(model) as counter:
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    new = out[0, ids.shape[1]:].tolist()
    # generate pads nothing at batch size 1, but cut after the first EOS to be safe
    for i, t in enumerate(new):
        if t in eos_ids:
            new = new[: i + 1]
            break
    return new, counter.count
