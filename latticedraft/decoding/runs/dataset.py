"""``decode --prompts IN.jsonl --output OUT.jsonl``: a prompt set decoded into a record file.

Three steps, so that everything checkable is checked before a model loads:

1. ``plan_output`` reads what OUT (and this rank's part file) already hold. Without ``resume`` an
   existing OUT is refused (never overwritten); with it, complete records are skipped and their
   settings must match (``record_file.scan``).
2. ``decode_shard`` decodes this rank's prompts (``shards.shard_of``) that have no record yet, in
   batches (bucketed by token length with ``sort_by_length``), appending each batch's records as
   it completes (methods that run a continuous batch, ``Method.continuous``: each prompt's record
   as it completes, its row taking the next prompt): to OUT in a single process, to
   ``OUT.part-R-of-W`` under a launcher, or in input order to standard output for ``-``.
3. ``finish_output``: the barrier, then rank 0 merges OUT and the part files in prompt order.

Records are ``decode --json``'s plus ``id``, ``fingerprint``, ``settings``, ``share_seconds`` (the
prompt's share of its batch's wall time, or in a continuous batch the wall time since the record
before it, drafter set-up and record building included: summed per rank, the rank's decoding
time), ``rank`` and ``world_size``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from latticedraft import interrupts
from latticedraft.decoding import registry
from latticedraft.decoding.runs import record_file as rf
from latticedraft.decoding.runs.prompt_set import Prompt
from latticedraft.decoding.runs.shards import World, shard_of
from latticedraft.decoding.runs.turns import Conversations, rounds
from latticedraft.errors import InputError

STDOUT = "-"


def run_settings(method, options, sampling, *, model: str, tokenizer: str | None, max_new_tokens: int,
                 verify: str, files: dict) -> dict:
    """What decides a record's content, as plain values: its fingerprint is ``rf.fingerprint`` of
    this. ``method``: a registry ``Method`` with its options object and sampling options; files:
    resolved paths of the files its options name (dest -> path; kept where the options use them).
    Batch size, length sorting, threads, device and world size only schedule the work."""
    s = {"method": method.name, "model": model, "tokenizer": tokenizer, "max_new_tokens": max_new_tokens}
    if method.reads("verify"):
        s["verify"] = verify
    s.update(method.settings(options, sampling))
    s.update({k: v for k, v in files.items() if method.uses_file(k, options)})
    return s


@dataclass
class OutputPlan:
    """Where this rank writes, and what already has a record (``done``: ids)."""

    output: str
    world: World
    settings: dict
    target: Path | None = None  # the file this rank appends to (None: standard output)
    target_scan: rf.Scan | None = None
    done: set = field(default_factory=set)
    torn: list = field(default_factory=list)  # files whose torn last line will be cut and redone

    @property
    def fingerprint(self) -> str:
        return rf.fingerprint(self.settings)


def claim_output(output: str, resume: bool, prompts: str | None = None) -> None:
    """The overwrite rule for ``--output``, checked before anything is read: OUT is a file path and not
    the ``prompts`` file; without ``resume`` it (and its part files) must not hold anything yet, with
    it an existing OUT must hold records of ``decode --output`` (their settings are checked later,
    ``plan_output``); standard output (``-``) cannot be resumed."""
    from latticedraft.decoding.runs import line_kinds as lk
    from latticedraft.paths import check_writable

    if output == STDOUT:
        if resume:
            raise InputError("--resume needs --output FILE: records written to standard output (-) cannot be read back")
        return
    if prompts not in (None, STDOUT) and _same_file(prompts, output):
        raise InputError(f"--output {output} is the --prompts file itself; write the records to another file "
                         "(a run appends them to --output)")
    out = Path(output)
    check_writable(out, "--output", "file")
    parts = rf.part_files(out)
    held = out if out.exists() and out.stat().st_size > 0 else (parts[0] if parts else None)
    if held is not None and not resume:
        raise InputError(_existing(out, held))
    if held is not None:  # --resume appends only to records
        with open(held, "rb") as f:
            head = f.read(1 << 20)
        first = head.split(b"\n", 1)[0]
        why = lk.describe_line(first)
        if why is not None and not (b"\n" not in head and lk.is_torn_tail(first)):
            raise InputError(rf.not_records("--output", held, 1, why, head,
                                            "choose another --output (a run appends its records to it)", ""))


def plan_output(output: str, world: World, settings: dict, resume: bool, prompts: str | None = None) -> OutputPlan:
    """Check OUT against ``resume``, ``settings`` and the prompt file ``prompts`` (OUT must be
    another file: ``claim_output``) and find this rank's finished prompts."""
    plan = OutputPlan(output, world, settings)
    claim_output(output, resume, prompts)
    if output == STDOUT:
        if world.distributed:
            raise InputError(f"--output - under a launcher ({world.size} processes): each rank writes a part file "
                             "that is merged at the end; give --output FILE")
        return plan
    out = Path(output)
    parts = rf.part_files(out)
    plan.target = rf.part_path(out, world.rank, world.size) if world.distributed else out
    # this rank reads OUT, its own part file and parts of other world sizes (no rank writes
    # those now); the parts of its fellow ranks are theirs until the merge
    mine = [p for p in parts if p == plan.target or not p.name.endswith(f"-of-{world.size}")]
    for path in [out, *mine] if resume else []:
        sc = rf.scan(path, settings)
        plan.done.update(sc.order)
        if sc.torn:
            plan.torn.append(path)
        if path == plan.target:
            plan.target_scan = sc
    return plan


def _same_file(a: str, b: str) -> bool:
    pa, pb = Path(a), Path(b)
    if pa.exists() and pb.exists():
        return pa.samefile(pb)
    return pa.resolve() == pb.resolve()


def _existing(out: Path, held: Path) -> str:
    """The refusal for an OUT (or part file ``held``) that exists without ``--resume``: records of
    an earlier run can be resumed; any other file is named for what it is and never appended to."""
    from latticedraft.decoding.runs import line_kinds as lk

    with open(held, "rb") as f:
        head = f.read(1 << 20)
    first = head.split(b"\n", 1)[0]
    if lk.describe_line(first) is None or (b"\n" not in head and lk.is_torn_tail(first)):
        return (f"--output {out}: {held} already holds records of a `decode --output` run; pass --resume to continue "
                "that run (the same settings), or choose another --output")
    return rf.not_records("--output", out, 1, lk.describe_line(first) or "a record", head,
                          "choose another --output (a run appends its records to it)", "")


def my_prompts(prompts: list[Prompt], world: World) -> list[Prompt]:
    return [p for p in prompts if shard_of(p.id, world.size) == world.rank]


def batches(prompts: list[Prompt], lengths: list[int], batch_size: int, sort_by_length: bool) -> list[list[int]]:
    """Indices into ``prompts`` per batch: input order, or bucketed by token length (shortest
    first, ties in input order) so that a batch pads little."""
    order = sorted(range(len(prompts)), key=lambda i: lengths[i]) if sort_by_length else list(range(len(prompts)))
    return [order[s:s + batch_size] for s in range(0, len(order), batch_size)]


class InputOrderWriter:
    """Writes records to a text stream in the order of ``ids``, each as soon as every earlier one is out."""

    def __init__(self, file, ids: list):
        import json

        self.file, self.ids, self.next, self.held, self._dumps = file, list(ids), 0, {}, json.dumps

    def append(self, rec: dict) -> None:
        self.held[rec["id"]] = rec
        while self.next < len(self.ids) and self.ids[self.next] in self.held:
            self.file.write(self._dumps(self.held.pop(self.ids[self.next]), ensure_ascii=False) + "\n")
            self.next += 1
        self.file.flush()

    def sync(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.flush()


def progress_bar(world: World, total: int, initial: int, quiet_ranks: bool, file=None):
    """A tqdm bar over this rank's prompts (one line per rank); off for ranks > 0 with
    ``quiet_ranks`` and, as every bar of latticedraft, when ``file`` is not a terminal."""
    from tqdm import tqdm

    file = file if file is not None else sys.stderr
    off = True if (quiet_ranks and world.rank != 0) else None  # None: tqdm turns it off for a non-tty
    desc = f"rank {world.rank}/{world.size}" if world.distributed else "decode"
    return tqdm(total=total, initial=initial, unit="prompt", desc=desc, position=world.rank, file=file,
                disable=off, dynamic_ncols=True, leave=True)


@dataclass
class ShardSummary:
    prompts: int = 0  # this rank's share of the prompt set
    already: int = 0  # with a complete record before this run
    decoded: int = 0
    tokens: int = 0
    calls: int = 0
    seconds: float = 0.0

    def line(self, world: World, output: str = "--output") -> str:
        who = f"rank {world.rank}/{world.size}: " if world.distributed else ""
        if self.decoded == 0:
            return (f"{who}nothing left to decode: all {self.prompts} prompts already have complete records in "
                    f"{output}" if self.prompts else f"{who}no prompts fall to this rank")
        rate = self.tokens / self.seconds if self.seconds > 0 else 0.0
        be = self.tokens / self.calls if self.calls else 0.0
        return (f"{who}decoded {self.decoded} of {self.prompts} prompts ({self.already} already had records), "
                f"{self.tokens} tokens in {self.seconds:.2f} s: {rate:.1f} tokens/s, block efficiency {be:.2f}")

    def kept(self, target: Path | None, todo: int, mine: int) -> str:
        """What an interrupt leaves (``interrupts.keeping``) of a run writing to ``target`` (None: standard
        output) with ``todo`` of this rank's ``mine`` prompts to decode."""
        done = self.already + self.decoded
        if target is None:
            return f"the records of {self.decoded} of {todo} prompts were written to standard output"
        if done == 0:
            return f"no prompt had a complete record yet and {target} was not written; rerun the command"
        return (f"{done} of {mine} prompts have complete records in {target}; rerun the same command with "
                f"--resume to decode the other {mine - done}")


@dataclass
class ShardWork:
    """This rank's prompts (``mine``), those without a record (``todo``), their first turns' token ids
    (int64[t] each, truncated as asked), each prompt's run-wide row (its position in the prompt
    set) and their conversations (``turns.Conversations``: the later turns of chat records)."""

    mine: list
    todo: list
    ids: list
    rows: list
    talk: Conversations


def encode_shard(session, plan: OutputPlan, prompts: list[Prompt], max_new_tokens: int,
                 truncate_left: int | None = None, chat: bool = False) -> ShardWork:
    """Encode this rank's prompts that have no record yet (``chat``: through the model's chat
    template) and check every one against the model's positions, before the first record is
    written (a prompt that does not fit is refused naming its id, with nothing decoded)."""
    from latticedraft.decoding.runs.chat import prompt_ids
    from latticedraft.decoding.runs.prompt_length import fit_prompts

    mine = my_prompts(prompts, plan.world)
    todo = [p for p in mine if p.id not in plan.done]
    ids = fit_prompts(session.model, prompt_ids(session, todo, chat), max_new_tokens, truncate_left,
                      names=[f"--prompts id {p.id!r} (line {p.line})" for p in todo])
    row_of = {p.id: k for k, p in enumerate(prompts)}
    fit = lambda later, names: fit_prompts(session.model, later, max_new_tokens, truncate_left, names)  # noqa: E731
    return ShardWork(mine, todo, ids, [row_of[p.id] for p in todo], Conversations(session, todo, fit))


def decode_shard(session, plan: OutputPlan, work: ShardWork, *, method: str, options, max_new_tokens: int,
                 verify: str, batch_size: int, sort_by_length: bool, quiet_ranks: bool, sampling=None,
                 label: str | None = None, progress_file=None) -> ShardSummary:
    """Decode ``work`` (``encode_shard``) and append a record per prompt as each batch completes (in a
    continuous batch, as the prompt completes); a chat record of several turns is written once its
    last turn is done (``turns.rounds``: a round of batches per turn). Every prompt keeps its
    position in the prompt set as its run-wide row (its seed), whatever batch it is in."""
    world = plan.world
    mine, todo, ids, talk = work.mine, work.todo, work.ids, work.talk
    summary = ShardSummary(prompts=len(mine), already=len(mine) - len(todo))
    if plan.target is None:
        writer = InputOrderWriter(sys.stdout, [p.id for p in todo])
    else:
        writer = rf.RecordWriter(plan.target, plan.target_scan)
    bar = progress_bar(world, len(mine), summary.already, quiet_ranks, progress_file)
    t0 = time.perf_counter()
    shares = [0.0] * len(todo)  # each prompt's wall seconds, summed over its turns

    def write(i: int) -> None:
        """Prompt ``todo[i]``'s record, once its last turn is done."""
        rec = talk.record(i)
        writer.append({"id": todo[i].id, "fingerprint": plan.fingerprint, **rec, "method": label or method,
                       "share_seconds": round(shares[i], 6), "rank": world.rank, "world_size": world.size,
                       "settings": plan.settings})
        writer.sync()
        summary.decoded += 1
        summary.seconds = time.perf_counter() - t0
        bar.update(1)
        bar.set_postfix_str(f"{summary.tokens / max(summary.seconds, 1e-9):.1f} tok/s", refresh=False)

    def turn_done(i: int, res, share: float) -> None:
        shares[i] += share
        summary.tokens += res.tokens
        summary.calls += res.calls

    def decode_round(index: list, round_ids: list, on_done) -> None:
        """One turn of prompts ``index`` (positions in ``todo``), in the run's batches."""
        order = [[index[k] for k in b] for b in batches([todo[i] for i in index], [len(x) for x in round_ids],
                                                        batch_size, sort_by_length)]
        at = {i: k for k, i in enumerate(index)}
        if registry.get(method).one_batch(options, batch_size, len(index)):
            # one continuous batch: a finished prompt's turn is done at once and its row takes the
            # next prompt; its share is the wall time since the turn before it
            flat = [i for batch in order for i in batch]
            last = [time.perf_counter()]

            def done(j: int, res) -> None:
                now = time.perf_counter()
                turn_done(flat[j], res, now - last[0])
                last[0] = now
                on_done(at[flat[j]], res)

            session.decode([round_ids[at[i]] for i in flat], method, options, max_new_tokens=max_new_tokens,
                           verify=verify, batch_size=batch_size, sampling=sampling, rows=[work.rows[i] for i in flat],
                           on_done=done)
            return
        for batch in order:
            t_batch = time.perf_counter()
            res = session.decode([round_ids[at[i]] for i in batch], method, options, max_new_tokens=max_new_tokens,
                                 verify=verify, batch_size=len(batch), sampling=sampling,
                                 rows=[work.rows[i] for i in batch])
            share = (time.perf_counter() - t_batch) / len(batch)
            for j, i in enumerate(batch):
                turn_done(i, res.alone(j), share)
                on_done(at[i], res.alone(j))

    with interrupts.keeping(lambda: summary.kept(plan.target, len(todo), len(mine))):
        try:
            rounds(ids, decode_round, talk, write)
        finally:
            writer.close()
            bar.close()
    return summary


def finish_output(plan: OutputPlan, prompts: list[Prompt], device=None) -> tuple[int, list] | None:
    """After every rank is done (barrier), rank 0 merges OUT and the part files in prompt order;
    returns (records in OUT, ids in OUT that are not in the prompt set), or None on other ranks
    and for standard output."""
    from latticedraft.decoding.runs.shards import barrier

    barrier(plan.world, device)
    if plan.world.rank != 0 or plan.target is None:
        return None
    out = Path(plan.output)
    parts = " and its part files" if plan.world.distributed else ""
    note = (f"every record is kept in {out}{parts} (the merge writes a new file and renames it); rerun the same "
            "command with --resume to put them in prompt order")
    with interrupts.keeping(lambda: note):
        scans = [rf.scan(p, plan.settings) for p in [out, *rf.part_files(out)] if p.exists()]
        return rf.merge(out, scans, [p.id for p in prompts])
