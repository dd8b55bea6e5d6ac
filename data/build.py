"""Stage-by-stage rebuild of the bundled defaults (run via ``data/build.sh [stage ...]``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parent
ROOT = DATA.parent
sys.path.insert(0, str(ROOT))

from latticedraft.lm.corpus import stdlib_root, stdlib_split  # noqa: E402
from latticedraft.lm.tokenizer import fingerprint, load_tokenizer, train_tokenizer  # noqa: E402

VOCAB = 8192
SEED = 0
# Sized so that every training stage together takes well under an hour on a 2-core CPU. Training
# runs on ONE torch thread: for models this small, two threads on a shared 2-core machine were
# measured 8x slower per step (0.9 s vs 7.1 s); one thread gives ~0.65 s per 2048-token base step.
# Small batches, many updates: the tiny-compute regime learns more per token that way.
# The base is a Mistral (RoPE, SwiGLU, sliding-window attention over W = 256 positions) with 2048
# positions. With RoPE and a window, attention only ever spans < W relative positions, so training on
# 512-token windows (the window really slides: positions 256..511 lose their oldest keys) covers every
# relative offset the model meets at 2048; the report measures long-context perplexity to check it.
# 2400 steps × 4 × 512 tokens = 4.9 M tokens, the same as the 256-position GPT-2 base it replaces.
WINDOW = 256
BASE = dict(n_embd=128, n_layer=4, n_head=4, n_positions=2048, family="mistral", sliding_window=WINDOW)
BASE_OPT = dict(steps=2400, lr=3e-3, batch_size=4, seq_len=512, warmup_frac=0.05, weight_decay=0.01, checkpoint_every=50)
# Self-distillation (docs/self-distillation.md): every drafter learns what the base says. The text is the base's
# own continuations of CONT["prompts"] prompts of 48 stdlib:train tokens to DISTILL_SEQ tokens (half greedy, half
# sampled at T = 1), made in batches by the decode loop and cached under .cache/continuations (every stage below
# shares them: same settings, same cache entry); the loss is the KL divergence to the frozen base's distribution
# (head j at t: the base's distribution of token t+j).
DISTILL_SEQ = 192
CONT = dict(prompts=2048, prompt_len=48, sample_fraction=0.5, temperature=1.0, batch_size=16)
# Draft models: the base's architecture (Mistral, W = 256, 2048 positions, its tokenizer) with 2 layers, started from
# the base (its embeddings: projected onto their top 64 principal directions for the small one; for the medium one
# also its final norm and layers 0 and 3) and distilled from it. Sized by benchmarks/draft_model_speed.py (tokens per
# target call of --drafter model against the draft model's own step cost, docs/self-distillation.md): at the base's
# width, 2 layers drafted 3.46 tokens per call, 1 layer 2.74, 2 layers of width 64 2.26, and on one CPU thread a
# forward costs per layer (Python, kernel launches) about what it costs per width, so rescorer-medium (2 x 128) is
# the fastest --drafter model; rescorer-small (2 x 64, a third of the base's multiply-adds) is the cheaper one for
# per-slot neural rescoring and for HF assisted generation, whose draft steps cost what the model's matmuls cost.
DRAFTS = {
    "rescorer-small": dict(arch=dict(n_layer=2, n_embd=64, n_head=4),
                           opt=dict(steps=600, lr=3e-3, batch_size=8, seq_len=DISTILL_SEQ, checkpoint_every=25)),
    "rescorer-medium": dict(arch=dict(n_layer=2, n_embd=128, n_head=4),
                            opt=dict(steps=400, lr=2e-3, batch_size=8, seq_len=DISTILL_SEQ, checkpoint_every=25)),
}
HEADS = {
    "heads-stern": dict(num_heads=8, kind="stern", token_input=True,
                        opt=dict(steps=600, lr=2e-3, batch_size=8, seq_len=DISTILL_SEQ, checkpoint_every=25)),
    "heads-dynamo": dict(num_heads=3, kind="dynamo", token_input=False,
                         opt=dict(steps=300, lr=1e-3, batch_size=8, seq_len=DISTILL_SEQ, checkpoint_every=20)),
}
EVAL_WINDOWS = 96  # held-out windows of 256 tokens scored in the report
LONG_WINDOWS, LONG_LEN, LONG_FROM = 16, 2048, 1536  # long-context check: tokens 1536..2047 of 2048-token windows


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def stage_tokenizer() -> None:
    out = DATA / "tokenizer"
    out.mkdir(exist_ok=True)
    t0 = time.time()
    tok = train_tokenizer(stdlib_split("train"), VOCAB)
    tmp = out / "tokenizer.json.tmp"
    tok.save(str(tmp))
    os.replace(tmp, out / "tokenizer.json")
    meta = {"vocab_size": tok.get_vocab_size(), "fingerprint": fingerprint(tok), "corpus": "stdlib:train",
            "seconds": round(time.time() - t0, 1)}
    _write_atomic(out / "build.json", json.dumps(meta, indent=1) + "\n")
    print(f"tokenizer: {meta}")


def _rel(p: Path) -> str:
    return p.relative_to(stdlib_root()).as_posix()


def stage_heldout() -> None:
    """data/heldout.txt: the held-out standard-library files (relative paths), one per line."""
    files = stdlib_split("heldout")
    _write_atomic(DATA / "heldout.txt", "".join(_rel(p) + "\n" for p in files))
    print(f"heldout: {len(files)} files")


def stage_prompts(per_file: int = 2, lo: int = 32, hi: int = 64) -> None:
    """data/prompts.jsonl: prompts of lo..hi tokens, whole lines cut from the held-out files."""
    import numpy as np

    from latticedraft.lm.corpus import read_text

    tok = load_tokenizer(DATA / "tokenizer")
    rows = []
    for f in stdlib_split("heldout"):
        lines = read_text(f).splitlines(keepends=True)
        rng = np.random.default_rng([SEED, len(rows)])
        starts = [i for i, ln in enumerate(lines) if ln.strip() and not ln.startswith((" ", "\t"))] or [0]
        used: list[range] = []
        for start in rng.permutation(starts):
            text, end = "", int(start)
            for ln in lines[start:]:
                if len(tok.encode(text + ln).ids) > hi:
                    break
                text, end = text + ln, end + 1
            n = len(tok.encode(text).ids)
            span = range(int(start), end)
            if lo <= n <= hi and not any(set(span) & set(u) for u in used):
                rows.append({"prompt": text, "file": _rel(f), "line": int(start) + 1, "tokens": n})
                used.append(span)
                if len(used) == per_file:
                    break
    _write_atomic(DATA / "prompts.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    print(f"prompts: {len(rows)} prompts of {lo}..{hi} tokens from {len({r['file'] for r in rows})} held-out files")


def _train_lm(name: str, arch: dict, opt: dict) -> None:
    from latticedraft.gpu.train.lm import LMArch, train_lm
    from latticedraft.gpu.train.loop import OptimConfig

    out = DATA / name
    resume = (out / "checkpoint.pt").is_file()
    res = train_lm(DATA / "tokenizer", stdlib_split("train"), out, LMArch(**arch), OptimConfig(seed=SEED, **opt),
                   resume=resume, force=not resume, save_dtype="float16")
    _record_float32(out)
    print(f"{name}: {res.steps} steps, {res.tokens} tokens, {res.seconds} s, final loss {res.losses}")


def _record_float32(model_dir: Path) -> None:
    """Weights stay float16 (half the size), but config.json says float32: a plain
    ``AutoModelForCausalLM.from_pretrained(model_dir)`` then loads what the CLI runs (float32), not
    emulated half precision on a CPU (slower, and not token-equal to the CLI's decode)."""
    f = model_dir / "config.json"
    cfg = json.loads(f.read_text())
    cfg["dtype"] = "float32"
    _write_atomic(f, json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def stage_base() -> None:
    _train_lm("base", BASE, BASE_OPT)


def _distill():
    from latticedraft.decoding.runs.continuations import LoopDecoder
    from latticedraft.gpu.train.continuations import ContinuationSpec
    from latticedraft.gpu.train.distill import DistillConfig

    return DistillConfig(text="continuations", loss="kl",
                         continuation=ContinuationSpec(seq_len=DISTILL_SEQ, seed=SEED, **CONT), decoder=LoopDecoder)


def _train_heads(name: str) -> None:
    from latticedraft.gpu.train.heads import train_heads
    from latticedraft.gpu.train.loop import OptimConfig

    spec = HEADS[name]
    out = DATA / name
    resume = (out / "checkpoint.pt").is_file()
    res = train_heads(DATA / "base", stdlib_split("train"), out, spec["num_heads"], spec["kind"],
                      OptimConfig(seed=SEED, **spec["opt"]), resume=resume, force=not resume, save_dtype="float16",
                      distill=_distill(), token_input=spec["token_input"])
    print(f"{name}: {res.steps} steps, {res.tokens} tokens, {res.seconds} s, final loss {res.losses}")


def _train_draft(name: str) -> None:
    from latticedraft.gpu.train.draft_model import DraftArch, train_draft_model
    from latticedraft.gpu.train.loop import OptimConfig

    spec = DRAFTS[name]
    out = DATA / name
    resume = (out / "checkpoint.pt").is_file()
    res = train_draft_model(DATA / "base", stdlib_split("train"), out, DraftArch(**spec["arch"]),
                            OptimConfig(seed=SEED, **spec["opt"]), _distill(), resume=resume, force=not resume,
                            save_dtype="float16", init="base")
    _record_float32(out)
    print(f"{name}: {res.steps} steps, {res.tokens} tokens, {res.seconds} s, final loss {res.losses}")


def stage_draft_vocab() -> None:
    """Token ids of the heads' training corpus ranked by frequency (``--draft-vocab``)."""
    from latticedraft.gpu.models.draft_vocab import write_ranked
    from latticedraft.gpu.train.data import encode_files
    from latticedraft.lm.tokenizer import load_tokenizer

    tok = load_tokenizer(DATA / "tokenizer" / "tokenizer.json")
    stream = encode_files(stdlib_split("train"), tok)
    out = write_ranked(DATA / "heads-stern", stream, tok.get_vocab_size(with_added_tokens=True), "stdlib:train")
    print(f"draft vocabulary: {len(stream)} tokens ranked into {out}")


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _dir_mb(d: Path) -> float:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) / 1e6


def stage_report() -> None:
    """Evaluate everything on the held-out files; write data/metrics.json and data/MODELS.md."""
    import platform

    import numpy as np

    from latticedraft.gpu.models.blockwise import BlockwiseModel
    from latticedraft.gpu.train.data import TokenWindows, encode_files
    from latticedraft.gpu.train.evaluate import follows_base, head_metrics, perplexity
    from latticedraft.gpu.models.hf import load_causal_lm

    tok = load_tokenizer(DATA / "tokenizer")
    held = encode_files(stdlib_split("heldout"), tok)
    windows = TokenWindows(held, 256, 1, SEED, source="held-out files").sequential()
    step = max(1, len(windows) // EVAL_WINDOWS)
    windows = windows[::step][:EVAL_WINDOWS]  # spread over all held-out files
    m = {"machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
         "heldout": {"files": len(stdlib_split("heldout")), "tokens": int(len(held)), "windows_scored": len(windows),
                     "window": 256},
         "models": {}}
    long = TokenWindows(held, LONG_LEN, 1, SEED, source="held-out files").sequential()
    long = long[:: max(1, len(long) // LONG_WINDOWS)][:LONG_WINDOWS]
    m["heldout"]["long"] = {"windows_scored": len(long), "window": LONG_LEN, "scored_from": LONG_FROM}
    base = load_causal_lm(DATA / "base")
    for name in ["base", *DRAFTS]:
        model = load_causal_lm(DATA / name)
        info = json.loads((DATA / name / "training.json").read_text())
        m["models"][name] = {"parameters": _params(model), "arch": info["arch"], "steps": info["steps"],
                             "tokens_seen": info["tokens_seen"], "seconds": info["seconds"],
                             "final_train_loss": next(iter(info["final_loss"].values())),
                             "mb": round(_dir_mb(DATA / name), 2), "heldout_ppl": round(perplexity(model, windows), 3)}
        if (getattr(model.config, "max_position_embeddings", None) or 0) >= LONG_LEN:
            m["models"][name]["heldout_ppl_long"] = round(perplexity(model, long, batch_size=2, from_position=LONG_FROM), 3)
        if name in DRAFTS:
            f = follows_base(model, base, windows)
            m["models"][name].update({"init": info["init"], "init_from_base": info.get("init_from_base", []),
                                      "self_distill": info["self_distill"],
                                      "continuation_seconds": info.get("continuation_seconds", 0.0),
                                      "heldout_kl_to_base": round(f["kl"], 4),
                                      "heldout_agreement": round(f["agreement"], 4)})
        print(name, m["models"][name])
    for name, spec in HEADS.items():
        t0 = time.time()
        bm = BlockwiseModel.from_pretrained(DATA / name)
        load_s = time.time() - t0
        info = json.loads((DATA / name / "training.json").read_text())
        hm = head_metrics(bm, windows)
        ent = np.asarray(hm.entropy)
        acc = np.asarray(hm.accuracy)
        m["models"][name] = {"kind": spec["kind"], "num_heads": spec["num_heads"],
                             "head_parameters": info["head_parameters"], "steps": info["steps"],
                             "tokens_seen": info["tokens_seen"], "seconds": info["seconds"], "lr": info["lr_heads"],
                             "final_train_loss": info["final_loss"], "mb": round(_dir_mb(DATA / name), 2),
                             "load_seconds": round(load_s, 2), "accuracy": [round(x, 4) for x in hm.accuracy],
                             "entropy": [round(x, 4) for x in hm.entropy], "nll": [round(x, 4) for x in hm.nll],
                             "positions": hm.positions, "agreement": [round(x, 4) for x in hm.agreement],
                             "token_input": bool(info.get("token_input")), "self_distill": info.get("self_distill"),
                             "continuation_seconds": info.get("continuation_seconds", 0.0),
                             "entropy_rises": bool(np.all(np.diff(ent) > 0)),
                             "accuracy_falls": bool(np.all(np.diff(acc) < 0))}
        print(name, m["models"][name])
    m["committed_mb"] = round(sum(_dir_mb(DATA / d) for d in ["tokenizer", "base", *DRAFTS, *HEADS, *SELF_DRAFT])
                              + sum((DATA / f).stat().st_size for f in ["heldout.txt", "prompts.jsonl"]) / 1e6, 2)
    _write_atomic(DATA / "metrics.json", json.dumps(m, indent=1) + "\n")
    _write_atomic(DATA / "MODELS.md", _models_md(m))
    print(f"report: data/MODELS.md, data/metrics.json ({m['committed_mb']} MB committed)")


def _breaks(xs: list[float], rising: bool) -> str:
    """Where a per-head series breaks monotonicity, in words."""
    bad = [j + 1 for j in range(len(xs) - 1) if (xs[j + 1] <= xs[j]) == rising]
    if not bad:
        return f"every step from head 1 to head {len(xs)}"
    return "except " + ", ".join(f"head {j} → {j + 1} ({xs[j - 1]:.3f} → {xs[j]:.3f})" for j in bad)


def stage_report_md() -> None:
    """Rewrite data/MODELS.md from data/metrics.json (no evaluation)."""
    m = json.loads((DATA / "metrics.json").read_text())
    _write_atomic(DATA / "MODELS.md", _models_md(m))


def _models_md(m: dict) -> str:
    tok = json.loads((DATA / "tokenizer" / "build.json").read_text())
    ms = m["models"]
    total_train = sum(v["seconds"] for v in ms.values())
    gen = max((v.get("continuation_seconds") or 0.0 for v in ms.values()), default=0.0)  # one shared cache entry
    L = ["# Bundled default models", "",
         "Generated by `bash data/build.sh` (stage `report`); do not edit by hand. Everything is trained on",
         "`stdlib:train` (this interpreter's standard library, 95% of the files) and evaluated on the",
         f"{m['heldout']['files']} held-out files listed in `heldout.txt` ({m['heldout']['tokens']} tokens; "
         f"{m['heldout']['windows_scored']} windows of {m['heldout']['window']} tokens spread over them are scored).",
         f"Machine: {m['machine']['platform']}, {m['machine']['cpu_count']} CPUs (shared with other jobs while training).", "",
         f"- Tokenizer: byte-level BPE, {tok['vocab_size']} tokens, fingerprint `{tok['fingerprint'][:16]}…`.",
         f"- Committed size: {m['committed_mb']} MB (fp16 safetensors; the configs record float32, so a plain "
         f"`from_pretrained` loads float32, as the CLI runs). Total training time: {total_train / 60:.1f} min, "
         f"plus {gen / 60:.1f} min generating the base's continuations.",
         "- Sizing: the base is 4 layers × 128 wide, trained on one torch thread (two threads on the shared",
         "  2-core CPU were 8x slower per step). The base sees ~1.6 passes over the corpus. All models are far",
         "  from converged: they are a reproducible, quickly loaded default, not good code models.",
         "- Self-distillation (`docs/self-distillation.md`): the heads and the draft models learn what the base",
         f"  says, not the corpus: the text is the base's own continuations of {CONT['prompts']} prompts of "
         f"{CONT['prompt_len']} stdlib:train tokens to {DISTILL_SEQ}",
         f"  tokens ({1 - CONT['sample_fraction']:.0%} greedy, {CONT['sample_fraction']:.0%} sampled at T = "
         f"{CONT['temperature']:g}; made by the decode loop, shared by every stage), the loss",
         "  the KL divergence to the frozen base's distribution (head j at position t: the base's distribution of",
         "  token t+j, read at t+j-1). \"Agreement with the base\" below: the fraction of held-out positions where a",
         "  head's (or draft model's) argmax is the base's own argmax for that token.",
         f"- Long context: the causal LMs are Mistral models (RoPE, SwiGLU, tied embeddings) with {BASE['n_positions']}",
         f"  positions and a sliding window of W = {WINDOW}: a token attends to the last W positions only, so",
         "  attention never spans more than W relative positions. Trained on windows of "
         f"{BASE_OPT['seq_len']} tokens (the window",
         "  really slides), they have met every relative offset they meet at 2048 positions; the long-context",
         f"  column checks it: perplexity of tokens {m['heldout'].get('long', {}).get('scored_from', LONG_FROM)}.."
         f"{LONG_LEN - 1} of {m['heldout'].get('long', {}).get('windows_scored', '?')} held-out windows of "
         f"{LONG_LEN} tokens (each token with >= {LONG_FROM} tokens of context).", "",
         "## The base (`train lm`)", "",
         "| model | architecture | layers × width | parameters | steps | tokens seen | train time | final train loss "
         "| held-out perplexity | long-context perplexity | MB |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
    v = ms["base"]
    a = v["arch"]
    fam = (f"Mistral, W = {a['sliding_window']}, {a['n_positions']} positions" if a.get("family") == "mistral"
           else f"GPT-2, {a['n_positions']} positions")
    long = f"{v['heldout_ppl_long']:.2f}" if "heldout_ppl_long" in v else "–"
    L.append(f"| `base/` | {fam} | {a['n_layer']} × {a['n_embd']} | {v['parameters'] / 1e6:.2f} M | {v['steps']} | "
             f"{v['tokens_seen'] / 1e6:.2f} M | {v['seconds'] / 60:.1f} min | {v['final_train_loss']:.3f} | "
             f"{v['heldout_ppl']:.2f} | {long} | {v['mb']:.1f} |")
    L += ["", "## Draft models (`train draft-model`: the base's architecture, fewer layers, distilled from the base)", "",
          "They draft for `--drafter model`, `--method mtad` and HF assisted generation, and rescore for `--drafter "
          "neural`. Started from the base (`--init base`: its embeddings, final norm and evenly spaced layers).", "",
          "| model | layers × width (started from the base's) | parameters | steps | tokens seen | train time | final KL (train) "
          "| held-out KL to the base | agreement with the base | held-out perplexity | long-context perplexity | MB |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in DRAFTS:
        v = ms[name]
        a = v["arch"]
        picks = [d.split("<- ")[1].split(".")[-1] for d in v.get("init_from_base", []) if "<- " in d]
        start = (f"layers {', '.join(picks)}" if picks else "embeddings") if v.get("init") == "base" else "random init"
        long = f"{v['heldout_ppl_long']:.2f}" if "heldout_ppl_long" in v else "–"
        L.append(f"| `{name}/` | {a['n_layer']} × {a['n_embd']} ({start}) | "
                 f"{v['parameters'] / 1e6:.2f} M ({v['parameters'] / ms['base']['parameters']:.2f} × base) | {v['steps']} | "
                 f"{v['tokens_seen'] / 1e6:.2f} M | {v['seconds'] / 60:.1f} min | {v['final_train_loss']:.3f} | "
                 f"{v['heldout_kl_to_base']:.3f} | {v['heldout_agreement']:.3f} | {v['heldout_ppl']:.2f} | {long} | "
                 f"{v['mb']:.1f} |")
    L += ["", "## Multi-token heads (`train heads --self-distill`, base frozen, loss Σ_h KL_h)", ""]
    for name in HEADS:
        v = ms[name]
        ti = " with token input (`--token-input`: each head reads the token after the position: the emitted one when decoding, the text's when training)" if v.get("token_input") else ""
        L += [f"### `{name}/`: {v['num_heads']} {v['kind']} heads{ti}", "",
              f"{v['head_parameters'] / 1e6:.2f} M head parameters, {v['steps']} steps, {v['tokens_seen'] / 1e6:.2f} M tokens, "
              f"{v['seconds'] / 60:.1f} min, peak LR {v['lr']}, {v['mb']:.1f} MB; loads (with the base) in {v['load_seconds']:.2f} s.", "",
              "| head j (predicts t+j) | " + " | ".join(str(j + 1) for j in range(v["num_heads"])) + " |",
              "|---|" + "---|" * v["num_heads"],
              "| agreement with the base | " + " | ".join(f"{x:.3f}" for x in v.get("agreement", [])) + " |",
              "| top-1 accuracy (corpus token) | " + " | ".join(f"{x:.3f}" for x in v["accuracy"]) + " |",
              "| mean entropy (nats) | " + " | ".join(f"{x:.3f}" for x in v["entropy"]) + " |",
              "| NLL of the corpus token (nats) | " + " | ".join(f"{x:.3f}" for x in v["nll"]) + " |", "",
              f"Entropy {'rises strictly' if v['entropy_rises'] else 'does not rise strictly'} with the head index "
              f"(the BPD paper's Figure 2 pattern: {_breaks(v['entropy'], rising=True)}); top-1 accuracy "
              f"{'falls strictly' if v['accuracy_falls'] else 'does not fall strictly'} ({_breaks(v['accuracy'], rising=False)}).",
              *([] if not v.get("token_input") else [
                  "", "Scored on corpus text with the base's greedy token as the token input (what greedy decoding "
                  "feeds), which on corpus text is often not the text's next token; on the base's own "
                  "continuations, the text decoding sees, `benchmarks/head_agreement.py` measures the agreement "
                  "and block efficiency (`benchmarks/results/head_agreement_token_input.json`)."]),
              ""]
    L += _self_draft_md()
    return "\n".join(L) + "\n"


# Self-drafting modules on the bundled base (issue 12): Kangaroo's adapter (l = 2) and PPD's early-exit heads.
SELF_DRAFT = {
    "adapter-kangaroo": dict(exit_layer=2, opt=dict(steps=200, lr=2e-3, batch_size=8, seq_len=128, checkpoint_every=25)),
    "exit-heads-ppd": dict(opt=dict(steps=150, lr=2e-3, batch_size=8, seq_len=128, checkpoint_every=25)),
}
SELF_DRAFT_EVAL = 32  # held-out windows of 128 tokens scored for the self-drafting report


def _train_early_exit(name: str) -> None:
    """Train ``name`` (SELF_DRAFT) on data/base, score it on held-out windows into NAME/report.json
    (top-1 agreement with the full model's greedy token), and rewrite MODELS.md."""
    import numpy as np
    import torch

    from latticedraft.gpu.train.data import encode_files
    from latticedraft.gpu.models.layer_split import LayerSplit
    from latticedraft.gpu.train.early_exit import adapter_loss, exit_heads_loss, train_adapter, train_exit_heads
    from latticedraft.gpu.train.loop import OptimConfig

    spec, out = SELF_DRAFT[name], DATA / name
    cfg = OptimConfig(seed=SEED, **spec["opt"])
    resume = (out / "checkpoint.pt").is_file()
    if name == "adapter-kangaroo":
        res = train_adapter(DATA / "base", stdlib_split("train"), out, spec["exit_layer"], cfg, resume=resume,
                            force=not resume, save_dtype="float16")
    else:
        res = train_exit_heads(DATA / "base", stdlib_split("train"), out, cfg, resume=resume, force=not resume,
                               save_dtype="float16")
    from latticedraft.decoding.runs.loaders import load_model

    split = LayerSplit(load_model(DATA / "base"))
    tok = load_tokenizer(DATA / "tokenizer" / "tokenizer.json")
    stream = encode_files(stdlib_split("heldout"), tok)
    starts = np.linspace(0, len(stream) - 129, SELF_DRAFT_EVAL).astype(int)
    batch = torch.as_tensor(np.stack([stream[s:s + 128] for s in starts]).astype(np.int64))
    with torch.no_grad():
        if name == "adapter-kangaroo":
            from latticedraft.gpu.models.adapter import load_adapter

            loss, parts = adapter_loss(split, load_adapter(out, split), batch)
            scores = {"heldout_soft_ce": round(loss.item(), 4), "heldout_top1_agreement": round(parts["top1"], 4)}
        else:
            from latticedraft.gpu.models.exit_heads import load_exit_heads

            heads = load_exit_heads(out, split)
            _, parts = exit_heads_loss(split, heads, batch)
            out_h = split.lm(input_ids=batch, output_hidden_states=True)
            target = out_h.logits.argmax(-1)
            agree = {j: round(float((heads(out_h.hidden_states[j], j).argmax(-1) == target).float().mean()), 4)
                     for j in range(1, split.num_layers)}
            shared = {j: round(float((split.logits(out_h.hidden_states[j]).argmax(-1) == target).float().mean()), 4)
                      for j in range(1, split.num_layers)}
            scores = {"heldout_soft_ce": {k: round(v, 4) for k, v in parts.items()},
                      "heldout_top1_agreement": agree, "heldout_top1_agreement_shared_head": shared}
    report = {"name": name, "steps": res.steps, "tokens_seen": res.tokens, "seconds": res.seconds,
              "final_train_loss": res.losses, "parameters": sum(p.numel() for p in
                                                                 (load_adapter(out, split) if name == "adapter-kangaroo"
                                                                  else heads).parameters()),
              "heldout_windows": SELF_DRAFT_EVAL, "window": 128, **scores, "opt": spec["opt"],
              **({"exit_layer": spec["exit_layer"]} if "exit_layer" in spec else {})}
    _write_atomic(out / "report.json", json.dumps(report, indent=1) + "\n")
    print(f"{name}: {res.steps} steps, {res.seconds} s, held-out {scores}")
    if (DATA / "metrics.json").is_file():
        stage_report_md()


def _self_draft_md() -> list[str]:
    """The MODELS.md section on the self-drafting modules (from NAME/report.json where built)."""
    L = []
    for name in SELF_DRAFT:
        f = DATA / name / "report.json"
        if not f.is_file():
            continue
        r = json.loads(f.read_text())
        if not L:
            L = ["## Self-drafting modules on the base (`train adapter`, `train heads --early-exit`)", ""]
        if name == "adapter-kangaroo":
            L += [f"### `{name}/`: Kangaroo adapter after layer l = {r['exit_layer']}", "",
                  f"One attention layer + two norms ({r['parameters'] / 1e6:.3f} M parameters), LM head shared; "
                  f"distilled from the full base (soft cross-entropy) for {r['steps']} steps, "
                  f"{r['tokens_seen'] / 1e6:.2f} M tokens, {r['seconds'] / 60:.1f} min. On {r['heldout_windows']} "
                  f"held-out windows of {r['window']} tokens: soft cross-entropy {r['heldout_soft_ce']:.3f} nats, "
                  f"top-1 agreement with the full model {r['heldout_top1_agreement']:.3f}.", ""]
        else:
            js = sorted(r["heldout_top1_agreement"], key=int)
            L += [f"### `{name}/`: PPD early-exit heads, one per layer", "",
                  f"{r['parameters'] / 1e6:.3f} M parameters, {r['steps']} steps, {r['tokens_seen'] / 1e6:.2f} M tokens, "
                  f"{r['seconds'] / 60:.1f} min. Top-1 agreement with the full model on {r['heldout_windows']} held-out "
                  f"windows:", "",
                  "| exit after layer | " + " | ".join(js) + " |", "|---|" + "---|" * len(js),
                  "| trained head | " + " | ".join(f"{r['heldout_top1_agreement'][j]:.3f}" for j in js) + " |",
                  "| shared LM head | " + " | ".join(f"{r['heldout_top1_agreement_shared_head'][j]:.3f}" for j in js)
                  + " |", ""]
    return L


STAGES = {"tokenizer": stage_tokenizer, "heldout": stage_heldout, "prompts": stage_prompts, "base": stage_base,
          "heads-stern": lambda: _train_heads("heads-stern"), "heads-dynamo": lambda: _train_heads("heads-dynamo"),
          "rescorer-small": lambda: _train_draft("rescorer-small"),
          "rescorer-medium": lambda: _train_draft("rescorer-medium"),
          "draft-vocab": stage_draft_vocab, "report": stage_report, "report-md": stage_report_md,
          "adapter-kangaroo": lambda: _train_early_exit("adapter-kangaroo"),
          "exit-heads-ppd": lambda: _train_early_exit("exit-heads-ppd")}


def main(argv=None) -> int:
    global DATA
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("stages", nargs="*", help=f"stages to run (default all): {' '.join(STAGES)}")
    ap.add_argument("--data", default=str(DATA), help="build into this directory instead of data/ (needs tokenizer/ there)")
    args = ap.parse_args(argv)
    DATA = Path(args.data).resolve()
    import torch

    torch.set_num_threads(1)  # see the sizing note above
    for name in args.stages or list(STAGES):
        if name not in STAGES:
            ap.error(f"unknown stage {name!r}; choose from {', '.join(STAGES)}")
        STAGES[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
