"""Benchmark lattice rescoring: the shape of the BPD paper's Tables 12 and 13 on this machine.

From numpy arrays in to ``Drafts`` out (distinct paths), both methods:

- 1-best latency for h in {4, 8, 16} x k in {2, 4, 8, 16} (Table 13);
- N-best latency, N in {1, 2, 4, 8, 16}, for 8 x 16 (Table 12);
- how often ``wfst``'s best path is worse than ``exact``'s (true back-off semantics), by how much;
- batched rescoring: 8 x 16 lattices, 4-best, batches of 32 as arrays [B,h,k] (lattices per second).

The LM is the bundled 4-gram (``.cache/lm/stdlib-4gram``, or ``--lm``). Lattices come from
held-out standard-library text: head j's distribution is an n-gram LM's next-token distribution
given the true prefix up to position t+j (the 2-gram build when present, else the 4-gram),
flattened with a per-head temperature 1 + 0.25 j and Gaussian logit noise (sd 1), then top-k.
So the true continuation is usually, not always, in the lattice, and heads grow less sure.
Latency = median over lattices of one call of ``rescore(Sausage(tokens, logp), ...)`` on a
lattice not seen before (validation included; numba compile and LM table building done once
before); the JSON also has the mean, p90 and the median of ``--repeats`` repeated (warm-cache)
calls of the same lattice. ``os.getloadavg()`` is recorded: the 2-core machine is
shared, and a loaded machine inflates every number.

    .venv/bin/python benchmarks/rescore.py [--lattices 40] [--repeats 5] [--out benchmarks/results/rescore.json]
    .venv/bin/python benchmarks/rescore.py --batch-only   # the batched rows only, printed
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from latticedraft.lattice.lm_tables import _step  # noqa: E402
from latticedraft.lattice.rescoring import rescore, rescore_batch  # noqa: E402
from latticedraft.lattice.sausage import Sausage, SausageBatch  # noqa: E402
from latticedraft.lattice.lm_tables import lm_arrays  # noqa: E402
from latticedraft.lm.corpus import read_text, stdlib_split  # noqa: E402
from latticedraft.lm.ngram import NgramLM  # noqa: E402
from latticedraft.atomic import write_atomic  # noqa: E402
from latticedraft.paths import cache_dir, default_lm_dir  # noqa: E402


@njit(cache=True)
def _next_logp(s, off, lab, cost, nxt, bon, boc, uni, V, unk, tab):
    out = np.empty(V)
    for c in range(V):
        out[c] = -_step(s, c + 1, off, lab, cost, nxt, bon, boc, uni, V, unk, tab)[1]
    return out


class LatticeMaker:
    """Simulated head lattices over held-out text (see the module docstring)."""

    def __init__(self, head_lm: NgramLM, ids: np.ndarray, seed: int = 0):
        self.fst = head_lm.fst
        self.A = lm_arrays(self.fst)
        self.ids = ids
        self.rng = np.random.default_rng(seed)
        self.n = self.fst.order - 1

    def make(self, h: int, k: int) -> tuple[Sausage, list[int], np.ndarray]:
        t = int(self.rng.integers(8, len(self.ids) - h - 1))
        logits = np.empty((h, self.A.vocab_size))
        for j in range(h):
            st = self.fst.state_for_history(self.ids[max(0, t + j - self.n):t + j].tolist())
            lp = _next_logp(st, *self.A.lm_args())
            logits[j] = lp / (1.0 + 0.25 * j) + self.rng.normal(size=lp.shape)
        return Sausage.from_logits(logits, k), self.ids[t - 8:t].tolist(), self.ids[t:t + h]


class ModelLattices:
    """Lattices from a real multi-token head model (``BlockwiseModel``, e.g. ``data/heads-stern``):
    head j's logits at position t predict token t+1+j; one forward per held-out window."""

    def __init__(self, model_dir, ids: np.ndarray, seed: int = 0, windows: int = 24, width: int = 128):
        import torch

        from latticedraft.gpu.models.blockwise import BlockwiseModel

        model = BlockwiseModel.from_pretrained(model_dir).eval()
        rng = np.random.default_rng(seed)
        self.rng = rng
        self.items = []
        with torch.no_grad():
            for _ in range(windows):
                t0 = int(rng.integers(0, len(ids) - width - 1))
                win = ids[t0:t0 + width]
                out = model(torch.as_tensor(win[None], dtype=torch.long))
                self.items.append((win, out.head_logits[0].float().numpy()))
        self.num_heads = self.items[0][1].shape[1]

    def make(self, h: int, k: int):
        win, logits = self.items[int(self.rng.integers(len(self.items)))]
        t = int(self.rng.integers(8, len(win) - h - 1))
        return Sausage.from_logits(logits[t, :h], k), win[max(0, t - 7):t + 1].tolist(), win[t + 1:t + 1 + h]


def _time(fn, repeats: int) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds of this thread) over ``repeats`` calls after one
    warm-up call. On a shared, loaded machine the CPU time is the closer estimate of the
    latency on an idle core (it excludes time spent descheduled)."""
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        c0 = time.thread_time()
        a = time.perf_counter()
        fn()
        wall.append(time.perf_counter() - a)
        cpu.append(time.thread_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def bench_batch(maker, lm, alpha: float, repeats: int, batch: int = 32, groups: int = 5) -> dict:
    """Lattices per second of ``rescore_batch`` on batches of ``batch`` 8x16 lattices, 4-best.

    The input is what a decoder with a batch of prompts has: ``tokens int64[B,8,16]``,
    ``logp float32[B,8,16]`` (top-k of the heads' logits) and one history per prompt; the timed
    call validates them (``SausageBatch``) and returns a list of ``Drafts``. Each batch is timed
    ``repeats`` times after one warm-up call; rates are medians over ``groups`` batches, per
    wall second and per CPU second (all threads: ``process_time``), with all threads and with
    one. The list-of-``Sausage`` input form is measured too. ``os.getloadavg()`` before and after.
    """
    load0 = os.getloadavg()
    sets = [[maker.make(8, 16) for _ in range(batch)] for _ in range(groups)]
    forms = {"arrays": lambda T, L, hs, w: rescore_batch(SausageBatch(T, L), lm, alpha, 4, hs, workers=w),
             "sausages": lambda T, L, hs, w: rescore_batch([Sausage(t, lp) for t, lp in zip(T, L)], lm, alpha, 4, hs,
                                                           workers=w)}
    rates = {}
    for form, call in forms.items():
        for w in (os.cpu_count(), 1):
            wall, cpu = [], []
            for group in sets:
                T = np.stack([g[0].tokens for g in group])
                L = np.stack([g[0].logp for g in group])
                hs = [g[1] for g in group]
                c0 = time.process_time()
                dt, _ = _time(lambda: call(T, L, hs, w), repeats)
                wall.append(batch / dt)
                cpu.append(batch * (repeats + 1) / (time.process_time() - c0))  # warm-up call included
            rates[(form, w)] = (statistics.median(wall), statistics.median(cpu))
    n = os.cpu_count()
    return {"batch": batch, "h": 8, "k": 16, "nbest": 4, "threads": n, "input": "SausageBatch(tokens, logp)",
            "lattices_per_s": rates[("arrays", n)][0], "lattices_per_cpu_s": rates[("arrays", n)][1],
            "one_thread_lattices_per_s": rates[("arrays", 1)][0],
            "one_thread_lattices_per_cpu_s": rates[("arrays", 1)][1],
            "sausage_list": {"lattices_per_s": rates[("sausages", n)][0],
                             "lattices_per_cpu_s": rates[("sausages", n)][1],
                             "one_thread_lattices_per_s": rates[("sausages", 1)][0],
                             "one_thread_lattices_per_cpu_s": rates[("sausages", 1)][1]},
            "loadavg_before": load0, "loadavg_after": os.getloadavg()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lm", default=str(default_lm_dir()), help="rescoring LM build (default: the bundled 4-gram)")
    ap.add_argument("--head-lm", default=None, help="LM that simulates the heads (default: stdlib-2gram if built)")
    ap.add_argument("--lattices", type=int, default=40, help="lattices per configuration (default 40)")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per lattice (default 5)")
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--gap-lattices", type=int, default=300, help="8x16 lattices for the wfst-vs-exact comparison")
    ap.add_argument("--model", default=str(ROOT / "data" / "heads-stern"),
                    help="multi-token head model for real 8-slot lattices (skipped if absent)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rescore.json"))
    ap.add_argument("--batch-only", action="store_true", help="only the batched measurement, printed (no JSON)")
    from latticedraft.quiet import add_verbose_arg, quiet_libraries

    add_verbose_arg(ap)
    a = ap.parse_args(argv)
    quiet_libraries(a.verbose)

    lm = NgramLM.load(a.lm)
    head_dir = a.head_lm or (cache_dir() / "lm" / "stdlib-2gram")
    head_lm = NgramLM.load(head_dir) if Path(head_dir, "manifest.json").is_file() else lm
    tok = lm.tokenizer
    ids = np.concatenate([np.array(tok.encode(read_text(f, "replace")).ids, dtype=np.int64)
                          for f in stdlib_split("heldout")[:30]])
    maker = LatticeMaker(head_lm, ids)
    t0 = time.perf_counter()
    lm_arrays(lm.fst)
    setup_s = time.perf_counter() - t0
    warm = maker.make(4, 4)
    for m in ("exact", "wfst"):
        rescore(warm[0], lm, a.alpha, 2, warm[1], m)

    if a.batch_only:
        print(json.dumps(bench_batch(maker, lm, a.alpha, a.repeats), indent=2))
        return 0

    def bench(h, k, p):
        """Per lattice: the first call (fresh: the LM rows it needs are not yet in cache, as for
        a new lattice in a decode loop) and the median of ``repeats`` further calls (warm)."""
        res = {"h": h, "k": k, "nbest": p}
        for m in ("exact", "wfst"):
            fw, fc, ww, wc = [], [], [], []
            for _ in range(a.lattices):
                s, hist, _ = maker.make(h, k)
                tok, lp = s.tokens, s.logp  # numpy arrays in (validated into a Sausage), Drafts out
                c0 = time.thread_time()
                t0 = time.perf_counter()
                rescore(Sausage(tok, lp), lm, a.alpha, p, hist, m)
                fw.append(time.perf_counter() - t0)
                fc.append(time.thread_time() - c0)
                w, c = _time(lambda: rescore(Sausage(tok, lp), lm, a.alpha, p, hist, m), a.repeats)
                ww.append(w)
                wc.append(c)
            ms = lambda xs: 1e3 * statistics.median(xs)  # noqa: E731
            res[m] = {"median_ms": ms(fw), "cpu_median_ms": ms(fc), "mean_ms": 1e3 * statistics.fmean(fw),
                      "p90_ms": 1e3 * float(np.percentile(fw, 90)), "max_ms": 1e3 * max(fw),
                      "warm_median_ms": ms(ww), "warm_cpu_median_ms": ms(wc)}
        return res

    table13 = [bench(h, k, 1) for h in (4, 8, 16) for k in (2, 4, 8, 16)]
    table12 = [bench(8, 16, n) for n in (1, 2, 4, 8, 16)]

    def wfst_gap(make, n):
        worse, gaps = 0, []
        for _ in range(n):
            s, hist, _ = make(8, 16)
            e = rescore(s, lm, a.alpha, 1, hist, "exact")
            w = rescore(s, lm, a.alpha, 1, hist, "wfst")
            state = lm.fst.state_for_history(hist[-(lm.order - 1):])
            cand = np.array([int(np.nonzero(s.tokens[i] == t)[0][0]) for i, t in enumerate(w.tokens[0])])
            true_w = s.path_logp(cand) - a.alpha * lm.fst.exact_cost(state, w.tokens[0].tolist())[0]
            gap = float(e.scores[0]) - true_w
            if gap > 1e-3:
                worse += 1
                gaps.append(gap)
        return {"lattices": n, "wfst_worse": worse, "fraction": worse / n,
                "median_gap_nats": statistics.median(gaps) if gaps else 0.0, "max_gap_nats": max(gaps, default=0.0)}

    wfst_gap_sim = wfst_gap(maker.make, a.gap_lattices)
    real = None
    if Path(a.model, "heads_config.json").is_file():
        real_maker = ModelLattices(a.model, ids)
        saved = maker.make
        maker.make = real_maker.make  # the same measurements on real head lattices (8 heads)
        real = {"model": a.model, "heads": real_maker.num_heads,
                "nbest_8x16": [bench(8, 16, n) for n in (1, 4, 16)],
                "wfst_vs_exact_8x16": wfst_gap(real_maker.make, a.gap_lattices)}
        maker.make = saved

    batched = bench_batch(maker, lm, a.alpha, a.repeats)

    result = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "processor": platform.processor(), "loadavg_end": os.getloadavg()},
        "lm": str(a.lm), "lm_order": lm.order, "head_lm": str(head_dir if head_lm is not lm else a.lm),
        "alpha": a.alpha, "lattices": a.lattices, "repeats": a.repeats, "table_setup_s": setup_s,
        "table13_1best": table13, "table12_nbest_8x16": table12, "wfst_vs_exact_8x16": wfst_gap_sim,
        "real_heads": real,
        "batched": batched,
        "paper_ms": {"8x16_1best": 1.63, "8x16_16best": 1.98, "16x16_1best": 2.17},
    }
    write_atomic(Path(a.out), json.dumps(result, indent=2))

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()}")
    print("latency, ms: median over lattices; fresh = first call on a new lattice (wall / CPU),"
          " warm = repeated call (CPU)")
    print("                     exact: fresh wall / CPU    warm |  wfst: fresh wall / CPU    warm")
    for title, rows in (("1-best", table13), ("8x16 N-best", table12)):
        print(f"  {title}")
        for r in rows:
            e, w = r["exact"], r["wfst"]
            name = f"h={r['h']:2d} k={r['k']:2d} N={r['nbest']:2d}"
            print(f"    {name}   {e['median_ms']:8.3f} /{e['cpu_median_ms']:7.3f} {e['warm_cpu_median_ms']:7.3f} |"
                  f"   {w['median_ms']:8.3f} /{w['cpu_median_ms']:7.3f} {w['warm_cpu_median_ms']:7.3f}")
    g = wfst_gap_sim
    print(f"wfst best worse than exact (simulated heads): {g['wfst_worse']}/{g['lattices']} "
          f"({100 * g['fraction']:.1f}%), median gap {g['median_gap_nats']:.3f} nats, max {g['max_gap_nats']:.3f}")
    if real:
        print(f"real heads ({real['model']}, {real['heads']} heads), 8x16:")
        for r in real["nbest_8x16"]:
            e, w = r["exact"], r["wfst"]
            print(f"    N={r['nbest']:2d}   exact {e['median_ms']:7.3f} /{e['cpu_median_ms']:7.3f} "
                  f"{e['warm_cpu_median_ms']:7.3f} |   wfst {w['median_ms']:7.3f} /{w['cpu_median_ms']:7.3f} "
                  f"{w['warm_cpu_median_ms']:7.3f}")
        g = real["wfst_vs_exact_8x16"]
        print(f"  wfst best worse than exact: {g['wfst_worse']}/{g['lattices']} ({100 * g['fraction']:.1f}%), "
              f"median gap {g['median_gap_nats']:.3f} nats, max {g['max_gap_nats']:.3f}")
    b = batched
    print(f"batched 8x16 4-best, batch {b['batch']} (SausageBatch in): {b['lattices_per_s']:.0f} lattices/s wall "
          f"({b['lattices_per_cpu_s']:.0f} per CPU-second) on {b['threads']} threads; one thread: "
          f"{b['one_thread_lattices_per_s']:.0f}/s wall, {b['one_thread_lattices_per_cpu_s']:.0f} per CPU-second; "
          f"load {b['loadavg_before'][0]:.2f} -> {b['loadavg_after'][0]:.2f}")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
