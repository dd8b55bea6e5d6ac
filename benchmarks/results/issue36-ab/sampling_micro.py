import sys, time, statistics
import torch
try:
    from latticedraft.decoding.methods.bpd import DrafterSpec
except ImportError:
    from latticedraft.decoding.bpd import DrafterSpec
from latticedraft.decoding.accept.sampling import SamplingOptions
from latticedraft.decoding.runs.session import Session
from latticedraft.decoding.runs.loaders import encode
from latticedraft.decoding.runs.prompt_set import read_prompts
from latticedraft.paths import data_dir
from latticedraft.quiet import quiet_libraries
quiet_libraries(False)
s = Session(None, None, None, None, None, 1)
ids = encode(s.tokenizer, [r["prompt"] for r in read_prompts(data_dir() / "prompts.jsonl", limit=6)])
specs = {"tree": DrafterSpec(name="parallel-base", nbest=4, draft_vocab="auto").for_sampling(),
         "heads": DrafterSpec(name="top1", draft_vocab="auto").for_sampling(),
         "greedy-default": DrafterSpec("top1").fast()}
out = {}
for name, spec in specs.items():
    smp = None if name == "greedy-default" else SamplingOptions(temperature=1.0, top_k=50, top_p=1.0, seed=0)
    s.prepare("bpd", spec)
    ts = []
    for rep in range(6):
        t0 = time.perf_counter(); n = 0
        for i, p in enumerate(ids):
            r = s.decode([p], "bpd", spec, max_new_tokens=48, sampling=smp, first_row=i)
            n += len(r.sequences[0].tokens)
        if rep: ts.append(time.perf_counter() - t0)
    out[name] = n / statistics.median(ts)
with torch.no_grad():
    x = torch.as_tensor(ids[0][None]); base = s.model.base
    ts = []
    for rep in range(6):
        t0 = time.perf_counter()
        for p in ids:
            x = torch.as_tensor(p[None]); torch.manual_seed(0)
            base.generate(x, attention_mask=torch.ones_like(x), do_sample=True, temperature=1.0, top_k=50, max_new_tokens=48, pad_token_id=0)
        if rep: ts.append(time.perf_counter() - t0)
    out["hf-sample-s"] = statistics.median(ts)
print(sys.argv[1], " ".join(f"{k}={v:.1f}" if not k.endswith("-s") else f"{k}={v:.3f}" for k, v in out.items()), flush=True)
