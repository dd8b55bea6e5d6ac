"""The base's own continuations of corpus prompts: the training text of self-distillation.

Medusa-2 and EAGLE train their drafters on what the base model says, not on the corpus: a head
is only worth its cost where the base accepts its drafts. ``continuations(base_dir, stream,
spec)`` cuts ``spec.prompts`` prompts of ``spec.prompt_len`` tokens from a corpus token stream
(int32[N], seeded offsets) and lets the frozen base continue each to ``spec.seq_len`` tokens with
latticedraft's own decode loop, in batches of ``spec.batch_size``: rows ``[0, n_greedy)``
greedily, the others sampled at ``spec.temperature`` (no top-k / top-p), row r drawing from
``default_rng([spec.seed, r])`` as the loop seeds it, so a row's text does not depend on the
batching. The base is not stopped at end-of-text (it continues as it would in a longer decode),
so every row is exactly ``seq_len`` tokens: ``int32[prompts, seq_len]``.

Chat (``spec.chat_fraction`` > 0): the first ``round(prompts * chat_fraction)`` rows start from
questions the base writes itself: the loop continues the chat template's user-turn header
(``ChatTemplate.user_prefix_ids``) for ``question_tokens`` tokens sampled at ``temperature``, the
question ends at the first end id, and the row's prompt is that question through the template with
the assistant's turn opened (what ``--chat`` decodes). No data set is read. The base answers each
for ``seq_len - shortest chat prompt`` tokens and the row keeps its first ``seq_len`` tokens. Chat
and corpus rows are each split into greedy and sampled rows by ``sample_fraction``.

Cache: ``<cache_dir>/continuations/<key>/`` holds ``spec.json`` and one ``batch-NNNNN.npy`` per
finished batch (each written atomically). The key covers the base's config and weight files (name,
size, mtime), the tokenizer, the prompts' token ids and every setting, so a run with the same
inputs reuses the text, and a killed run keeps its finished batches: the next run generates only
the missing ones.

This module is the one place in ``gpu/train`` that calls the decode loop (``_decode_batch``): the
text must come from our own loop, so the base's continuation is exactly what decoding produces.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from latticedraft.atomic import atomic_file, write_atomic
from latticedraft.errors import InputError
from latticedraft.gpu.train.data import progress_enabled

FORMAT = 1


@dataclass(frozen=True)
class ContinuationSpec:
    """prompts: rows generated; prompt_len: corpus tokens per prompt; seq_len: tokens per row
    (prompt + ``seq_len - prompt_len`` base tokens); sample_fraction: share of rows sampled at
    ``temperature`` (the rest greedy); seed: prompt offsets and sampling draws; batch_size: rows
    decoded together."""

    prompts: int = 1024
    prompt_len: int = 48
    seq_len: int = 192
    sample_fraction: float = 0.5
    temperature: float = 1.0
    seed: int = 0
    batch_size: int = 16
    chat_fraction: float = 0.0
    question_tokens: int = 48

    @property
    def new_tokens(self) -> int:
        return self.seq_len - self.prompt_len

    @property
    def chat_rows(self) -> int:
        return round(self.prompts * self.chat_fraction)

    def greedy_of(self, n: int) -> int:
        """How many of a part's ``n`` rows (chat or corpus) are greedy: its first ones."""
        return n - round(n * self.sample_fraction)

    @property
    def greedy_rows(self) -> int:
        """Greedy rows, chat and corpus together."""
        return self.greedy_of(self.chat_rows) + self.greedy_of(self.prompts - self.chat_rows)

    def key(self) -> dict:
        """The settings the cache is keyed by (the chat ones only where chat rows are made, so
        caches made before they existed stay valid)."""
        d = asdict(self)
        if self.chat_fraction == 0:
            del d["chat_fraction"], d["question_tokens"]
        return d

    def validate(self) -> None:
        if self.prompts < 1:
            raise InputError(f"--distill-prompts {self.prompts} must be at least 1")
        if self.prompt_len < 1:
            raise InputError(f"--prompt-len {self.prompt_len} must be at least 1")
        if self.seq_len <= self.prompt_len:
            raise InputError(f"--seq-len {self.seq_len} must exceed --prompt-len {self.prompt_len}: each row is a "
                             "prompt plus the base's continuation; raise --seq-len or lower --prompt-len")
        if not 0.0 <= self.sample_fraction <= 1.0:
            raise InputError(f"--sample-fraction {self.sample_fraction} is not a fraction in [0, 1]")
        if not (np.isfinite(self.temperature) and self.temperature > 0):
            raise InputError(f"--distill-temperature {self.temperature} must be a finite number > 0")
        if self.batch_size < 1:
            raise InputError(f"--gen-batch-size {self.batch_size} must be at least 1")
        if not 0.0 <= self.chat_fraction <= 1.0:
            raise InputError(f"--distill-chat {self.chat_fraction} is not a fraction in [0, 1]")
        if self.question_tokens < 1:
            raise InputError(f"--question-tokens {self.question_tokens} must be at least 1")


@dataclass
class Continuations:
    """rows: int32[prompts, seq_len] (prompt then continuation); greedy_rows: the first rows,
    continued greedily; seconds: generation time over every run that filled the cache;
    generated: rows generated by this call (the others came from the cache); where: the cache dir."""

    rows: np.ndarray
    spec: ContinuationSpec
    greedy_rows: int
    seconds: float
    generated: int
    where: str


def prompt_offsets(n_tokens: int, spec: ContinuationSpec) -> np.ndarray:
    """Seeded start offsets (int64[prompts]) of the prompts in a stream of ``n_tokens`` tokens."""
    room = n_tokens - spec.prompt_len
    if room < 1:
        raise InputError(f"the corpus has {n_tokens} tokens, too few for prompts of --prompt-len {spec.prompt_len}; "
                         "give more text or lower --prompt-len")
    return np.random.default_rng([spec.seed, 7]).integers(0, room, size=spec.prompts)


def _weights_key(base_dir: Path) -> list:
    files = sorted(p for p in base_dir.iterdir() if p.is_file() and (p.suffix in (".safetensors", ".bin")
                                                                      or p.name.endswith(".index.json")))
    out = [["config.json", hashlib.sha256((base_dir / "config.json").read_bytes()).hexdigest()]]
    for p in files:
        st = p.stat()
        out.append([p.name, st.st_size, st.st_mtime_ns])
    return out


def cache_key(base_dir: Path, tokenizer_fp: str, prompts: np.ndarray, spec: ContinuationSpec) -> str:
    h = hashlib.sha256(json.dumps({"format": FORMAT, "base": str(base_dir.resolve()), "weights": _weights_key(base_dir),
                                   "tokenizer": tokenizer_fp, "spec": spec.key()}, sort_keys=True).encode())
    h.update(np.ascontiguousarray(prompts, dtype=np.int32).tobytes())
    return h.hexdigest()[:24]


def _decode_batch(session, prompts: list[np.ndarray], new_tokens: int, temperature: float | None, seed: int,
                  first_row: int) -> np.ndarray:
    """The base's continuations of ``prompts`` by our decode loop: int64[len(prompts), new_tokens].
    ``temperature`` None: greedy; else sampled (top-k and top-p off), row r of the set seeded with
    ``[seed, first_row + r]``. End-of-text does not stop a row."""
    from latticedraft.decoding.accept.sampling import SamplingOptions
    from latticedraft.decoding.bpd import DrafterSpec

    session.eos = None  # every row runs to new_tokens (the base continues past end-of-text)
    sampling = None if temperature is None else SamplingOptions(temperature=temperature, top_k=0, seed=seed)
    res = session.decode(prompts, "bpd", DrafterSpec("none"), max_new_tokens=new_tokens, batch_size=len(prompts),
                         sampling=sampling, first_row=first_row)
    return np.stack([np.asarray(s.tokens, dtype=np.int64) for s in res.sequences])


def continuations(base_dir: str | Path, stream: np.ndarray, spec: ContinuationSpec, tokenizer_path: str | Path,
                  device=None, root: str | Path | None = None, template=None) -> Continuations:
    """The rows of ``spec`` for the base in ``base_dir`` over the corpus token ``stream`` (int32[N]),
    from the cache where present (``root``: the cache root, default ``<cache_dir>/continuations``);
    ``template``: the base's ``ChatTemplate`` where the caller loaded it already (chat rows)."""
    from latticedraft.lm.tokenizer import fingerprint, load_tokenizer
    from latticedraft.paths import cache_dir

    spec.validate()
    base_dir = Path(base_dir)
    n_chat = spec.chat_rows
    corpus_spec = replace(spec, prompts=spec.prompts - n_chat)
    offsets = prompt_offsets(len(stream), corpus_spec) if corpus_spec.prompts else np.zeros(0, np.int64)
    prompts = np.asarray([stream[o : o + spec.prompt_len] for o in offsets], dtype=np.int64)
    prompts = prompts.reshape(len(offsets), spec.prompt_len)
    template = None if not n_chat else template or chat_template(base_dir)
    key_ids = prompts if template is None else np.concatenate([template.user_prefix_ids(), prompts.reshape(-1)])
    key = cache_key(base_dir, fingerprint(load_tokenizer(tokenizer_path)), key_ids, spec)
    where = Path(root) if root is not None else cache_dir() / "continuations"
    where = where / key
    where.mkdir(parents=True, exist_ok=True)
    meta_file = where / "spec.json"
    if not meta_file.is_file():
        write_atomic(meta_file, json.dumps({"format": FORMAT, "base": str(base_dir), "spec": asdict(spec)}, indent=1) + "\n")
    gen = _Generator(base_dir, tokenizer_path, device, where)
    chat_prompts = _chat_prompts(gen, template, spec) if n_chat else []
    chat_new = spec.seq_len - min((len(p) for p in chat_prompts), default=0)
    # (first row, prompts, new tokens) per part; a batch is all greedy or all sampled
    parts = [(0, chat_prompts, chat_new), (n_chat, list(prompts), spec.new_tokens)]
    out = []
    bar = tqdm(total=spec.prompts, desc="base continuations", unit="row", disable=not progress_enabled())
    for first, part, new_tokens in parts:
        greedy = spec.greedy_of(len(part))
        cuts = list(range(0, greedy, spec.batch_size)) + list(range(greedy, len(part), spec.batch_size))
        for i, s in enumerate(cuts):
            e = cuts[i + 1] if i + 1 < len(cuts) else len(part)
            temp = None if s < greedy else spec.temperature
            out.append(gen.rows(f"batch-{first + s:05d}-{first + e:05d}.npy", part[s:e], new_tokens, temp,
                                spec.seed, first + s, spec.seq_len))
            bar.update(e - s)
    bar.close()
    return Continuations(rows=np.concatenate(out), spec=spec, greedy_rows=spec.greedy_rows,
                         seconds=round(_seconds(where), 1), generated=gen.generated, where=str(where))


class _Generator:
    """Batches of the base's continuations, each cached as one ``.npy`` file under ``where``; the
    session is opened at the first batch not in the cache."""

    def __init__(self, base_dir: Path, tokenizer_path, device, where: Path):
        self.base_dir, self.tokenizer_path, self.device, self.where = base_dir, tokenizer_path, device, where
        self.session, self.generated = None, 0

    def new(self, prompts: list, new_tokens: int, temperature: float | None, seed: int, first_row: int) -> np.ndarray:
        """int64[len(prompts), new_tokens], not cached."""
        if self.session is None:
            from latticedraft.decoding.runs.session import Session

            self.session = Session(self.base_dir, tokenizer_path=self.tokenizer_path, device=self.device)
        new = _decode_batch(self.session, prompts, new_tokens, temperature, seed, first_row)
        if new.shape != (len(prompts), new_tokens):
            raise InputError(f"the decode loop returned continuations of shape {new.shape}, not "
                             f"{(len(prompts), new_tokens)}; the base in {self.base_dir} cannot continue these prompts")
        return new

    def rows(self, name: str, prompts: list, new_tokens: int, temperature: float | None, seed: int, first_row: int,
             seq_len: int) -> np.ndarray:
        """int32[len(prompts), seq_len]: each prompt then its continuation, cut to ``seq_len``."""
        f = self.where / name
        if not f.is_file():
            t0 = time.perf_counter()
            new = self.new(prompts, new_tokens, temperature, seed, first_row)
            rows = np.stack([np.concatenate([p, n])[:seq_len] for p, n in zip(prompts, new)]).astype(np.int32)
            with atomic_file(f, suffix=".npy") as tmp:
                np.save(tmp, rows)
            _add_seconds(self.where, time.perf_counter() - t0)
            self.generated += len(prompts)
        return np.load(f)


QUESTION_ROWS = 1 << 20  # sampling seeds of the questions: rows [QUESTION_ROWS, ...) never meet a continuation's


def chat_template(base_dir: Path):
    """The base's ``ChatTemplate`` for ``--distill-chat`` (refused in one line without one)."""
    from latticedraft.decoding.runs.chat import ChatTemplate

    return ChatTemplate.load(base_dir, "--distill-chat")


def _chat_prompts(gen: _Generator, template, spec: ContinuationSpec) -> list[np.ndarray]:
    """The chat rows' prompts: questions the base writes after the user-turn header (sampled at
    ``spec.temperature``, cut at the first end id), each rendered with the assistant's turn
    opened. The questions are cached as ``questions.json``."""
    f = gen.where / "questions.json"
    if not f.is_file():
        from latticedraft.decoding.runs.loaders import end_ids

        head = template.user_prefix_ids()
        batches = []
        for s in range(0, spec.chat_rows, spec.batch_size):
            n = min(spec.batch_size, spec.chat_rows - s)
            t0 = time.perf_counter()
            batches.append(gen.new([head] * n, spec.question_tokens, spec.temperature, spec.seed, QUESTION_ROWS + s))
            _add_seconds(gen.where, time.perf_counter() - t0)
        ends = set(end_ids(gen.session.model, gen.session.tokenizer) or [])
        questions = []
        for new in batches:
            for row in new.tolist():
                cut = next((i for i, t in enumerate(row) if t in ends), len(row))
                questions.append(template.tokenizer.decode(row[:cut], skip_special_tokens=True).strip())
        write_atomic(f, json.dumps(questions, indent=0, ensure_ascii=False) + "\n")
    questions = json.loads(f.read_text())
    return [template.ids([{"role": "user", "content": q}]) for q in questions]


def _seconds(where: Path) -> float:
    f = where / "seconds.json"
    return float(json.loads(f.read_text())["seconds"]) if f.is_file() else 0.0


def _add_seconds(where: Path, dt: float) -> None:
    write_atomic(where / "seconds.json", json.dumps({"seconds": _seconds(where) + dt}) + "\n")
