"""The prompts of ``--prompt TEXT`` / ``--prompts FILE.jsonl`` as texts."""

from __future__ import annotations


def prompt_texts(a) -> list[str]:
    """The prompts of ``--prompt TEXT`` (``-``: standard input) or ``--prompts FILE.jsonl`` (``-`` too)."""
    from latticedraft.decoding.runs.prompt_set import read_prompts
    from latticedraft.errors import InputError
    from latticedraft.textin import check_text_value, read_text_arg

    if (a.prompt is None) == (a.prompts is None):
        raise InputError("give exactly one of --prompt TEXT or --prompts FILE.jsonl (- reads standard input)")
    if a.prompt == "-":
        return [read_text_arg("-", "--prompt", "pipe UTF-8 text into --prompt -")]
    texts = [a.prompt] if a.prompt is not None else [r["prompt"] for r in read_prompts(a.prompts)]
    for i, t in enumerate(texts, 1):
        check_text_value(t, "--prompt" if a.prompt is not None else f"--prompts record {i}")
    return texts
