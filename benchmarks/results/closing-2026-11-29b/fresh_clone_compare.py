"""Every lossless output of fresh_clone_check.sh against HF greedy (transformers' generate,
do_sample=False) on the same prompt ids: python fresh_clone_compare.py OUTDIR (from the clone's root)."""

import glob
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.getcwd())
from latticedraft.decoding.eval import hf_baselines  # noqa: E402
from latticedraft.decoding.runs.session import Session  # noqa: E402

APPROXIMATE = ("sample", "mtad")  # sampled, or approximate by design: not compared with greedy
out = sys.argv[1]
session = Session("data/heads-smollm2", threads=2)
base = session.model.base
refs: dict = {}
for f in sorted(glob.glob(f"{out}/*.jsonl")):
    name = os.path.basename(f)[: -len(".jsonl")]
    rows = [json.loads(line) for line in open(f) if line.strip()]
    if not rows:
        print(f"{name:22s} no output (refused: see {name}.err)")
        continue
    if name.split(".")[0] in APPROXIMATE:
        print(f"{name:22s} {len(rows)} answers, not compared (sampled or approximate)")
        continue
    equal = 0
    for r in rows:
        ids = tuple(r["prompt_ids"])
        if ids not in refs:
            refs[ids] = hf_baselines.greedy(base, [np.asarray(ids)], 24, session.eos)[0][0].tolist()
        equal += list(r["tokens"]) == refs[ids]
    print(f"{name:22s} equal to HF greedy on {equal} of {len(rows)}")
