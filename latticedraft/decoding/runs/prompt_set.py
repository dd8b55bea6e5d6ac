"""A prompt data set for ``decode --output``: every prompt with a stable id, checked before any decoding.

A prompt's id is its ``id`` field (a string or an integer) when the record has one, else its line
number in the file (1-based; blank lines count as lines and are ignored). A record holds its prompt
as a string ``prompt``, or as a chat: ``messages`` (``[{"role": ..., "content": ...}, ...]``, as
``apply_chat_template`` takes them) or Spec-Bench's ``turns`` (a list of user turns: the first is
the prompt, each later one is asked after the model's answer, ``turns.py``); chat records decode
with ``--chat`` only (``chat.py``). Three kinds of bad line
are found: a line that is not a JSON object with exactly one of those (or whose ``id`` is neither a
string nor an integer; a chat whose roles are not system, user or assistant, that holds no user
message or does not end with one), an empty prompt, and an id already used on an earlier line.
Without ``skip_bad`` the first bad line is an ``InputError`` naming it and the fix; with ``skip_bad``
bad lines are left out and returned, so the caller can count them.

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


ROLES = ("system", "user", "assistant")  # the roles a chat record's messages may take


@dataclass(frozen=True)
class Problem:
    """Why a line is no usable prompt record (``why``) and how to mend it (``fix``)."""

    why: str
    fix: str = "fix that line"


def _check_messages(msgs) -> Problem | None:
    """Why a ``messages`` list cannot start a reply, or None: each message a role of ``ROLES`` and a
    string content, a user message, and the last message the user's (the one the model answers)."""
    shape = 'give [{"role": "user", "content": "..."}, ...]'
    if not isinstance(msgs, list) or not msgs:
        return Problem("'messages' is not a non-empty list", shape)
    for k, m in enumerate(msgs, 1):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            return Problem(f'message {k} is not {{"role": string, "content": string}}', shape)
        if m["role"] not in ROLES:
            return Problem(f"message {k} has the role {m['role']!r}", f"use one of {', '.join(ROLES)}")
    if all(m["role"] == "system" for m in msgs):
        return Problem("'messages' holds only system messages", "add the user's message the model should answer")
    if msgs[-1]["role"] != "user":
        return Problem(f"'messages' ends with a message of the {msgs[-1]['role']}",
                       "end it with the user's message the model should answer (drop the last message)")
    if not msgs[-1]["content"]:
        return Problem("an empty prompt (the last message is empty)", "give the user's message text")
    return None


def _check_turns(turns) -> Problem | None:
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
        return Problem("'turns' is not a non-empty list of strings", 'give ["first question", "follow-up", ...]')
    empty = [k for k, t in enumerate(turns, 1) if not t]
    return Problem(f"an empty prompt (turn {empty[0]} is empty)", "give every turn text") if empty else None


def _check(rec) -> Problem | None:
    """Why the parsed line ``rec`` is not a usable prompt record, or None."""
    if not isinstance(rec, dict):
        return Problem("not a JSON object", 'give one {"prompt": ...} per line')
    held = [k for k in ("prompt", "messages", "turns") if k in rec]
    if len(held) > 1:
        return Problem(f"both {' and '.join(repr(k) for k in held)}",
                       "keep one of them: a record is a plain prompt, a chat or Spec-Bench's turns")
    if not held:
        return Problem("no string 'prompt' (nor chat 'messages' or 'turns')", 'give {"prompt": "..."}')
    problem = (_check_messages(rec["messages"]) if held == ["messages"] else _check_turns(rec["turns"])
               if held == ["turns"] else None)
    if problem is not None:
        return problem
    if held == ["prompt"] and not isinstance(rec["prompt"], str):
        return Problem("'prompt' is not a string", 'give {"prompt": "..."}')
    if held == ["prompt"] and not rec["prompt"]:
        return Problem("an empty prompt", "give the prompt text")
    if "id" in rec and (isinstance(rec["id"], bool) or not isinstance(rec["id"], (str, int))):
        return Problem(f"'id' {show_id(rec['id'])} is neither a string nor an integer",
                       "give a string or an integer id")
    return None


def parse_prompt_set(text: str, where: str, skip_bad: bool = False, limit: int | None = None,
                     skip_option: str | None = None) -> tuple[list[Prompt], list[BadLine]]:
    """The prompts of JSONL ``text`` (from ``where``, named in errors) and the bad lines left out;
    ``limit``: stop after that many prompts (the rest of the file is not read). Without ``skip_bad``
    the first bad line is refused naming its number, what is wrong and the fix, and ``skip_option``
    (the caller's option that leaves bad lines out, "--skip-bad") where the caller has one."""
    prompts, bad, seen = [], [], {}
    for n, line in enumerate(text.split("\n"), 1):  # (not splitlines: JSON strings may hold U+2028)
        if limit is not None and len(prompts) >= limit:
            break
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            problem = Problem(f"not JSON ({e.msg} at column {e.colno})")
        else:
            problem = _check(rec)
        if problem is None:
            pid = rec.get("id", n)
            if pid in seen:
                problem = Problem(f"a duplicate id {show_id(pid)} (first on line {seen[pid]})", "give it another id")
        if problem is not None:
            if not skip_bad:
                skip = f", or pass {skip_option} to leave bad lines out" if skip_option else ""
                raise InputError(f"{where} line {n}: {problem.why}; {problem.fix}{skip}")
            bad.append(BadLine(n, problem.why))
            continue
        seen[pid] = n
        msgs = messages_of(rec)
        prompts.append(Prompt(pid, n, rec["prompt"] if msgs is None else msgs[-1]["content"], rec, msgs))
    if not prompts:
        raise InputError(f"{where} holds no usable prompts"
                         + (f" ({len(bad)} bad line(s) skipped)" if bad else "") + "; give one {\"prompt\": ...} per line")
    return prompts, bad


def read_prompt_set(path, skip_bad: bool = False, limit: int | None = None,
                    skip_option: str | None = None) -> tuple[list[Prompt], list[BadLine]]:
    """``parse_prompt_set`` of file ``path`` (``-``: standard input), read as strict UTF-8: the one
    prompt reader of every command and benchmark."""
    from latticedraft.textin import read_text_arg

    text = read_text_arg(path, "--prompts", 'pass --prompts FILE.jsonl with one {"prompt": ...} per line')
    where = "--prompts standard input" if str(path) == "-" else f"--prompts {path}"
    return parse_prompt_set(text, where, skip_bad, limit, skip_option)


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
