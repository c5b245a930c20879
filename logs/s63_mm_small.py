"""Products of 1-64 rows over 30 distinct weights: the small-GEMM kernel, oneDNN on packed weights, torch (stop 63, a diagnostic). Usage: python logs/s63_mm_small.py"""
import torch, time, statistics
torch.set_num_threads(2)
from drafttree.kernels import gemm
gemm.small_gemm()
ext = gemm._ext
F=torch.nn.functional
def t(f, n=200):
    for _ in range(20): f()
    ts=[]
    for _ in range(n):
        t0=time.perf_counter(); f(); ts.append(time.perf_counter()-t0)
    return statistics.median(ts)*1e6, min(ts)*1e6
# whole-layer weight set, streamed (weights bigger than L2): simulate 30 layers' worth of distinct weights
for M in (1, 4, 16, 32, 64):
    res = {}
    for (K,N) in [(576,1536),(1536,576),(576,576)]:
        ws=[torch.randn(N,K).bfloat16() for _ in range(30)]
        pws=[torch.ops.mkldnn._reorder_linear_weight(w, M) for w in ws]
        x=torch.randn(M,K).bfloat16()
        a = t(lambda: [ext.linear(x, w, None) for w in ws], 30)
        b = t(lambda: [torch.ops.mkldnn._linear_pointwise(x, pw, None, "none", [], "") for pw in pws], 30)
        c = t(lambda: [F.linear(x, w) for w in ws], 30)
        res[(K,N)] = (a[0]/30, b[0]/30, c[0]/30)
    print(M, {k: "kernel %.0f onednn-packed %.0f torch %.0f us" % v for k, v in res.items()})
