"""One-off probe (closing-2026-11-28h): top-1 agreement of heads 2-6 with SmolLM2's own top-1 at t+j,
teacher-forced, on 24 rows of 256 tokens of the text the heads were trained on
(data/smollm2-own-text.txt.gz) and on 24 rows they never saw (data/smollm2-own-answers-gpu.txt.xz).
Run from the checkout: .venv/bin/python benchmarks/results/closing-2026-11-28h/probe_own_rows_agreement.py HEADS_DIR
(it was run on the heads committed before, `git show ab24fbc:data/heads-smollm2/...`)."""
import sys
import torch, numpy as np, lzma, gzip
from latticedraft.gpu.models.blockwise import BlockwiseModel
from latticedraft.gpu.train.heads import head_states, head_logits
from tokenizers import Tokenizer
torch.set_num_threads(2)
bm = BlockwiseModel.from_pretrained(sys.argv[1]); bm.float().eval()
tok = Tokenizer.from_file(".cache/models/smollm2-135m-instruct/tokenizer.json")
def windows(text):
    rows = text.split("<|im_start|>system\n")[1:300]
    ids = [tok.encode("<|im_start|>system\n" + r).ids for r in rows]
    return torch.tensor([x[:256] for x in ids if len(x) >= 256][:24])
for name, text in [("train rows", gzip.open("data/smollm2-own-text.txt.gz", "rt").read(3_000_000)),
                   ("gpu rows", lzma.open("data/smollm2-own-answers-gpu.txt.xz", "rt").read(3_000_000))]:
    b = windows(text); s = b.shape[1]; hits = np.zeros(6); n = np.zeros(6)
    with torch.no_grad():
        for i in range(0, len(b), 8):
            x = b[i:i+8]; out, states, _ = head_states(bm, x); am = out.logits.argmax(-1)
            for j in range(2, 7):
                lg = head_logits(bm, states, j, s - j, 1.0).argmax(-1)
                hits[j-1] += (lg == am[:, j-1:s-1]).sum().item(); n[j-1] += lg.numel()
    print(name, len(b), "agreement with the base's top-1 at t+j:", np.round(hits[1:] / n[1:], 3))
