"""SmolLM2's 210 layer products (30 layers x q, k, v, o, gate, up, down; random float32 weights of its
shapes), M rows at a time, 2 threads, median of 7 ms: F.linear (MKL, what the model runs), oneDNN with
weights converted once (``Tensor.to_mkldnn``), torch.mm on W^T stored [in, out], and W @ x^T.

    .venv/bin/python benchmarks/results/closing-2026-11-29b/micro_linear_kernels.py
"""

import time

import torch
import torch.nn.functional as F

torch.set_num_threads(2)
torch.manual_seed(0)
SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
W = [[torch.randn(o, i) * 0.02 for (o, i) in SHAPES] for _ in range(30)]
WT = [[w.t().contiguous() for w in layer] for layer in W]
WM = [[w.to_mkldnn() for w in layer] for layer in W]


def linear(xs):
    for layer in W:
        for w in layer:
            F.linear(xs[w.shape[1]], w)


def onednn(xs):
    for layer in WM:
        for w in layer:
            torch._C._nn.mkldnn_linear(xs[w.size(1)].to_mkldnn(), w, None).to_dense()


def mm_wt(xs):
    for layer in WT:
        for w in layer:
            torch.mm(xs[w.shape[0]], w)


def w_xt(xs):
    for layer in W:
        for w in layer:
            torch.mm(w, xs[w.shape[1]].t()).t()


KERNELS = {"F.linear (MKL)": linear, "oneDNN": onednn, "x @ W^T stored [in, out]": mm_wt, "W @ x^T": w_xt}
print(f"{'rows':>4} " + " ".join(f"{k:>24}" for k in KERNELS))
for m in (1, 2, 3, 4, 6, 8, 16):
    xs = {576: torch.randn(m, 576), 1536: torch.randn(m, 1536)}
    row = []
    for fn in KERNELS.values():
        fn(xs)
        ts = []
        for _ in range(7):
            t = time.perf_counter()
            fn(xs)
            ts.append(time.perf_counter() - t)
        row.append(sorted(ts)[3] * 1e3)
    print(f"{m:>4} " + " ".join(f"{v:>24.1f}" for v in row), flush=True)
