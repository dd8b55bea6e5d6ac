"""T(n) of SmolLM2's verify step (``CostModel.measure``, context 300, three interleaved rounds,
median of their quartiles) with LeanStack's layer products as they are ("stock") and through MKL's
packed GEMM ("packed") for calls of at least MIN rows, weights packed for HINT rows.

    .venv/bin/python benchmarks/results/closing-2026-11-28i/packed_gemm_step_cost.py HINT MIN BATCH
"""
import torch, time, types, sys
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
from latticedraft.gpu.verify.verifier import Verifier
from latticedraft.gpu.verify.cost_model import CostModel
from latticedraft.gpu.verify import lean
torch.set_num_threads(2)
m=AutoModelForCausalLM.from_pretrained('.cache/models/smollm2-135m-instruct',dtype=torch.float32).eval()
v=Verifier.for_model(m)
print('stack', v.stack is not None)
packs={}
HINT=int(sys.argv[1]) if len(sys.argv)>1 else 8
MIN=int(sys.argv[2]) if len(sys.argv)>2 else 4
BATCH=int(sys.argv[3]) if len(sys.argv)>3 else 1
def plinear(x,w,b=None):
    n=x.numel()//x.shape[-1]
    if n<MIN or x.dtype!=torch.float32: return F.linear(x,w,b)
    p=packs.get(w.data_ptr())
    if p is None:
        p=packs[w.data_ptr()]=torch.ops.mkl._mkl_reorder_linear_weight(w, HINT)
    y=torch.ops.mkl._mkl_linear(x.reshape(n,x.shape[-1]),p,w,b,n)
    return y.view(*x.shape[:-1],y.shape[-1])
proxy=types.SimpleNamespace(**{k:getattr(F,k) for k in dir(F) if not k.startswith('__')})
proxy.linear=plinear
grid=(1,2,3,4,6,8,12,16) if BATCH==1 else (1,2,3,4,6,8)
res={}
with torch.no_grad():
  for rnd in range(3):
    for mode in ('stock','packed'):
        lean.F = F if mode=='stock' else proxy
        cm=CostModel.measure(v,batch=BATCH,context=300,grid=grid,repeats=10,budget_s=30)
        res.setdefault(mode,[]).append(cm.info['raw_seconds'])
import numpy as np
for mode in res:
    a=np.median(np.array(res[mode]),axis=0)*1000
    print(mode,' '.join(f'{n}:{x:.1f}' for n,x in zip(grid,a)))
