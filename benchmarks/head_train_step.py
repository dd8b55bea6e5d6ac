"""One self-distillation step of head training (``train heads --self-distill``'s KL loss, frozen base),
timed on a model's shapes with random weights (the time does not depend on them), with each head's
positions projected as one matrix product (as ``gpu/train/heads.head_logits`` does) and, for
comparison, as the strided ``[b, L, 1, H]`` view it used to pass, which ``linear`` runs as ``b * L``
single-row products each reading the whole output embedding.

    python benchmarks/head_train_step.py --config .cache/models/smollm2-135m-instruct --device cuda

Prints the median step time of each layout (after one warm-up) and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

import latticedraft.gpu.train.heads as th
from latticedraft.gpu.models.blockwise import BlockwiseModel


def strided(bm, states, j, length, scale):
    """The projection as it was: a strided ``[b, length, 1, H]`` view of ``states``."""
    return bm.project_heads(states[:, :length, j - 2 : j - 1], first=j - 2, grad_scale=scale)[:, :, 0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="a model directory (its config.json is read)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--ffn-dim", type=int, default=768)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    torch.set_flush_denormal(True)  # random weights: subnormal products would time the CPU's slow path
    cfg = AutoConfig.from_pretrained(a.config)
    base = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).to(a.device)
    bm = BlockwiseModel.from_base(base, a.heads, "stern", seed=0, ffn_dim=a.ffn_dim, token_input=True).to(a.device)
    for p in bm.base.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(bm.head_parameters(), lr=1e-3)
    batch = torch.randint(0, cfg.vocab_size, (a.batch_size, a.seq_len), device=a.device)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    one_product = th.head_logits
    rows = {}
    try:
        for name, f in (("one product per head", one_product), ("strided view (before)", strided)):
            th.head_logits = f
            times = []
            for _ in range(a.repeats + 1):
                sync()
                t = time.perf_counter()
                losses, _ = th.head_kl_losses(bm, batch)
                sum(losses).backward()
                opt.step()
                opt.zero_grad()
                sync()
                times.append(time.perf_counter() - t)
            rows[name] = sorted(times[1:])[len(times[1:]) // 2]
            print(f"{name}: {rows[name] * 1000:.0f} ms per step (batch {a.batch_size} x {a.seq_len}, "
                  f"median of {a.repeats} after one warm-up)")
    finally:
        th.head_logits = one_product
    device = torch.cuda.get_device_name() if a.device.startswith("cuda") else platform.processor() or "cpu"
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({"benchmark": "head_train_step", "config": a.config, "device": device,
                       "torch": torch.__version__, "threads": torch.get_num_threads(), "batch_size": a.batch_size,
                       "seq_len": a.seq_len, "heads": a.heads, "ffn_dim": a.ffn_dim, "repeats": a.repeats,
                       "seconds_per_step": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
