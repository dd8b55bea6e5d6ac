"""A prompt data set for ``decode --output``: every prompt with a stable id, checked before any decoding.

A prompt's id is its ``id`` field (a string or an integer) when the record has one, else its line
number in the file (1-based; blank lines count as lines and are ignored). A record holds its prompt
as a string ``prompt``, or as a chat: ``messages`` (``[{"role": ..., "content": ...}, ...]``, as
``apply_chat_template`` takes them) or Spec-Bench's ``turns`` (a list of user turns: the first is
the prompt, each later one is asked after the model's answer, ``turns.py``); chat records decode
with ``--chat`` only (``chat.py``). Three kinds of bad line
are found: a line that is not a JSON object with one of those (or whose ``id`` is neither a string
nor an integer), an empty prompt, and an id already used on an earlier line.
Without ``skip_bad`` the first bad line is an ``InputError`` naming it; with ``skip_bad`` bad lines
are left out and returned, so the caller can count them.

Example::

    {"prompt": "def f(x):"}              -> id 1
    {"id": "q7", "prompt": "import os"}  -> id "q7"
    {"turns": ["Write a haiku.", "Now in French."]}  -> id 3, messages [{"role": "user", "content": "Write a haiku."}]
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from latticedraft.decoding.runs.line_kinds import show_id
from latticedraft.errors import InputError


@dataclass
class Prompt:
    """One prompt: ``id`` (str | int), its 1-based ``line`` in the file, the ``text`` (a chat
    record's last message), the chat ``messages`` (None for a plain ``prompt``) and the whole record."""

    id: str | int
    line: int
    text: str
    record: dict = field(repr=False, default_factory=dict)
    messages: list | None = None


@dataclass
class BadLine:
    line: int
    why: str


def messages_of(rec: dict) -> list | None:
    """The chat messages of a record: its ``messages``, or its first Spec-Bench turn as a user
    message; None for a plain ``prompt`` record."""
    if "prompt" in rec:
        return None
    if "messages" in rec:
        return rec["messages"]
    return [{"role": "user", "content": rec["turns"][0]}]


def _check_chat(rec) -> str | None:
    if "messages" in rec:
        msgs = rec["messages"]
        if not isinstance(msgs, list) or not msgs:
            return "'messages' is not a non-empty list"
        for m in msgs:
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                return "a message that is not {\"role\": string, \"content\": string}"
        if not msgs[-1]["content"]:
            return "an empty prompt (the last message is empty)"
        return None
    turns = rec["turns"]
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        return "'turns' is not a non-empty list of strings"
    empty = [k for k, t in enumerate(turns, 1) if not t]
    return f"an empty prompt (turn {empty[0]} is empty)" if empty else None


def _check(rec, line: int) -> str | None:
    """Why the parsed line ``rec`` is not a usable prompt record, or None."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    if "prompt" not in rec and ("messages" in rec or "turns" in rec):
        why = _check_chat(rec)
        if why is not None:
            return why
    elif "prompt" not in rec or not isinstance(rec["prompt"], str):
        return "no string 'prompt' (nor chat 'messages' or 'turns')"
    elif not rec["prompt"]:
        return "an empty prompt"
    if "id" in rec and (isinstance(rec["id"], bool) or not isinstance(rec["id"], (str, int))):
        return f"'id' {show_id(rec['id'])} is neither a string nor an integer"
    return None


def parse_prompt_set(text: str, where: str, skip_bad: bool = False,
                     limit: int | None = None) -> tuple[list[Prompt], list[BadLine]]:
    """The prompts of JSONL ``text`` (from ``where``, named in errors) and the bad lines left out;
    ``limit``: stop after that many prompts (the rest of the file is not read)."""
    prompts, bad, seen = [], [], {}
    for n, line in enumerate(text.split("\n"), 1):  # (not splitlines: JSON strings may hold U+2028)
        if limit is not None and len(prompts) >= limit:
            break
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            why = f"not JSON ({e.msg} at column {e.colno})"
        else:
            why = _check(rec, n)
        if why is None:
            pid = rec.get("id", n)
            if pid in seen:
                why = f"a duplicate id {show_id(pid)} (first on line {seen[pid]})"
        if why is not None:
            if not skip_bad:
                raise InputError(f"{where} line {n}: {why}; fix that line, or pass --skip-bad to leave bad lines out")
            bad.append(BadLine(n, why))
            continue
        seen[pid] = n
        msgs = messages_of(rec)
        prompts.append(Prompt(pid, n, rec["prompt"] if msgs is None else msgs[-1]["content"], rec, msgs))
    if not prompts:
        raise InputError(f"{where} holds no usable prompts"
                         + (f" ({len(bad)} bad line(s) skipped)" if bad else "") + "; give one {\"prompt\": ...} per line")
    return prompts, bad


def read_prompt_set(path, skip_bad: bool = False, limit: int | None = None) -> tuple[list[Prompt], list[BadLine]]:
    """``parse_prompt_set`` of file ``path`` (``-``: standard input), read as strict UTF-8: the one
    prompt reader of every command and benchmark."""
    from latticedraft.textin import read_text_arg

    text = read_text_arg(path, "--prompts", 'pass --prompts FILE.jsonl with one {"prompt": ...} per line')
    where = "--prompts standard input" if str(path) == "-" else f"--prompts {path}"
    return parse_prompt_set(text, where, skip_bad, limit)


def read_prompts(path, limit: int | None = None) -> list[dict]:
    """The records (``{"prompt": ..., "reference"?: ...}``) of ``read_prompt_set(path)``, at most
    ``limit``; a chat record is refused (these readers take plain prompts; decode with ``--chat``)."""
    prompts = read_prompt_set(path, limit=limit)[0]
    refuse_chat(prompts, f"--prompts {path}", "this command takes plain {\"prompt\": ...} records; decode chat "
                                             "records with decode --chat")
    return [p.record for p in prompts]


def refuse_chat(prompts: list, where: str, fix: str) -> None:
    """``InputError`` naming the first chat record (``messages`` / ``turns``) among ``prompts`` (``Prompt``s;
    plain strings pass) and ``fix``."""
    for p in prompts:
        if getattr(p, "messages", None) is not None:
            raise InputError(f"{where} line {p.line} is a chat record ('messages' or 'turns'); {fix}")


def summarize_bad(bad: list[BadLine], shown: int = 3) -> str:
    """``"skipped 2 bad line(s): line 3 (an empty prompt), line 5 (...)"``, or "" for none."""
    if not bad:
        return ""
    parts = ", ".join(f"line {b.line} ({b.why})" for b in bad[:shown])
    more = f", and {len(bad) - shown} more" if len(bad) > shown else ""
    return f"skipped {len(bad)} bad line(s): {parts}{more}"
