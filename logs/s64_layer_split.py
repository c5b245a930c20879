"""One layer of a U-row round, each of its kernel steps timed alone on the inputs a real round gave it (stop 64, a diagnostic). Usage: python logs/s64_layer_split.py U"""
import sys, time, torch, drafttree, statistics
from drafttree.bench.concurrency import interleaved_prompts
from drafttree.bench.tasks import BUILTIN
from drafttree.tree import DraftTree
from drafttree.kernels import gemm
torch.set_num_threads(2)
sm = drafttree.load(dtype="bfloat16")
u = int(sys.argv[1])
bt = sm.batch_target(); bt.keep([])
ids = [sm.encode_prompt(p) for p in interleaved_prompts(list(BUILTIN), u)]
bt.add_many(ids, [128] * u)
trees = [DraftTree.chain(100, []) for _ in range(u)]
bt.forward_trees(trees)
cap = []
real = gemm._ext
class P:
    def __getattr__(s, k):
        f = getattr(real, k)
        if k != "decode_layer": return f
        def w(*a):
            if not cap: cap.append(a)
            return f(*a)
        return w
gemm._ext = P()
bt.forward_trees(trees)
gemm._ext = real
(hidden, norm1, eps1, qkv, qkvb, cos, sin, kbuf, vbuf, start, length, rows, srow, sslot, mask, q_row, q_node, key_len,
 scale, hd, o_w, o_b, norm2, eps2, mlp, mlpb) = cap[0]
print("hidden", hidden.shape, "kbuf", kbuf.shape, "length", length, "rows", rows, "mask", mask.shape, "qkv", [w.shape for w in qkv])
E = real
B, T = hidden.shape[:2]
x = E.rms_norm(hidden, norm1, eps1)
proj = E.linears(x, qkv, qkvb)
heads = lambda t: t.view(B, T, -1, hd).transpose(1, 2)
v = heads(proj[2]); qk = E.rotary(heads(proj[0]), heads(proj[1]), cos, sin)
keys = kbuf[:rows, :, :length]; values = vbuf[:rows, :, :length]
H = qk[0].shape[1]
q = qk[0].transpose(1, 2).reshape(B * T, H, hd).contiguous()
att = E.tree_attention(q, keys, values, mask, q_row, q_node, key_len, 0, scale)
a2 = att.view(B, T, -1).contiguous()
h = hidden + E.linear(a2, o_w, o_b)
y = E.rms_norm(h, norm2, eps2)
steps = {
 "norm1": lambda: E.rms_norm(hidden, norm1, eps1),
 "qkv": lambda: E.linears(x, qkv, qkvb),
 "rotary": lambda: E.rotary(heads(proj[0]), heads(proj[1]), cos, sin),
 "q contiguous": lambda: qk[0].transpose(1, 2).reshape(B * T, H, hd).contiguous(),
 "attention": lambda: E.tree_attention(q, keys, values, mask, q_row, q_node, key_len, 0, scale),
 "o": lambda: E.linear(a2, o_w, o_b),
 "norm2": lambda: E.rms_norm(h, norm2, eps2),
 "mlp": lambda: E.gated_mlp(y, mlp[0], mlp[1], mlp[2], mlpb),
 "adds": lambda: (hidden + h, h + y),
 "whole layer": lambda: real.decode_layer(*cap[0]),
}
res = {k: [] for k in steps}
for i in range(200):
    for k, f in steps.items():
        t0 = time.perf_counter(); f(); res[k].append(time.perf_counter() - t0)
for k, v in res.items(): print(f"{k:14s} median {statistics.median(v)*1e6:7.1f} us  min {min(v)*1e6:7.1f}")
