"""SmolLM2-shaped layer products (30 layers x q,k,v,o,gate,up,down; random float32 weights), M rows,
2 threads: F.linear against MKL packed GEMM over weights packed for 4, 8, 16 and 32 rows; median ms.

    .venv/bin/python benchmarks/results/closing-2026-11-28i/packed_gemm_micro.py
"""
import torch, time
torch.set_num_threads(2)
shapes=[(576,576),(192,576),(192,576),(576,576),(1536,576),(1536,576),(576,1536)]
L=30
Ws=[[torch.randn(o,i) for (o,i) in shapes] for _ in range(L)]
hints=(4,8,16,32)
P={h:[[torch.ops.mkl._mkl_reorder_linear_weight(W, h) for W in ws] for ws in Ws] for h in hints}
def run(M, h, reps=12):
    xs={i:torch.randn(M,i) for i in (576,1536)}
    ts=[]
    for r in range(reps):
        t=time.perf_counter()
        for l in range(L):
            for k,(o,i) in enumerate(shapes):
                if h==0: torch.nn.functional.linear(xs[i],Ws[l][k])
                else: torch.ops.mkl._mkl_linear(xs[i],P[h][l][k],Ws[l][k],None,M)
        ts.append(time.perf_counter()-t)
    ts.sort(); return ts[len(ts)//2]*1000
for M in (4,6,8,12,16,24,32):
    print(M, ' '.join(f'h{h}={run(M,h):.1f}' for h in (0,)+hints))
