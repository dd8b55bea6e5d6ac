"""SmolLM2 in DTYPE on 12 Spec-Bench first turns (seed 22, 64 tokens): the CLI default (data/heads-smollm2)
against context + LM n-grams alone: tokens per call, verified tree nodes per step (mean, 50th and
90th percentile), the share of steps that ran the heads, and the run's timing (s).

    .venv/bin/python benchmarks/results/closing-2026-11-28i/probe_bf16_tree_sizes.py bfloat16
"""
import sys, numpy as np, torch
sys.path.insert(0,'benchmarks')
from spec_bench import QUESTIONS, cli_default, sample_questions
from latticedraft.decoding.methods.bpd import DrafterSpec
from latticedraft.decoding.runs.session import Session
dt=sys.argv[1]
torch.set_num_threads(2)
sh=Session("data/heads-smollm2", dtype=dt, threads=2)
sb=Session(sh.base_dir, dtype=dt, threads=2)
qs=sample_questions(QUESTIONS, 2, 22)
t=sh.chat_template()
ids=[t.ids([{"role":"user","content":q["turns"][0]}]) for q in qs]
rows={"default":(sh,*cli_default("data/heads-smollm2")),"ctx+lm":(sb,"bpd",DrafterSpec("none").fast())}
for name,(s,m,o) in rows.items():
    s.prepare(m,o,1)
    r=s.decode(ids,m,o,max_new_tokens=64)
    nodes=[k for q in r.sequences for k in q.tree_nodes]
    acc=[k for q in r.sequences for k in q.accepted_per_step] if hasattr(r.sequences[0],'accepted_per_step') else []
    heads=[k for q in r.sequences for k in getattr(q,'heads_per_step',[])]
    toks=sum(len(q.tokens) for q in r.sequences); calls=sum(q.calls for q in r.sequences)
    print(dt,name,'tok/call',round(toks/calls,3),'nodes mean',round(np.mean(nodes),2),'p50/p90',np.percentile(nodes,[50,90]),'heads steps',round(np.mean(heads),2) if heads else None, 'timing',{k:round(v,2) for k,v in r.timing.items()})
