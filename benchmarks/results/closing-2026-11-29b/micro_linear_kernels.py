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


def over(weights, product):
    """A pass over every layer product: ``product(xs, w)`` for each weight of ``weights``."""
    def run(xs):
        for layer in weights:
            for w in layer:
                product(xs, w)
    return run


KERNELS = {
    "F.linear (MKL)": over(W, lambda xs, w: F.linear(xs[w.shape[1]], w)),
    "oneDNN": over(WM, lambda xs, w: torch._C._nn.mkldnn_linear(xs[w.size(1)].to_mkldnn(), w, None).to_dense()),
    "x @ W^T stored [in, out]": over(WT, lambda xs, w: torch.mm(xs[w.shape[0]], w)),
    "W @ x^T": over(W, lambda xs, w: torch.mm(w, xs[w.shape[1]].t()).t()),
}
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
