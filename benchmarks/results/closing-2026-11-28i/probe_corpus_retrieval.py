"""Offline probe: REST-style retrieval drafts (He et al. 2024): the longest suffix of the history
(12, 8, 6, 4, 3 tokens) found in SmolLM2's own text (the 9.7 M tokens its heads and 4-gram were
built on), the continuation most of its matches share, beside the context and LM n-gram chains the
default drafts, on SmolLM2's greedy answers to 18 Spec-Bench first turns (seed 21, 64 tokens).
Tokens per call of an oracle keeping the longest-accepted path (depth 4; node cost not counted).

    .venv/bin/python benchmarks/results/closing-2026-11-28i/probe_corpus_retrieval.py
"""
import sys, lzma, gzip, time, numpy as np, torch
sys.path.insert(0,'benchmarks')
from spec_bench import sample_questions, QUESTIONS
from transformers import AutoModelForCausalLM, AutoTokenizer
from tokenizers import Tokenizer
from latticedraft.lm.ngram import NgramLM
from latticedraft.lm.search_tables import lm_arrays
from latticedraft.decoding.proposers.lm_ngrams import LMNgrams
from latticedraft.decoding.proposers.context import ContextNgrams
torch.set_num_threads(2)
M='.cache/models/smollm2-135m-instruct'
t0=time.time()
tk=Tokenizer.from_file(M+'/tokenizer.json')
texts=[]
for f,op in (('data/smollm2-own-answers-gpu.txt.xz',lzma.open),('data/smollm2-own-answers.txt.gz',gzip.open),('data/smollm2-own-text.txt.gz',gzip.open)):
    with op(f,'rt') as fh: s=fh.read()
    # documents: split at system prompt starts
    docs=s.split('<|im_start|>system')
    texts+=['<|im_start|>system'+d for d in docs if d.strip()]
enc=tk.encode_batch(texts)
corpus=np.concatenate([np.append(np.array(e.ids,dtype=np.int64),-1) for e in enc])
print('corpus tokens',len(corpus),'docs',len(texts),f'{time.time()-t0:.0f}s',flush=True)
ORDERS=(12,8,6,4,3,2)
P=np.uint64(1000003)
def hashes(arr,n):
    h=np.zeros(len(arr)-n+1,dtype=np.uint64)
    for k in range(n):
        h=h*P+(arr[k:len(arr)-n+1+k]+2).astype(np.uint64)
    return h
index={}
for n in ORDERS:
    h=hashes(corpus,n); order=np.argsort(h,kind='stable'); index[n]=(h[order],order)
print('indexed',f'{time.time()-t0:.0f}s',flush=True)
def rest_path(hist,D,min_n=3,cap=256):
    for n in ORDERS:
        if n<min_n or len(hist)<n: continue
        key=hashes(hist[-n:],n)[0]
        hs,order=index[n]
        lo=np.searchsorted(hs,key,'left'); hi=np.searchsorted(hs,key,'right')
        if hi<=lo: continue
        starts=order[lo:min(hi,lo+cap)]+n  # continuation start
        conts=[corpus[s:s+D] for s in starts]
        path=[]
        for d in range(D):
            vals=[c[d] for c in conts if len(c)>d and c[d]>=0 and list(c[:d])==path]
            if not vals: break
            u,cnt=np.unique(vals,return_counts=True)
            path.append(int(u[np.argmax(cnt)]))
        return path,n,hi-lo
    return [],0,0
tok=AutoTokenizer.from_pretrained(M); model=AutoModelForCausalLM.from_pretrained(M,dtype=torch.float32).eval()
lm=NgramLM.load('.cache/lm/smollm2-4gram'); arrays=lm_arrays(lm.fst)
qs=sample_questions(QUESTIONS, 3, 21)
D=4; NEW=64
seqs=[]
for q in qs:
    ids=tok.apply_chat_template([{"role":"user","content":q["turns"][0]}],add_generation_prompt=True,return_tensors='pt')
    if not isinstance(ids, torch.Tensor): ids=ids['input_ids']
    with torch.no_grad(): out=model.generate(ids,max_new_tokens=NEW,do_sample=False)
    seqs.append((out[0].numpy(), ids.shape[1], q['bench_category']))
print('generated',f'{time.time()-t0:.0f}s',flush=True)
def run(sources,min_n=3):
    calls=toks=0; bycat={}
    for seq,P_,cat in seqs:
        pos=P_-1; end=len(seq)-1
        ctx=ContextNgrams(max_ngram=3,num_tokens=10,max_paths=4); lmn=LMNgrams(depth=D)
        c0=calls;t0_=toks
        while pos<end:
            hist=seq[:pos+1]; paths=[]
            if 'ctx' in sources:
                for c in ctx.candidates(hist)[:2]: paths.append(list(c.tokens[:D]))
            if 'lm' in sources:
                t,_=lmn.continuation(arrays,hist); paths.append(list(t))
            if 'rest' in sources:
                p,_,_=rest_path(hist,D,min_n); 
                if p: paths.append(p)
            target=seq[pos+1:pos+1+D]; best=0
            for pth in paths:
                a=0
                while a<min(len(pth),len(target)) and pth[a]==target[a]: a+=1
                best=max(best,a)
            calls+=1; n=min(best+1,end-pos); toks+=n; pos+=n
        b=bycat.setdefault(cat,[0,0]); b[0]+=toks-t0_; b[1]+=calls-c0
    return round(toks/calls,3), {k:round(v[0]/v[1],2) for k,v in bycat.items()}
for src in (['ctx'],['lm'],['rest'],['ctx','lm'],['ctx','rest'],['ctx','lm','rest']):
    print(src, *run(src), flush=True)
print('rest min_n 5', run(['ctx','lm','rest'],5), run(['rest'],5))
