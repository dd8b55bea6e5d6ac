"""Benchmark the n-gram build on the standard-library corpus at three sizes.

Measures, per size (every 4th / every 2nd / every file of ``stdlib:train``):
tokenizing (tokens per wall second and per CPU second, ``encode_batch_fast``), lmplz and build_binary wall time, ARPA → WFST
(parse + convert + write ``lm.fst`` + ``lm.npz``; arcs/s, peak memory over the process baseline
measured with Linux's VmHWM reset), states/arcs/bytes, ``NgramLM.load`` + first query time, and
how often epsilon back-off (composition) undercuts exact back-off on held-out text.
Times are medians of ``--repeats`` runs; the conversion and load run in fresh subprocesses.

    .venv/bin/python benchmarks/lm_build.py [--repeats 3] [--order 4] [--out benchmarks/results/lm_build.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from latticedraft.lm.corpus import stdlib_split  # noqa: E402
from latticedraft.lm.corpus_ids import write_token_ids  # noqa: E402
from latticedraft.lm.kenlm_tools import run_build_binary, run_lmplz  # noqa: E402
from latticedraft.lm.tokenizer import load_tokenizer  # noqa: E402

CONVERT = r"""
import json, sys, time
from pathlib import Path
from latticedraft.lm.wfst import NgramFst
from latticedraft.lm.arpa import read_arpa
from latticedraft.lm.fst_convert import arpa_arrays_to_csr
fixture = Path(sys.argv[3])
NgramFst.from_arpa(fixture)  # load the numba kernels (compiled once, cached on disk)

def rss_kb(field):
    for line in open('/proc/self/status'):
        if line.startswith(field):
            return int(line.split()[1])
open('/proc/self/clear_refs', 'w').write('5')  # reset VmHWM (peak RSS) to the current RSS
base = rss_kb('VmRSS')
arpa, out, V = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[4])
t0 = time.perf_counter(); a = read_arpa(arpa); t1 = time.perf_counter()
d = arpa_arrays_to_csr(a, vocab_size=V, consume=True); del a; d.pop('counts'); f = NgramFst(**d)
t2 = time.perf_counter(); nbytes = f.save(out / 'lm.fst'); t3 = time.perf_counter()
f.save_npz(out / 'lm.npz'); t4 = time.perf_counter()
print(json.dumps(dict(parse_s=t1 - t0, convert_s=t2 - t1, write_fst_s=t3 - t2, write_npz_s=t4 - t3,
                      total_s=t4 - t0, states=f.num_states, arcs=f.num_arcs, fst_bytes=nbytes,
                      peak_mb=(rss_kb('VmHWM') - base) / 1024, base_mb=base / 1024)))
"""

LOAD = r"""
import json, sys, time
t0 = time.perf_counter()
from latticedraft.lm.ngram import NgramLM
t1 = time.perf_counter()
lm = NgramLM.load(sys.argv[1]); lm.fst; lm.score([1, 2, 3])
t2 = time.perf_counter()
print(json.dumps(dict(import_s=t1 - t0, load_s=t2 - t1)))
"""


def _median(xs):
    return statistics.median(xs)


def _sub(code: str, *args) -> dict:
    r = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"subprocess failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _epsilon_gap(build: Path, tok, heldout: list[Path], max_tokens: int, seg_len: int = 8) -> dict:
    """Where the epsilon automaton (composition) is cheaper than exact back-off on held-out text:
    per token from the exact state, and per ``seg_len``-token segment (a draft's length)."""
    from latticedraft.lm.corpus import iter_chunks, read_text
    from latticedraft.lm.wfst import NgramFst

    fst = NgramFst.load(build / "lm.fst")
    n = diff = segs = seg_diff = 0
    gaps, seg_gaps = [], []
    for p in heldout:
        for chunk in iter_chunks(read_text(p)):
            ids = tok.encode(chunk, add_special_tokens=False).ids
            s = fst.start
            for t in ids:
                e = fst.epsilon_cost(s, [t])
                s, c = fst.arc_lookup(s, t)
                n += 1
                if e < c - 1e-4:
                    diff += 1
                    gaps.append(c - e)
            for i in range(0, len(ids) - seg_len + 1, seg_len):
                s = fst.state_for_history(ids[:i])
                seg = ids[i : i + seg_len]
                c, _ = fst.exact_cost(s, seg)
                e = fst.epsilon_cost(s, seg)
                segs += 1
                if e < c - 1e-4:
                    seg_diff += 1
                    seg_gaps.append(c - e)
            if n >= max_tokens:
                break
        if n >= max_tokens:
            break
    return dict(tokens=n, tokens_cheaper=diff, token_fraction=diff / max(n, 1),
                segment_len=seg_len, segments=segs, segments_cheaper=seg_diff, segment_fraction=seg_diff / max(segs, 1),
                segment_mean_gap_nats=float(sum(seg_gaps) / max(len(seg_gaps), 1)),
                segment_max_gap_nats=float(max(seg_gaps, default=0.0)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--order", type=int, default=4)
    ap.add_argument("--tokenizer", default=str(ROOT / "data" / "tokenizer" / "tokenizer.json"))
    ap.add_argument("--memory", default="1G")
    ap.add_argument("--gap-tokens", type=int, default=20000, help="held-out tokens for the epsilon/exact comparison")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "lm_build.json")
    from latticedraft.quiet import add_verbose_arg, quiet_libraries

    add_verbose_arg(ap)
    a = ap.parse_args()
    quiet_libraries(a.verbose)

    tok = load_tokenizer(a.tokenizer)
    V = tok.get_vocab_size(with_added_tokens=True)
    train = stdlib_split("train")
    sizes = {"1/4": train[::4], "1/2": train[::2], "all": train}
    fixture = ROOT / "tests" / "lm" / "fixtures" / "tiny.arpa"
    rows = []
    with tempfile.TemporaryDirectory(prefix="lm-bench-") as tmp:
        for name, files in sizes.items():
            d = Path(tmp) / name.replace("/", "_")
            d.mkdir()
            tok_runs, tok_cpu = [], []
            for _ in range(a.repeats):
                r0 = resource.getrusage(resource.RUSAGE_SELF)
                st = write_token_ids(files, tok, d / "corpus.ids", progress=False)
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                tok_runs.append(st.seconds)
                tok_cpu.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
            t_lm, t_bb = [], []
            for _ in range(a.repeats):
                t0 = time.perf_counter()
                run_lmplz(d / "corpus.ids", d / "lm.arpa", a.order, None, a.memory, d)
                t_lm.append(time.perf_counter() - t0)
                t_bb.append(run_build_binary(d / "lm.arpa", d / "lm.bin", a.memory, d))
            conv = [_sub(CONVERT, d / "lm.arpa", d, fixture, V) for _ in range(a.repeats)]
            # a build directory NgramLM can open: manifest written last, as `lm build` does
            from latticedraft.lm.build import write_manifest
            from latticedraft.lm.tokenizer import fingerprint

            tok.save(str(d / "tokenizer.json"))
            write_manifest(d, {"format": "latticedraft-ngram", "order": a.order, "vocab_size": V,
                               "tokenizer": {"file": "tokenizer.json", "fingerprint": fingerprint(tok)}})
            loads = [_sub(LOAD, d) for _ in range(a.repeats)]
            ngrams = sum(int(l.split(b"=")[1]) for l in open(d / "lm.arpa", "rb") if l.startswith(b"ngram "))
            c = {k: _median([r[k] for r in conv]) for k in conv[0]}
            gap = _epsilon_gap(d, tok, stdlib_split("heldout"), a.gap_tokens) if name == "all" else None
            row = dict(size=name, files=len(files), corpus_mb=sum(p.stat().st_size for p in files) / 2**20,
                       tokens=st.tokens, tokenize_s=_median(tok_runs), tokens_per_s=st.tokens / _median(tok_runs),
                       tokenize_cpu_s=_median(tok_cpu), tokens_per_cpu_s=st.tokens / _median(tok_cpu),
                       lmplz_s=_median(t_lm), build_binary_s=_median(t_bb), ngrams=ngrams,
                       arpa_mb=(d / "lm.arpa").stat().st_size / 2**20, **{f"fst_{k}": v for k, v in c.items()},
                       arcs_per_s=c["arcs"] / c["total_s"], peak_over_fst=c["peak_mb"] * 2**20 / c["fst_bytes"],
                       load_s=_median([r["load_s"] for r in loads]), import_s=_median([r["import_s"] for r in loads]),
                       epsilon_gap=gap)
            rows.append(row)
            print(f"[{name}] done", file=sys.stderr)
    result = dict(benchmark="lm_build", order=a.order, vocab_size=V, repeats=a.repeats,
                  machine=dict(platform=platform.platform(), python=platform.python_version(),
                               cpu_count=os.cpu_count(), loadavg_at_end=os.getloadavg()),
                  rows=rows)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    hdr = ("size", "tokens", "tok/s", "tok/cpu-s", "lmplz s", "bbin s", "n-grams", "states", "arcs", "fst MB",
           "a2f s", "arcs/s", "peak MB", "peak/fst", "load s")
    print(" | ".join(f"{h:>9}" for h in hdr))
    for r in rows:
        vals = (r["size"], r["tokens"], f"{r['tokens_per_s']/1e6:.2f}M", f"{r['tokens_per_cpu_s']/1e6:.2f}M", f"{r['lmplz_s']:.2f}", f"{r['build_binary_s']:.2f}",
                r["ngrams"], r["fst_states"], r["fst_arcs"], f"{r['fst_fst_bytes']/2**20:.1f}", f"{r['fst_total_s']:.2f}",
                f"{r['arcs_per_s']/1e6:.2f}M", f"{r['fst_peak_mb']:.0f}", f"{r['peak_over_fst']:.2f}", f"{r['load_s']:.3f}")
        print(" | ".join(f"{v:>9}" for v in vals))
    g = rows[-1]["epsilon_gap"]
    if g:
        print(f"epsilon vs exact back-off on held-out text: {g['tokens_cheaper']} of {g['tokens']} tokens "
              f"({100 * g['token_fraction']:.2f}%) and {g['segments_cheaper']} of {g['segments']} "
              f"{g['segment_len']}-token segments ({100 * g['segment_fraction']:.2f}%) cheaper by epsilon; "
              f"segment gap mean {g['segment_mean_gap_nats']:.3f}, max {g['segment_max_gap_nats']:.3f} nats")
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"medians of {a.repeats}; JSON: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
