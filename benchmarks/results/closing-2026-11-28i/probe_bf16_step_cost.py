"""SmolLM2 in bfloat16 against float32 on this CPU: HF greedy tokens/s (64 tokens after a 300-token
random prompt) and T(n) of the verify step (``CostModel.measure``, context 300, raw quartiles, ms).

    .venv/bin/python benchmarks/results/closing-2026-11-28i/probe_bf16_step_cost.py
"""
import torch, time, numpy as np
from transformers import AutoModelForCausalLM
from latticedraft.gpu.verify.verifier import Verifier
from latticedraft.gpu.verify.cost_model import CostModel
torch.set_num_threads(2)
for dt in (torch.bfloat16, torch.float32):
    m=AutoModelForCausalLM.from_pretrained('.cache/models/smollm2-135m-instruct',dtype=dt).eval()
    x=torch.randint(100,40000,(1,300))
    with torch.no_grad():
        m.generate(x,max_new_tokens=4,do_sample=False)
        t=time.perf_counter(); m.generate(x,attention_mask=torch.ones_like(x),max_new_tokens=64,min_new_tokens=64,do_sample=False); g=time.perf_counter()-t
        v=Verifier.for_model(m)
        cm=CostModel.measure(v,batch=1,context=300,grid=(1,2,3,4,6,8,12,16,24,32),repeats=8,budget_s=20)
    print(dt, f'HF greedy {64/g:.1f} tok/s', 'lean stack', v.stack is not None, ' '.join(f'{n}:{s*1000:.1f}' for n,s in zip(cm.nodes,cm.info['raw_seconds'])))
