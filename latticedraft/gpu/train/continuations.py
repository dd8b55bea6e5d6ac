"""The base's own continuations of corpus prompts: the training text of self-distillation.

Medusa-2 and EAGLE train their drafters on what the base model says, not on the corpus: a head
is only worth its cost where the base accepts its drafts. ``continuations(base_dir, stream,
spec)`` cuts ``spec.prompts`` prompts of ``spec.prompt_len`` tokens from a corpus token stream
(int32[N], seeded offsets) and lets the frozen base continue each to ``spec.seq_len`` tokens with
the ``decoder`` its caller passes (``BaseDecoder``: latticedraft's own decode loop,
``decoding/runs/continuations.py``), in batches of ``spec.batch_size``: rows ``[0, n_greedy)``
greedily, the others sampled at ``spec.temperature`` (no top-k / top-p), row r drawing from
``default_rng([spec.seed, r])`` as the loop seeds it, so a row's text does not depend on the
batching. The base is not stopped at end-of-text (it continues as it would in a longer decode),
so every row is exactly ``seq_len`` tokens: ``int32[prompts, seq_len]``.

Chat (``spec.chat_fraction`` > 0): the first ``round(prompts * chat_fraction)`` rows start from
questions the base writes itself: the loop continues the chat template's user-turn header
(``ChatTurns.header``) for ``question_tokens`` tokens sampled at ``temperature``, the
question ends at the first end id, and the row's prompt is that question through the template with
the assistant's turn opened (what ``--chat`` decodes). No data set is read. The base answers each
for ``seq_len - shortest chat prompt`` tokens and the row keeps its first ``seq_len`` tokens. Chat
and corpus rows are each split into greedy and sampled rows by ``sample_fraction``.

Cache: ``<cache_dir>/continuations/<key>/`` holds ``spec.json`` and one ``batch-NNNNN.npy`` per
finished batch (each written atomically). The key covers the base's config and weight files (name,
size, mtime), the tokenizer, the prompts' token ids and every setting, so a run with the same
inputs reuses the text, and a killed run keeps its finished batches: the next run generates only
the missing ones.

``gpu/`` knows no decoding algorithm: the decode loop, the chat template and the end ids come in
through ``BaseDecoder``, which the caller (the ``train`` commands, ``data/build.py``) builds on the
decoding side, so the base's continuation is exactly what decoding produces.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Protocol, Sequence

import numpy as np
from tqdm import tqdm

from latticedraft import learned_state
from latticedraft.errors import InputError
from latticedraft.gpu.train.data import progress_enabled

FORMAT = 1


@dataclass(frozen=True)
class ChatTurns:
    """What the chat rows need of the base's chat template, as plain values and functions.

    header: int64[t], the ids a conversation holds before its first user message's text (the base
    continues them to write a question); render(question) -> int64[t']: the question as one user
    message with the assistant's turn opened (what ``--chat`` decodes); text(ids) -> str: a
    question's ids as text (special tokens skipped, whitespace stripped)."""

    header: np.ndarray
    render: Callable[[str], np.ndarray]
    text: Callable[[Sequence[int]], str]


class BaseDecoder(Protocol):
    """The frozen base continuing prompts, as ``continuations`` asks of its caller (``gpu/`` knows no
    decoding algorithm: ``latticedraft.decoding.runs.continuations.LoopDecoder`` runs our decode loop).

    ``decoder(prompts, new_tokens, temperature, seed, first_row)``: the base's continuations of
    ``prompts`` (int64 arrays), int64[len(prompts), new_tokens]; ``temperature`` None: greedy, else
    sampled (top-k and top-p off), row r of the set drawing from ``[seed, first_row + r]``;
    end-of-text does not stop a row. ``end_ids()``: the ids that end a sequence (a question ends at
    the first). ``chat()``: the base's ``ChatTurns``, the same object at every call, refused in one
    line naming ``--distill-chat`` where the base has no chat template. The model is loaded at the
    first decode, so a run the cache serves loads nothing. ``engine`` (optional, default ``"loop"``,
    our decode loop; ``"plain"``: the base's forward in a padded batch): the text maker's name, in
    the cache's key unless it is ``"loop"`` (``engine_setting``)."""

    def __call__(self, prompts: list[np.ndarray], new_tokens: int, temperature: float | None, seed: int,
                 first_row: int) -> np.ndarray: ...

    def end_ids(self) -> Sequence[int]: ...

    def chat(self) -> ChatTurns: ...


# (base_dir, tokenizer_path, device) -> BaseDecoder: what a training run is given to make its text
DecoderFactory = Callable[[Path, Path, object], BaseDecoder]


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

    def validate(self, flags: dict | None = None) -> None:
        """Refuse settings no run can make, naming each by the option that sets it (``FLAGS``,
        ``train``'s; ``flags``: field -> option where a caller's differ)."""
        f = {**FLAGS, **(flags or {})}
        if self.prompts < 1:
            raise InputError(f"{f['prompts']} {self.prompts} must be at least 1")
        if self.prompt_len < 1:
            raise InputError(f"{f['prompt_len']} {self.prompt_len} must be at least 1")
        if self.seq_len <= self.prompt_len:
            raise InputError(f"{f['seq_len']} {self.seq_len} must exceed {f['prompt_len']} {self.prompt_len}: each row "
                             f"is a prompt plus the base's continuation; raise {f['seq_len']} or lower {f['prompt_len']}")
        if not 0.0 <= self.sample_fraction <= 1.0:
            raise InputError(f"{f['sample_fraction']} {self.sample_fraction} is not a fraction in [0, 1]")
        if not (np.isfinite(self.temperature) and self.temperature > 0):
            raise InputError(f"{f['temperature']} {self.temperature} must be a finite number > 0")
        if self.batch_size < 1:
            raise InputError(f"{f['batch_size']} {self.batch_size} must be at least 1")
        if not 0.0 <= self.chat_fraction <= 1.0:
            raise InputError(f"{f['chat_fraction']} {self.chat_fraction} is not a fraction in [0, 1]")
        if self.question_tokens < 1:
            raise InputError(f"{f['question_tokens']} {self.question_tokens} must be at least 1")


FLAGS = {"prompts": "--distill-prompts", "prompt_len": "--prompt-len", "seq_len": "--seq-len",
         "sample_fraction": "--sample-fraction", "temperature": "--distill-temperature",
         "batch_size": "--gen-batch-size", "chat_fraction": "--distill-chat",
         "question_tokens": "--question-tokens"}  # the option of each ContinuationSpec field, as ``train`` names them


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


def engine_setting(decoder) -> dict:
    """``{"engine": name}`` for a text maker other than our decode loop (a ``BaseDecoder`` or its
    factory), ``{}`` for the loop: what the cache's key and a training run's settings record, so
    those made before engines existed stay valid."""
    name = getattr(decoder, "engine", "loop")
    return {} if name == "loop" else {"engine": name}


def cache_key(base_dir: Path, tokenizer_fp: str, prompts: np.ndarray, spec: ContinuationSpec,
              engine: dict | None = None) -> str:
    """``engine``: ``engine_setting`` of the text maker."""
    what = {"format": FORMAT, "base": str(base_dir.resolve()), "weights": _weights_key(base_dir),
            "tokenizer": tokenizer_fp, "spec": spec.key(), **(engine or {})}
    h = hashlib.sha256(json.dumps(what, sort_keys=True).encode())
    h.update(np.ascontiguousarray(prompts, dtype=np.int32).tobytes())
    return h.hexdigest()[:24]


def continuations(base_dir: str | Path, stream: np.ndarray, spec: ContinuationSpec, tokenizer_path: str | Path,
                  decoder: BaseDecoder, root: str | Path | None = None) -> Continuations:
    """The rows of ``spec`` for the base in ``base_dir`` over the corpus token ``stream`` (int32[N]),
    from the cache where present (``root``: the cache root, default ``<cache_dir>/continuations``),
    the missing ones made by ``decoder`` (the base in ``base_dir`` with the tokenizer at
    ``tokenizer_path``, as the cache is keyed)."""
    from latticedraft.lm.tokenizer import fingerprint, load_tokenizer

    spec.validate()
    base_dir = Path(base_dir)
    n_chat = spec.chat_rows
    corpus_spec = replace(spec, prompts=spec.prompts - n_chat)
    offsets = prompt_offsets(len(stream), corpus_spec) if corpus_spec.prompts else np.zeros(0, np.int64)
    prompts = np.asarray([stream[o : o + spec.prompt_len] for o in offsets], dtype=np.int64)
    prompts = prompts.reshape(len(offsets), spec.prompt_len)
    chat = decoder.chat() if n_chat else None
    key_ids = prompts if chat is None else np.concatenate([chat.header, prompts.reshape(-1)])
    key = cache_key(base_dir, fingerprint(load_tokenizer(tokenizer_path)), key_ids, spec, engine_setting(decoder))
    where = (Path(root) if root is not None else KIND.where) / key
    if not (where / "spec.json").is_file():  # what the folder holds, for a reader (never read back)
        learned_state.write(KIND, "spec.json", json.dumps({"format": FORMAT, "base": str(base_dir), "spec": asdict(spec)},
                                                          indent=1) + "\n", root=where)
    gen = _Generator(decoder, where)
    chat_prompts = _chat_prompts(gen, chat, spec) if n_chat else []
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
    """Batches of the base's continuations by ``decoder``, each cached as one ``.npy`` file under
    ``where``."""

    def __init__(self, decoder: BaseDecoder, where: Path):
        self.decoder, self.where, self.generated = decoder, where, 0

    def new(self, prompts: list, new_tokens: int, temperature: float | None, seed: int, first_row: int) -> np.ndarray:
        """int64[len(prompts), new_tokens], not cached."""
        new = np.asarray(self.decoder(prompts, new_tokens, temperature, seed, first_row))
        if new.shape != (len(prompts), new_tokens):
            raise InputError(f"the decode loop returned continuations of shape {new.shape}, not "
                             f"{(len(prompts), new_tokens)}; the base cannot continue these prompts")
        return new.astype(np.int64, copy=False)

    def rows(self, name: str, prompts: list, new_tokens: int, temperature: float | None, seed: int, first_row: int,
             seq_len: int) -> np.ndarray:
        """int32[len(prompts), seq_len]: each prompt then its continuation, cut to ``seq_len``."""
        shape = (len(prompts), seq_len)
        fits = lambda a: None if a.shape == shape else f"shape {list(a.shape)}, not {list(shape)}"  # noqa: E731
        rows = learned_state.read(KIND, name, check=fits, root=self.where)
        if rows is None:
            t0 = time.perf_counter()
            new = self.new(prompts, new_tokens, temperature, seed, first_row)
            rows = np.stack([np.concatenate([p, n])[:seq_len] for p, n in zip(prompts, new)]).astype(np.int32)
            learned_state.write(KIND, name, lambda tmp: np.save(tmp, rows), root=self.where)
            _add_seconds(self.where, time.perf_counter() - t0)
            self.generated += len(prompts)
        return rows


QUESTION_ROWS = 1 << 20  # sampling seeds of the questions: rows [QUESTION_ROWS, ...) never meet a continuation's


def _chat_prompts(gen: _Generator, chat: ChatTurns, spec: ContinuationSpec) -> list[np.ndarray]:
    """The chat rows' prompts: questions the base writes after the user-turn header (sampled at
    ``spec.temperature``, cut at the first end id), each rendered with the assistant's turn
    opened. The questions are cached as ``questions.json``."""
    is_list = lambda q: None if isinstance(q, list) and all(isinstance(x, str) for x in q) else "not a list of texts"  # noqa: E731
    questions = learned_state.read(KIND, "questions.json", check=is_list, root=gen.where)
    if questions is None:
        batches = []
        for s in range(0, spec.chat_rows, spec.batch_size):
            n = min(spec.batch_size, spec.chat_rows - s)
            t0 = time.perf_counter()
            batches.append(gen.new([chat.header] * n, spec.question_tokens, spec.temperature, spec.seed,
                                   QUESTION_ROWS + s))
            _add_seconds(gen.where, time.perf_counter() - t0)
        ends = set(gen.decoder.end_ids())
        questions = []
        for new in batches:
            for row in new.tolist():
                cut = next((i for i, t in enumerate(row) if t in ends), len(row))
                questions.append(chat.text(row[:cut]))
        learned_state.write(KIND, "questions.json", json.dumps(questions, indent=0, ensure_ascii=False) + "\n",
                            root=gen.where)
    return [chat.render(q) for q in questions]


def _seconds(where: Path) -> float:
    """The seconds spent making the rows cached in ``where`` (0 where unknown)."""
    d = learned_state.read(KIND, "seconds.json", root=where,
                           check=lambda d: None if learned_state.finite(d.get("seconds")) else "no seconds >= 0")
    return 0.0 if d is None else float(d["seconds"])


def _add_seconds(where: Path, dt: float) -> None:
    learned_state.write(KIND, "seconds.json", json.dumps({"seconds": _seconds(where) + dt}) + "\n", root=where)


def _schema(x) -> str | None:
    """A cached batch is int32[rows, seq_len] of ids >= 0; the JSON files are checked where read."""
    if isinstance(x, np.ndarray):
        return None if x.dtype == np.int32 and x.ndim == 2 and (not x.size or x.min() >= 0) else "not int32 rows of ids"
    return learned_state.fields(x) if isinstance(x, dict) else None


KIND = learned_state.kind("continuations", "the base's continuations", _schema,
                          parse=lambda p: np.load(p) if p.suffix == ".npy" else learned_state.read_json(p),
                          example=lambda: lambda p: np.save(p, np.ones((2, 5), np.int32)))
