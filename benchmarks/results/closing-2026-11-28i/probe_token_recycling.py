"""Offline probe: Token Recycling's adjacency table (Luo et al. 2024: per token, the target's top-k next
tokens seen at verified positions; drafts follow it) beside the context and LM n-gram chains the
default drafts, on SmolLM2's greedy answers to 18 Spec-Bench first turns (seed 21, 64 tokens).

Tokens per call of an oracle that keeps the longest-accepted of the sources' paths (depth 4; the
tree's node cost is not counted): an upper bound on what a source adds. "prompt": the table also
learns from the prompt's positions; "persist": it is kept across questions; tree_k: root children.

    .venv/bin/python benchmarks/results/closing-2026-11-28i/probe_token_recycling.py 3
"""
import sys, json, random, numpy as np, torch
sys.path.insert(0,'benchmarks')
from spec_bench import sample_questions, QUESTIONS
from transformers import AutoModelForCausalLM, AutoTokenizer
from latticedraft.lm.ngram import NgramLM
from latticedraft.lm.search_tables import lm_arrays
from latticedraft.decoding.proposers.lm_ngrams import LMNgrams
from latticedraft.decoding.proposers.context import ContextNgrams
torch.set_num_threads(2)
M='.cache/models/smollm2-135m-instruct'
tok=AutoTokenizer.from_pretrained(M); model=AutoModelForCausalLM.from_pretrained(M,dtype=torch.float32).eval()
lm=NgramLM.load('.cache/lm/smollm2-4gram'); arrays=lm_arrays(lm.fst)
qs=sample_questions(QUESTIONS, int(sys.argv[1]) if len(sys.argv)>1 else 2, 21)
K=8; D=4; NEW=64
seqs=[]
for q in qs:
    ids=tok.apply_chat_template([{"role":"user","content":q["turns"][0]}],add_generation_prompt=True,return_tensors='pt')
    if not isinstance(ids, torch.Tensor): ids=ids['input_ids']
    with torch.no_grad():
        out=model.generate(ids,max_new_tokens=NEW,do_sample=False)
        logits=model(out).logits[0]
    topk=logits.topk(K,dim=-1).indices.numpy()
    seqs.append((out[0].numpy(), ids.shape[1], topk, q['bench_category']))
print('generated', len(seqs))
V=49152
def run(use_prompt, persist, sources, tree_k=1):
    table=np.full((V,K),-1,dtype=np.int64)
    calls=toks=0
    for seq,P,topk,cat in seqs:
        if not persist: table[:]=-1
        if use_prompt:
            for p in range(P-1): table[seq[p]]=topk[p]
        pos=P-1  # root = seq[pos] is the last token already chosen (the prompt's last; in reality the first new token)
        end=len(seq)-1
        ctx=ContextNgrams(max_ngram=3,num_tokens=10,max_paths=4); lmn=LMNgrams(depth=D)
        while pos<end:
            hist=seq[:pos+1]
            paths=[]
            if 'tr' in sources:
                # tree: root children = top tree_k from table; each continues by top-1 chain to depth D
                r=table[seq[pos]]
                for c in r[:tree_k]:
                    if c<0: continue
                    path=[c]
                    while len(path)<D:
                        nx=table[path[-1]][0]
                        if nx<0: break
                        path.append(nx)
                    paths.append(path)
            if 'ctx' in sources:
                for c in ctx.candidates(hist)[:2]: paths.append(list(c.tokens[:D]))
            if 'lm' in sources:
                t,_=lmn.continuation(arrays,hist); paths.append(list(t))
            target=seq[pos+1:pos+1+D]
            best=0
            for pth in paths:
                a=0
                while a<min(len(pth),len(target)) and pth[a]==target[a]: a+=1
                best=max(best,a)
            # verified positions: pos .. pos+best (their logits computed); update table
            for p in range(pos,pos+best+1):
                table[seq[p]]=topk[p]
            calls+=1; n=min(best+1,end-pos); toks+=n; pos+=n
    return toks/calls
for src in (['ctx'],['lm'],['ctx','lm'],['tr'],['ctx','lm','tr']):
    for tk in ((1,2) if 'tr' in src else (1,)):
        for up in ((False,True) if 'tr' in src else (False,)):
            for pers in ((False,True) if 'tr' in src else (False,)):
                print(src,'tree_k',tk,'prompt',up,'persist',pers, round(run(up,pers,src,tk),3))
print('--- context + token recycling, no LM')
for src in (['ctx','tr'],):
    for tk in (1,2):
        print(src,'tree_k',tk,'prompt+persist', round(run(True,True,src,tk),3), 'no prompt, persist', round(run(False,True,src,tk),3))
