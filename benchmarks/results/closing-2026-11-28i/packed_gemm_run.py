"""Run a benchmark script with LeanStack's layer products swapped to MKL's packed GEMM
(``torch.ops.mkl._mkl_linear`` over weights packed once, for calls of 4..64 rows) when PACK=1;
PACK_HINT: the batch size the weights are packed for (default 32). The cost-model key gains
"packed", so the planner plans with the packed step's own T(n).

    PACK=1 PACK_HINT=8 .venv/bin/python benchmarks/results/closing-2026-11-28i/packed_gemm_run.py \
        benchmarks/spec_bench.py --heads data/heads-smollm2 --seed 20 --only "ours: default (CLI)" ...
"""
import os, sys, types, runpy, torch
import torch.nn.functional as F
HINT = int(os.environ.get('PACK_HINT', '32'))
if os.environ.get('PACK') == '1':
    from latticedraft.gpu.verify import lean, cost_model
    packs = {}
    def plinear(x, w, b=None):
        n = x.numel() // x.shape[-1]
        if n < 4 or n > 64 or x.dtype != torch.float32 or x.device.type != 'cpu':
            return F.linear(x, w, b)
        p = packs.get(w.data_ptr())
        if p is None:
            p = packs[w.data_ptr()] = torch.ops.mkl._mkl_reorder_linear_weight(w, HINT)
        y = torch.ops.mkl._mkl_linear(x.reshape(n, x.shape[-1]), p, w, b, n)
        return y.view(*x.shape[:-1], y.shape[-1])
    proxy = types.SimpleNamespace(**{k: getattr(F, k) for k in dir(F) if not k.startswith('__')})
    proxy.linear = plinear
    lean.F = proxy
    orig = cost_model.describe
    cost_model.describe = lambda v, b: {**orig(v, b), 'packed': f'mkl{HINT}'}
    print('[packrun] packed GEMM on', file=sys.stderr)
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name='__main__')
