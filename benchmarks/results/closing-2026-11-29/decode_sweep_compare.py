import json,glob,os
def load(f):
    try: return [json.loads(l) for l in open(f) if l.strip()]
    except Exception as e: return None
ref={b: load(f'/tmp/sweep/greedy.b{b}.jsonl') for b in (1,4)}
print({b:(len(r) if r else r) for b,r in ref.items()}, list(ref[1][0].keys()) if ref[1] else None)
for f in sorted(glob.glob('/tmp/sweep/*.jsonl')):
    if 'prompts' in f: continue
    name=os.path.basename(f); b=int(name.split('.b')[1][0])
    rows=load(f)
    if not rows: print(name, 'EMPTY'); continue
    key='tokens' if 'tokens' in rows[0] else None
    eq=[r.get('tokens')==g.get('tokens') for r,g in zip(rows, ref[1])]
    print(f"{name:28s} n={len(rows)} equal_to_greedy_b1={sum(eq)}/{len(eq)}", {k:rows[0].get(k) for k in ('block_efficiency','tokens_per_call','method') if k in rows[0]})
