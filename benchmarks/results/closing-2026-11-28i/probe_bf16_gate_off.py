"""The bfloat16 default against its own n-gram drafts, on the heads' session: the CLI default, the same with
the head gate forced off, and context + LM n-grams (drafter none) on the same session; seed 22 first
turns, 64 tokens; tokens per call, tree nodes (mean, 50th/90th percentile), model seconds.

    .venv/bin/python benchmarks/results/closing-2026-11-28i/probe_bf16_gate_off.py bfloat16
"""
import sys, numpy as np, torch
sys.path.insert(0,'benchmarks')
from spec_bench import QUESTIONS, cli_default, sample_questions
from latticedraft.decoding.methods import bpd_session
from latticedraft.decoding.methods.bpd import DrafterSpec
from latticedraft.decoding.planning.head_gate import OFF, HeadGate
from latticedraft.decoding.runs.session import Session
torch.set_num_threads(2)
dt=sys.argv[1]
sh=Session("data/heads-smollm2", dtype=dt, threads=2)
qs=sample_questions(QUESTIONS, 2, 22)
t=sh.chat_template()
ids=[t.ids([{"role":"user","content":q["turns"][0]}]) for q in qs]
m,o=cli_default("data/heads-smollm2")
none=DrafterSpec("none").fast()
def run(name,s,m,o):
    s.prepare(m,o,1)
    r=s.decode(ids,m,o,max_new_tokens=64)
    nodes=[k for q in r.sequences for k in q.tree_nodes]
    toks=sum(len(q.tokens) for q in r.sequences); calls=sum(q.calls for q in r.sequences)
    print(dt,name,'tok/call',round(toks/calls,3),'nodes',round(np.mean(nodes),2),np.percentile(nodes,[50,90]),'s',round(r.timing['model'],1),flush=True)
run('default',sh,m,o)
off=HeadGate(); off.policy=OFF
bpd_session.swap_gate(sh,o,off)
run('default, gate forced off',sh,m,o)
run('none on heads session',sh,'bpd',none)
