"""Stop 82: the draft LM's auto prefill window at L on this machine, per remaining answer length.
python logs/s82_window_of.py  (logs/s82_window_of.log)"""

import drafttree

sm = drafttree.load("qwen2.5-coder-1.5b-instruct", draft_model="qwen2.5-coder-0.5b-instruct", dtype="bfloat16")
src = [s for s in sm.drafter("auto").sources if s.name == "draft"][0]
curve = sm.verify_cost()
print("draft cost (params ratio)", round(src.cost, 3), "verify(1) ms", round(1000 * curve.verify(1), 1),
      "verify(64)/verify(1)", round(src._verify_cost(64), 2))
print({n: src.prefill_window(n) for n in (32, 64, 128, 256, 512, 1024)})
