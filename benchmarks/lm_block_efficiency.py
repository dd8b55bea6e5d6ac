"""Does a bigger n-gram LM help? Block efficiency of n-gram lattice rescoring, one row per LM.

For each LM build (``--lms LABEL=DIR ...``; default: the bundled 4-gram plus whichever of
``--root``/{o4,o4p,o5,o5p,o6,o6p} are complete, i.e. have ``manifest.json`` and
``tables/meta.json``; ``benchmarks/lm_scale.py`` builds them), decode the same held-out prompts
with the two n-gram drafters of ``latticedraft eval``'s Table 4, as ``evaluate`` builds them
(the paper's drafters as published: top-16 lattice of every head, no pruning, fixed tree, full
vocabulary, no context n-grams):

- ``ngram``: the 1-best path of the lattice rescored with ``head_logp + alpha * lm_logp``
  (Table 4's "4-gram" column);
- ``parallel``: the 16 best such paths, verified together (Table 4's "Parallel 4-gram BPD").

Both use one alpha for every LM: the bundled heads' tuned ``ngram`` alpha
(``data/heads-stern/tuned.json``, read as ``latticedraft demo`` reads it), or ``--alpha``.
The LM-free drafters (``top1`` = vanilla BPD, ``parallel-base`` = the 16 best un-rescored
paths) run once as the baseline row. Block efficiency = generated tokens / target calls over
all prompts (prefill included), as ``latticedraft eval`` counts it; every run goes through
``evaluate``'s own run function, which checks each output token for token against plain greedy
decoding (computed once, shared by every LM).

Per LM the table also gives the corpus size, the build's "sentence" unit (``lm build
--sentences``) and how many of the vocabulary's newline-holding tokens have no 1-gram in its
ARPA. A ``lines`` build of code (KenLM's one sentence per line: ``--sentences lines``, or the
default before it followed the corpus's bytes) never sees a newline: those tokens cost the
unseen-id cost (1000 nats), so rescoring turns away every draft that crosses a line end,
whatever the LM's size.

Held-out prompts: ``data/prompts.jsonl`` without the split the alpha was tuned on (``skip`` and
``prompts`` of ``tuned.json``: ``latticedraft tune`` evaluates "on the remaining prompts"),
then ``--skip`` / ``--num-prompts`` of what is left; the indices used are in the JSON. One
process, one torch thread (``--threads``), the LMs one after another (each is loaded, its
search kernels warmed, then dropped). Block efficiency does not depend on the machine's load;
the tokens/s and LM load times in the JSON do (``os.getloadavg()`` is recorded).

    nice -n 5 .venv/bin/python benchmarks/lm_block_efficiency.py --root /work/biglm2
    .venv/bin/python benchmarks/lm_block_efficiency.py --lms bundled=default --num-prompts 2 --max-new-tokens 8 \\
        --out /tmp/lmbe.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from latticedraft.atomic import write_atomic  # noqa: E402
from latticedraft.decoding.eval.evaluate import EvalConfig, _run, machine  # noqa: E402
from latticedraft.decoding.runs.prompt_length import fit_prompts  # noqa: E402
from latticedraft.decoding.methods.bpd import DrafterSpec
from latticedraft.decoding.runs.session import Session
from latticedraft.decoding.runs.loaders import encode
from latticedraft.decoding.runs.prompt_set import read_prompts  # noqa: E402
from latticedraft.decoding.eval.tune import default_alphas_file, read_alphas  # noqa: E402
from latticedraft.paths import data_dir, default_lm_dir  # noqa: E402

CONFIGS = ("o4", "o4p", "o5", "o5p", "o6", "o6p")


def complete(d: Path) -> bool:
    """A finished build: ``lm build`` writes the manifest, then the search tables' ``meta.json``."""
    return (d / "manifest.json").is_file() and (d / "tables" / "meta.json").is_file()


def default_lms(root: Path | None) -> dict[str, Path]:
    lms = {"bundled": default_lm_dir()}
    if root is not None:
        lms.update({c: root / c for c in CONFIGS if complete(root / c)})
    return lms


def parse_lms(items: list[str]) -> dict[str, Path]:
    out = {}
    for it in items:
        label, sep, path = it.partition("=")
        if not sep or not label or not path:
            raise SystemExit(f"--lms {it!r}: use LABEL=DIR (DIR 'default' = the bundled 4-gram)")
        out[label] = default_lm_dir() if path == "default" else Path(path)
    return out


def arpa_unigrams(arpa: Path) -> set[int]:
    """The token ids with a 1-gram in ``arpa`` (its ``\\1-grams:`` section only)."""
    ids, inside = set(), False
    with open(arpa, encoding="utf-8") as f:
        for line in f:
            if line.startswith("\\1-grams:"):
                inside = True
            elif inside and line.startswith("\\"):
                break
            elif inside and line.strip():
                word = line.split("\t")[1]
                if word.isdigit():
                    ids.add(int(word))
    return ids


def lm_info(d: Path, tokenizer=None) -> dict:
    """Order, n-gram counts and corpus of a build (its manifest); with ``tokenizer`` and an
    ``lm.arpa``, how many vocabulary ids (and ids whose text holds a newline) the corpus never
    had: those cost the build's unseen-id cost (1000 nats), so a draft through one loses."""
    m = json.loads((d / "manifest.json").read_text())
    lm, corpus = m.get("lmplz") or {}, m.get("corpus") or {}
    out = {"dir": str(d), "order": m["order"], "ngram_counts": m["ngram_counts"],
           "ngrams_total": sum(m["ngram_counts"]), "prune": lm.get("prune"), "corpus_tokens": corpus.get("tokens"),
           "sentences": corpus.get("sentences"), "unk_cost": (m.get("unk") or {}).get("cost")}
    if tokenizer is not None and (d / "lm.arpa").is_file():
        seen = arpa_unigrams(d / "lm.arpa")
        V = tokenizer.get_vocab_size()
        newline = [i for i in range(V) if "\n" in tokenizer.decode([i])]
        out["unseen_ids"] = sum(i not in seen for i in range(V))
        out["newline_ids"] = len(newline)
        out["unseen_newline_ids"] = sum(i not in seen for i in newline)
    return out


def tuning_split(alphas_file: Path | None) -> tuple[int, int] | None:
    """[start, end) of the prompts the bundled alpha was tuned on (None: no tuned.json)."""
    if alphas_file is None:
        return None
    d = json.loads(Path(alphas_file).read_text())
    return int(d.get("skip", 0)), int(d.get("skip", 0)) + int(d["prompts"])


def heldout_indices(n_prompts: int, split, skip: int, num: int | None) -> list[int]:
    idx = [i for i in range(n_prompts) if split is None or not split[0] <= i < split[1]]
    idx = idx[skip:] if num is None else idx[skip:skip + num]
    if not idx:
        raise SystemExit(f"no held-out prompts left (of {n_prompts}, tuning split {split}, --skip {skip})")
    return idx


def drafter_specs(cfg: EvalConfig, alpha: float) -> dict[str, DrafterSpec]:
    """Table 4's specs, as ``evaluate`` builds them from an ``EvalConfig``."""
    base = DrafterSpec("top1", k=cfg.k, nbest=cfg.nbest, prune=cfg.prune, eps=cfg.eps, backoff=cfg.backoff)
    return {"top1": base, "parallel-base": replace(base, name="parallel-base", nbest=cfg.nbest),
            "ngram": replace(base, name="ngram", alpha=alpha),
            "parallel": replace(base, name="parallel", alpha=alpha, nbest=cfg.nbest)}


def measure(lms: dict[str, Path], cfg: EvalConfig, alpha: float, prompt_idx: list[int], prompts: list[dict],
            threads: int | None, model=None, notify=print) -> dict:
    """Greedy once, the LM-free baselines once, then ``ngram`` and ``parallel`` per LM."""
    specs = drafter_specs(cfg, alpha)
    session = Session(model, threads=threads)
    ids = fit_prompts(session.model, encode(session.tokenizer, [prompts[i]["prompt"] for i in prompt_idx]),
                      cfg.max_new_tokens, cfg.truncate_left)
    greedy, res = _run(session, "greedy", ids, None, "greedy", None, cfg)
    refs = [s.tokens for s in res.sequences]
    runs = {"greedy": asdict(greedy)}
    for name in ("top1", "parallel-base"):
        session.prepare("bpd", specs[name], cfg.batch_size)
        run, _ = _run(session, name, ids, refs, "bpd", specs[name], cfg)
        runs[name] = asdict(run)
        notify(f"  {name}: block efficiency {run.block_efficiency:.4f}, exact {run.exact}")
    rows = {}
    for label, d in lms.items():
        notify(f"{label}: {d}")
        row = {**lm_info(d, session.tokenizer), "runs": {}}
        s = Session(model, lm_dir=d, threads=threads)
        t0 = time.perf_counter()
        _ = s.lm
        row["load_s"] = round(time.perf_counter() - t0, 3)
        for name in ("ngram", "parallel"):
            t0 = time.perf_counter()
            s.prepare("bpd", specs[name], cfg.batch_size)  # LM arrays, search kernels
            s.decode(ids[:1], "bpd", specs[name], max_new_tokens=4)  # first-call costs, untimed
            row.setdefault("prepare_s", {})[name] = round(time.perf_counter() - t0, 3)
            run, _ = _run(s, name, ids, refs, "bpd", specs[name], cfg)
            row["runs"][name] = asdict(run)
            notify(f"  {name}: block efficiency {run.block_efficiency:.4f}, exact {run.exact}, "
                   f"{run.tokens_per_s:.1f} tokens/s")
        rows[label] = row
        del s
        gc.collect()
    return {"baseline": runs, "lms": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lms", nargs="+", default=None, metavar="LABEL=DIR",
                    help="LM builds (default: bundled + the complete builds under --root)")
    ap.add_argument("--root", type=Path, default=None,
                    help="where the big builds live (benchmarks/lm_scale.py --root; default: none)")
    ap.add_argument("--model", default=None, help="BPD head checkpoint (default data/heads-stern)")
    ap.add_argument("--prompts", type=Path, default=data_dir() / "prompts.jsonl")
    ap.add_argument("--num-prompts", type=int, default=None, help="held-out prompts (default: all)")
    ap.add_argument("--skip", type=int, default=0, help="skip the first N held-out prompts (default 0)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--alpha", type=float, default=None,
                    help="LM weight for every LM (default: the bundled heads' tuned ngram alpha)")
    ap.add_argument("--batch-size", type=int, default=EvalConfig.batch_size)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "lm_block_efficiency.json")
    from latticedraft.quiet import add_verbose_arg, quiet_libraries

    add_verbose_arg(ap)
    a = ap.parse_args(argv)
    quiet_libraries(a.verbose)

    lms = parse_lms(a.lms) if a.lms else default_lms(a.root)
    for label, d in lms.items():
        if not complete(d):
            raise SystemExit(f"LM {label}: {d} is not a complete build (no manifest.json or tables/meta.json); "
                             "wait for `lm build` to finish, or run `latticedraft lm index DIR`")
    alphas_file = default_alphas_file(a.model)
    if a.alpha is not None:
        alpha, alpha_from = a.alpha, "--alpha"
    elif alphas_file is not None:
        alpha, alpha_from = read_alphas(alphas_file)["ngram"], str(alphas_file)
    else:
        alpha, alpha_from = 1.0, "untuned default (no tuned.json beside the model)"
    prompts = read_prompts(a.prompts)
    split = tuning_split(alphas_file)
    idx = heldout_indices(len(prompts), split, a.skip, a.num_prompts)
    cfg = EvalConfig(num_prompts=len(idx), max_new_tokens=a.max_new_tokens, batch_size=a.batch_size,
                     alphas={"ngram": alpha})
    cfg.validate()

    load0 = os.getloadavg()
    t0 = time.perf_counter()
    res = measure(lms, cfg, alpha, idx, prompts, a.threads, a.model, notify=lambda m: print(m, file=sys.stderr))
    exact = all(r["exact"] for r in res["baseline"].values()) and all(
        r["exact"] for row in res["lms"].values() for r in row["runs"].values())
    doc = {"machine": {**machine(), "platform": platform.platform(), "loadavg_before": load0,
                       "loadavg_after": os.getloadavg()},
           "settings": {"model": a.model or "data/heads-stern", "prompts_file": str(a.prompts),
                        "prompt_indices": idx, "tuning_split": split, "max_new_tokens": cfg.max_new_tokens,
                        "k": cfg.k, "nbest_parallel": cfg.nbest, "prune": cfg.prune, "tree": "fixed",
                        "alpha": alpha, "alpha_from": alpha_from, "batch_size": cfg.batch_size,
                        "threads": a.threads, "verify": cfg.verify},
           "seconds": round(time.perf_counter() - t0, 2), "all_exact": exact, **res}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(a.out, json.dumps(doc, indent=1) + "\n")
    print(table(doc))
    return 0


def table(doc: dict) -> str:
    s, b = doc["settings"], doc["baseline"]
    yes = lambda runs: "yes" if all(r["exact"] for r in runs) else "NO"  # noqa: E731
    lines = ["| LM | order | n-grams | corpus tokens | sentences | newline ids unseen | block efficiency ngram "
             f"(p=1) | block efficiency parallel (p={s['nbest_parallel']}) | exact vs greedy |",
             "|---|---:|---:|---:|---|---:|---:|---:|---|",
             f"| none (heads only: top1 / parallel-base) | - | - | - | - | - | {b['top1']['block_efficiency']:.3f} | "
             f"{b['parallel-base']['block_efficiency']:.3f} | {yes([b['top1'], b['parallel-base']])} |"]
    for label, r in doc["lms"].items():
        ng, par = r["runs"]["ngram"], r["runs"]["parallel"]
        toks = f"{r['corpus_tokens'] / 1e6:.1f} M" if r.get("corpus_tokens") else "-"
        nl = f"{r['unseen_newline_ids']} of {r['newline_ids']}" if "newline_ids" in r else "-"
        lines.append(f"| {label} | {r['order']} | {r['ngrams_total'] / 1e6:.1f} M | {toks} | "
                     f"{r.get('sentences') or 'not recorded'} | {nl} | {ng['block_efficiency']:.3f} | "
                     f"{par['block_efficiency']:.3f} | {yes([ng, par])} |")
    m = doc["machine"]
    return "\n".join(lines) + (
        f"\n\n{len(s['prompt_indices'])} held-out prompts x {s['max_new_tokens']} tokens, alpha {s['alpha']} "
        f"({s['alpha_from']}), k {s['k']}; all outputs equal greedy: {'yes' if doc['all_exact'] else 'NO'}; "
        f"load average {m['loadavg_before'][0]:.2f} before, {m['loadavg_after'][0]:.2f} after, "
        f"{m['cpu_count']} CPUs; {doc['seconds']:.0f} s")


if __name__ == "__main__":
    raise SystemExit(main())
