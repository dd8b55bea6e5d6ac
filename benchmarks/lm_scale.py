"""N-gram LMs at the paper's scale: builds of order 4/5/6, unpruned and pruned, on a real corpus.

For each configuration (``--configs``, e.g. ``o5`` = order 5 unpruned, ``o5p`` = order 5 with
``--prune 0 0 1 1 1``), under ``--root``: build it if missing (``latticedraft lm build`` in a
subprocess: wall time and the peak RSS of its largest process, kept in ``DIR/lm_scale_build.json``;
an older build without ``tables/`` is indexed, timed), then report

- n-grams per order, files on disk (ARPA, KenLM trie ``lm.bin``, ``lm.fst``, ``lm.npz``, ``tables/``),
  the tables' bytes against the KenLM trie of the same ARPA;
- process start to first exact rescore (a fresh interpreter: imports, ``NgramLM.load``, the
  mapped tables, numba's cached kernels, one 8x16 rescore) and that process's peak RSS;
- exact rescoring latency on held-out lattices (``benchmarks/rescore.py``'s simulated heads):
  8x16 1-best and 16-best, 16x16 1-best (median and mean of first calls on fresh lattices, the
  same lattices for every configuration), in a run (the LM alone in a fresh process, its
  lattices back to back after a warm-up: ``in_run``) and cold (all LMs in one process,
  interleaved lattice by lattice: ``cold``); batch 32 of 8x16 4-best (lattices per second, in
  a run);
- held-out perplexity on the held-out standard-library files (KenLM's ``lm.bin``, which the
  tables equal: ``tests/lm/test_search_tables.py``), sentences as the build made them.

The full run (``--corpus`` the shared venv's site-packages, 74 M tokens) takes tens of minutes
per build on this 2-core machine; ``--slice-mb`` builds on the first N MB of the corpus instead
(``tests/benchmarks/test_lm_scale.py`` runs a small slice of the same code path).

    .venv/bin/python benchmarks/lm_scale.py --root /work/biglm2   # o4 o5 o6 o4p o5p o6p bundled
    .venv/bin/python benchmarks/lm_scale.py --root /tmp/s --configs o5 --slice-mb 5 --out /tmp/s.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from latticedraft.lattice import Sausage, SausageBatch, rescore, rescore_batch  # noqa: E402
from latticedraft.lm.corpus import iter_sentences, read_text, stdlib_split  # noqa: E402
from latticedraft.lm.ngram import NgramLM, ensure_tables  # noqa: E402
from latticedraft.paths import default_lm_dir  # noqa: E402

PRUNE = [0, 0, 1, 1, 1, 1]
FIRST_RESCORE = r"""
import time; t0 = time.perf_counter()
import sys, numpy as np
from latticedraft.lm.ngram import NgramLM
from latticedraft.lattice import Sausage, rescore
lm = NgramLM.load(sys.argv[1]); lm.fst
t_map = time.perf_counter()
rng = np.random.default_rng(0)
s = Sausage.from_logits(rng.normal(size=(8, lm.vocab_size)) * 3.0, 16)
rescore(s, lm, 1.0, 1, history=[11, 12, 13, 14, 15])
t1 = time.perf_counter()
hwm = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
print(t1 - t0, hwm * 1024, t_map - t0)
"""


def parse_config(name: str) -> tuple[int, list[int] | None]:
    if not (name.startswith("o") and name[1:2].isdigit() and name[2:] in ("", "p")):
        raise SystemExit(f"config {name!r}: use o<order>, o<order>p (pruned) or bundled, e.g. o5 o5p bundled")
    order = int(name[1])
    return order, (PRUNE[:order] if name.endswith("p") else None)


def corpus_slice(corpus: Path, mb: float, dest: Path) -> Path:
    """The first ``mb`` MB of ``.py`` files under ``corpus`` (sorted paths), copied to ``dest``."""
    if dest.is_dir():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    size = 0
    for i, f in enumerate(sorted(corpus.rglob("*.py"))):
        if size >= mb * 1e6:
            break
        if f.is_file():
            shutil.copy(f, tmp / f"{i:06d}_{f.name}")
            size += f.stat().st_size
    os.replace(tmp, dest)
    return dest


def build_once(d: Path, order: int, prune, corpus: Path, tokenizer: str, memory: str) -> dict:
    """Build ``d`` unless it holds a build; the build's wall time and peak RSS (largest process)."""
    rec = d / "lm_scale_build.json"
    if (d / "manifest.json").is_file():
        info = json.loads(rec.read_text()) if rec.is_file() else {"wall_s": None, "peak_rss_bytes": None}
        if not (d / "tables" / "meta.json").is_file():
            t0 = time.perf_counter()
            ensure_tables(d, notice=False)
            info["index_s"] = time.perf_counter() - t0
        return info
    cmd = [sys.executable, "-m", "latticedraft", "lm", "build", "--corpus", str(corpus), "--tokenizer", tokenizer,
           "--order", str(order), "--memory", memory, "--encoding-errors", "replace", "--out", str(d)]
    if prune:
        cmd += ["--prune", *map(str, prune)]
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=err, text=True)
        tree_peak = 0
        while proc.poll() is None:  # build_binary runs beside the WFST conversion: sum the tree
            tree_peak = max(tree_peak, tree_rss(proc.pid))
            time.sleep(0.25)
        wall = time.perf_counter() - t0
        err.seek(0)
        stderr = err.read()
    if proc.returncode != 0:
        raise SystemExit(f"build of {d} failed:\n{stderr[-2000:]}")
    info = {"wall_s": wall, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
            "peak_tree_rss_bytes": tree_peak, "stages": stderr.splitlines(),
            "note": "peak_rss_bytes: the largest process of this and earlier builds; peak_tree_rss_bytes: the "
                    "build's processes together, sampled every 0.25 s"}
    rec.write_text(json.dumps(info, indent=2) + "\n")
    return info


def cpu_caches() -> dict:
    """The CPU model and its last-level cache: a search over gigabyte tables runs about twice as
    fast on a host whose cache holds a good part of them (same VM type, another host)."""
    out = {}
    try:
        out["cpu"] = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
        idx = sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"))[-1]
        out["llc"] = f"L{(idx / 'level').read_text().strip()} {(idx / 'size').read_text().strip()}"
    except (OSError, StopIteration, IndexError):
        pass
    return out


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants now (0 once it is gone)."""
    total, todo = 0, [pid]
    while todo:
        q = todo.pop()
        try:
            total += int(next(l for l in open(f"/proc/{q}/status") if l.startswith("VmRSS")).split()[1]) * 1024
            for task in os.listdir(f"/proc/{q}/task"):
                todo += [int(c) for c in open(f"/proc/{q}/task/{task}/children").read().split()]
        except (OSError, StopIteration, ValueError):
            pass
    return total


def disk(d: Path) -> dict:
    out = {p: (d / p).stat().st_size for p in ("lm.arpa", "lm.bin", "lm.fst", "lm.npz") if (d / p).is_file()}
    out["tables"] = sum(p.stat().st_size for p in (d / "tables").glob("*"))
    return out


def first_rescore(d: Path, runs: int = 3) -> dict:
    """Fresh interpreters: seconds from start to the first exact rescore, and peak RSS."""
    res = []
    for _ in range(runs):
        r = subprocess.run([sys.executable, "-c", FIRST_RESCORE, str(d)], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        if r.returncode != 0:
            raise SystemExit(f"first rescore with {d} failed:\n{r.stderr[-2000:]}")
        s, rss, t_map = r.stdout.split()
        res.append((float(s), int(rss), float(t_map)))
    return {"median_s": statistics.median(x[0] for x in res), "peak_rss_bytes": max(x[1] for x in res),
            "runs": [x[0] for x in res], "to_tables_mapped_median_s": statistics.median(x[2] for x in res),
            "note": "the rest is numba loading its cached kernels (it imports scipy.linalg) and the first call"}


def heldout_perplexity(d: Path, lm: NgramLM, max_files: int) -> dict:
    """Perplexity per token (``</s>`` included) of the held-out standard-library files, without
    the ids the corpus never had (KenLM's "excluding OOVs": they cost the build's 1000-nat
    ``<unk>``, which would swamp the mean); how many there were is reported."""
    import kenlm

    model = kenlm.Model(str(d / "lm.bin"))
    unit = lm.manifest["corpus"].get("sentences") or "paragraphs"  # older manifests: .py corpora were paragraphs
    total, n, oov = 0.0, 0, 0
    for f in stdlib_split("heldout")[:max_files]:
        for sent in iter_sentences(read_text(f, "replace"), unit):
            ids = lm.tokenizer.encode(sent, add_special_tokens=False).ids
            if ids:
                for logp10, _, is_oov in model.full_scores(" ".join(map(str, ids)), bos=True, eos=True):
                    if is_oov:
                        oov += 1
                    else:
                        total += logp10 * math.log(10.0)
                        n += 1
    return {"tokens": n, "oov": oov, "perplexity": math.exp(-total / n),
            "files": min(max_files, len(stdlib_split("heldout")))}


CASES = {"8x16_1best": (8, 16, 1), "8x16_16best": (8, 16, 16), "16x16_1best": (16, 16, 1)}


def _timed(lm, lat, p) -> tuple[float, float]:
    s, hist, _ = lat
    c0 = time.thread_time()
    t0 = time.perf_counter()
    rescore(Sausage(s.tokens, s.logp), lm, 1.0, p, hist)
    return time.perf_counter() - t0, time.thread_time() - c0


def lattice_maker():
    """``benchmarks/rescore.py``'s simulated-head lattices over held-out standard-library text
    (seed 0: every process that makes the same calls gets the same lattices)."""
    from rescore import LatticeMaker

    base = NgramLM.load(default_lm_dir())
    ids = np.concatenate([np.array(base.tokenizer.encode(read_text(f, "replace")).ids, dtype=np.int64)
                          for f in stdlib_split("heldout")[:30]])
    return LatticeMaker(base, ids)


def lattice_sets(maker, lattices: int, warm: int, rounds: int):
    """``(cases, warmup, batches)``: per case and round ``lattices`` fresh lattices, ``warm``
    warm-up lattices, per round the batches of 32."""
    cases = {c: [[maker.make(h, k) for _ in range(lattices)] for _ in range(rounds)] for c, (h, k, _) in CASES.items()}
    warmup = [maker.make(8, 16) for _ in range(warm)]
    batches = [[[maker.make(8, 16) for _ in range(32)] for _ in range(max(3, lattices // 10))] for _ in range(rounds)]
    return cases, warmup, batches


def in_run(lm, sets) -> dict:
    """*In a run* (the headline), with the LM alone in this process as in a decoding run: after
    the warm-up (which maps the table pages a search keeps touching), per case the median and
    mean ms of the first call on each fresh lattice, and batch 32 of 8x16 4-best in lattices per
    second (median over batches)."""
    cases, warmup, batches = sets
    for s, hist, _ in warmup:
        rescore(s, lm, 1.0, 4, hist)
    out = {}
    for c, (_, _, p) in CASES.items():
        t = [_timed(lm, x, p) for rnd in cases[c] for x in rnd]
        out[c] = 1e3 * statistics.median(w for w, _ in t)
        out[c + "_mean"] = 1e3 * statistics.fmean(w for w, _ in t)  # the paper's figures are means
        out[c + "_cpu"] = 1e3 * statistics.median(u for _, u in t)
    rates = []
    for group in (g for rnd in batches for g in rnd):
        T = np.stack([g[0].tokens for g in group])
        L = np.stack([g[0].logp for g in group])
        t0 = time.perf_counter()
        rescore_batch(SausageBatch(T, L), lm, 1.0, 4, [g[1] for g in group])
        rates.append(32 / (time.perf_counter() - t0))
    out["batch32_8x16_4best_per_s"] = statistics.median(rates)
    return out


def in_run_subprocess(d: Path, lattices: int, warm: int, rounds: int) -> dict:
    """``in_run`` for the build ``d`` in a fresh interpreter (the same lattices as every other)."""
    r = subprocess.run([sys.executable, __file__, "--in-run", str(d), "--root", str(d), "--lattices", str(lattices),
                        "--warm", str(warm), "--rounds", str(rounds)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    if r.returncode != 0:
        raise SystemExit(f"in-run latency of {d} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def cold(lms: dict, sets) -> dict:
    """*Cold* (``_cold`` keys): all LMs in one process, interleaved lattice by lattice (the first
    round's), so every call follows calls on the other LMs (caches and TLB hold none of its
    pages)."""
    cases, warmup, _ = sets
    for lm in lms.values():
        for s, hist, _ in warmup:
            rescore(s, lm, 1.0, 4, hist)
    out = {n: {} for n in lms}
    for c, (_, _, p) in CASES.items():
        times = {n: [] for n in lms}
        for x in cases[c][0]:
            for name, lm in lms.items():
                times[name].append(_timed(lm, x, p)[0])
        for name in lms:
            out[name][c + "_cold"] = 1e3 * statistics.median(times[name])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True, help="where the builds live (outside the repository)")
    ap.add_argument("--configs", nargs="+", default=["o4", "o5", "o6", "o4p", "o5p", "o6p", "bundled"],
                    help="o<order>[p] builds under --root; bundled: the bundled 4-gram as the reference row")
    ap.add_argument("--corpus", type=Path, default=ROOT / ".venv" / "lib" / "python3.11" / "site-packages")
    ap.add_argument("--tokenizer", default=str(ROOT / "data" / "tokenizer" / "tokenizer.json"))
    ap.add_argument("--memory", default="5G", help="lmplz sorting memory (default 5G)")
    ap.add_argument("--slice-mb", type=float, default=None, help="build on the first N MB of the corpus only")
    ap.add_argument("--no-build", action="store_true", help="report only configurations already built")
    ap.add_argument("--lattices", type=int, default=40, help="lattices per latency case (default 40)")
    ap.add_argument("--warm", type=int, default=200, help="warm-up lattices per LM before timing (default 200)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of fresh lattices per case, pooled (default 3)")
    ap.add_argument("--in-run", type=Path, default=None, help=argparse.SUPPRESS)  # in_run_subprocess's child
    ap.add_argument("--heldout-files", type=int, default=1000, help="held-out stdlib files for perplexity")
    ap.add_argument("--first-runs", type=int, default=3, help="fresh processes timed to the first rescore")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "lm_scale.json")
    from latticedraft.quiet import add_verbose_arg, quiet_libraries

    add_verbose_arg(ap)
    a = ap.parse_args(argv)
    quiet_libraries(a.verbose)
    if a.in_run is not None:
        sets = lattice_sets(lattice_maker(), a.lattices, a.warm, a.rounds)
        print(json.dumps(in_run(NgramLM.load(a.in_run), sets)))
        return 0

    corpus = a.corpus if a.slice_mb is None else corpus_slice(a.corpus, a.slice_mb, a.root / f"corpus-{a.slice_mb}MB")
    rows, dirs = {}, {}
    for name in a.configs:
        if name == "bundled":  # the reference: the bundled 4-gram, built by setup
            dirs[name] = default_lm_dir()
            m = NgramLM.load(dirs[name]).manifest
            rows[name] = {"order": m["order"], "prune": None, "build": {"wall_s": None, "peak_rss_bytes": None}}
            continue
        order, prune = parse_config(name)
        d = dirs[name] = a.root / name
        if a.no_build and not (d / "manifest.json").is_file():
            continue
        rows[name] = {"order": order, "prune": prune, "build": build_once(d, order, prune, corpus, a.tokenizer,
                                                                         a.memory)}
    lms = {}
    for name in rows:
        d = dirs[name]
        lm = NgramLM.load(d)
        m = lm.manifest
        sizes = disk(d)
        rows[name].update({"ngrams": m["ngram_counts"], "ngrams_total": sum(m["ngram_counts"]),
                           "corpus_tokens": m["corpus"]["tokens"], "disk_bytes": sizes,
                           "tables_vs_kenlm_trie": sizes["tables"] / sizes["lm.bin"],
                           "first_rescore": first_rescore(d, a.first_runs),
                           "heldout": heldout_perplexity(d, lm, a.heldout_files)})
        lms[name] = lm
    for name in lms:
        rows[name]["latency"] = in_run_subprocess(dirs[name], a.lattices, a.warm, a.rounds)
    for name, lat in cold(lms, lattice_sets(lattice_maker(), a.lattices, a.warm, a.rounds)).items():
        rows[name]["latency"].update(lat)
    doc = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "loadavg": os.getloadavg(),
                       **cpu_caches()},
           "corpus": str(corpus), "configs": rows,
           "paper_targets_ms": {"8x16_1best": 1.63, "8x16_16best": 1.98, "16x16_1best": 2.17}}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(table(doc))
    return 0


def table(doc: dict) -> str:
    mb = lambda b: f"{b / 2**20:.0f}" if b is not None else "-"  # noqa: E731
    nan = float("nan")
    cols = ["LM", "n-grams", "build s", "build peak RSS MiB (all its processes)",
            "ARPA / trie / fst / npz / tables MiB", "tables/trie",
            "start→1st rescore s (peak RSS MiB); tables mapped at s", "8x16 1-best ms in a run: median, mean (cold)",
            "8x16 16-best ms in a run: median, mean (cold)", "16x16 1-best ms in a run: median, mean (cold)",
            "batch32 8x16 4-best /s", "held-out ppl"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name, r in doc["configs"].items():
        d, b, f, lat = r["disk_bytes"], r["build"], r["first_rescore"], r.get("latency", {})
        wall = f"{b['wall_s']:.0f}" if b.get("wall_s") else "-"
        cells = [name, f"{r['ngrams_total'] / 1e6:.1f} M ({'/'.join(map(str, r['ngrams']))})", wall,
                 mb(b.get("peak_tree_rss_bytes", b.get("peak_rss_bytes"))),
                 " / ".join(mb(d.get(k)) for k in ("lm.arpa", "lm.bin", "lm.fst", "lm.npz", "tables")),
                 f"{r['tables_vs_kenlm_trie']:.2f}",
                 f"{f['median_s']:.2f} ({mb(f['peak_rss_bytes'])}); mapped at {f['to_tables_mapped_median_s']:.2f}",
                 *(f"{lat.get(c, nan):.2f}, {lat.get(c + '_mean', nan):.2f} ({lat.get(c + '_cold', nan):.2f})"
                   for c in CASES),
                 f"{lat.get('batch32_8x16_4best_per_s', 0):.0f}", f"{r['heldout']['perplexity']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    m = doc["machine"]
    return "\n".join(lines) + (f"\n\nload average {m['loadavg'][0]:.1f} on {m['cpus']} CPUs "
                               f"({m.get('cpu', '?')}, last-level cache {m.get('llc', '?')})")


if __name__ == "__main__":
    raise SystemExit(main())
