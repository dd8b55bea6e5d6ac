"""What a line, or a whole file, holds when it should hold records of ``decode --output``: the
cause that refusals name ("line 1 is a prompt: this looks like a --prompts file").

Records of ``decode --output`` are JSON objects written by ``json.dumps`` with ``id`` and
``fingerprint`` first, so every record line, and every torn one, starts with ``RECORD_START``.

Example::

    >>> describe_line(b'{"prompt": "def f(x):"}')
    'a prompt ({"prompt": ...})'
    >>> describe_line(b'{"id": 1, "fingerprint": "ab12", "tokens": []}') is None
    True
"""

from __future__ import annotations

import json

RECORD_START = b'{"id": '
RECORD_FIELDS = ("id", "fingerprint")
PROMPTS_FILE = "a --prompts file"
JSON_OUTPUT = "the output of `decode --json` (records without prompt ids or a settings fingerprint)"
TOKENIZER = "a tokenizer (tokenizer.json)"
BINARY = "binary data"
WHOLE_FILE_KINDS = (PROMPTS_FILE, JSON_OUTPUT, TOKENIZER, BINARY)  # named without a line


def show_id(pid) -> str:
    """A prompt id as the user wrote it in JSON (``"q7"``, ``12``, ``null``, ``true``), for messages."""
    return json.dumps(pid, ensure_ascii=False)


def parse_line(raw: bytes, fields=RECORD_FIELDS) -> tuple[dict | None, str | None]:
    """``(record, None)`` when ``raw`` (one line, no newline) is a JSON object with ``fields``,
    else ``(None, what it is instead)``."""
    try:
        obj = json.loads(raw)
    except UnicodeDecodeError:
        return None, "binary data, not text"
    except json.JSONDecodeError as e:
        return None, f"not JSON ({e.msg} at column {e.colno})"
    if not isinstance(obj, dict):
        return None, f"a JSON {type(obj).__name__.replace('dict', 'object').replace('list', 'array')}, not an object"
    if all(f in obj for f in fields):
        pid = obj.get("id")
        if "id" in fields and (isinstance(pid, bool) or not isinstance(pid, (str, int))):
            return None, f"a record whose id {show_id(pid)} is neither a string nor an integer"
        return obj, None
    return None, _describe_object(obj, fields)


def _describe_object(obj: dict, fields) -> str:
    if "id" in obj and "fingerprint" in obj:
        missing = [f for f in fields if f not in obj]
        return f"a record without {', '.join(missing)}"
    if "tokens" in obj and "calls" in obj:
        return "a record of `decode --json` (no id or settings fingerprint)"
    if "prompt" in obj:
        return 'a prompt ({"prompt": ...})'
    if "model" in obj and ("added_tokens" in obj or "normalizer" in obj):
        return "a tokenizer"
    keys = ", ".join(list(obj)[:3]) or "no keys"
    return f"a JSON object with no id and fingerprint (keys: {keys})"


def describe_line(raw: bytes, fields=RECORD_FIELDS) -> str | None:
    """What line ``raw`` is instead of a record (None: a record)."""
    return parse_line(raw, fields)[1]


def describe_file(data: bytes) -> str:
    """What a whole file that holds no record on its first line looks like, for messages:
    ``PROMPTS_FILE``, ``JSON_OUTPUT``, ``TOKENIZER``, ``BINARY``, "one JSON document, not JSON
    lines" or "text that is not JSON lines"."""
    first = next((ln for ln in data.split(b"\n") if ln.strip()), b"")
    why = describe_line(first)
    if why is not None:
        if why.startswith("a prompt"):
            return PROMPTS_FILE
        if why.startswith("a record of `decode --json`"):
            return JSON_OUTPUT
        if why == "a tokenizer":
            return TOKENIZER
    if b"\0" in data[:4096]:
        return BINARY
    try:
        whole = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "text that is not JSON lines"
    if isinstance(whole, dict) and "model" in whole and ("added_tokens" in whole or "normalizer" in whole):
        return TOKENIZER
    return "one JSON document, not JSON lines"


def is_torn_tail(tail: bytes) -> bool:
    """Whether the bytes after the last newline are a record cut short by a killed run: they start
    as every record does and are no complete JSON, or they are a whole record whose newline was
    not written. A complete line of another kind (a prompt with an ``id``) is not, and a resumed
    run must never cut it off."""
    if not tail.startswith(RECORD_START):
        return False
    try:
        json.loads(tail)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return True
    return describe_line(tail) is None
