"""The prompts of ``--prompt TEXT`` / ``--prompts FILE.jsonl`` as texts."""

from __future__ import annotations


def prompt_inputs(a) -> list:
    """The prompts of ``--prompt TEXT`` (``-``: standard input; a string) or ``--prompts FILE.jsonl``
    (``-`` too; ``prompt_set.Prompt``s, chat records included: ``chat.prompt_ids`` encodes both)."""
    from latticedraft.decoding.runs.prompt_set import read_prompt_set
    from latticedraft.errors import InputError
    from latticedraft.textin import check_text_value, read_text_arg

    if (a.prompt is None) == (a.prompts is None):
        raise InputError("give exactly one of --prompt TEXT or --prompts FILE.jsonl (- reads standard input)")
    if a.prompt == "-":
        text = read_text_arg("-", "--prompt", "pipe UTF-8 text into --prompt -")
        if not text:
            raise InputError("--prompt - read an empty prompt from standard input; pipe the prompt text into it")
        return [text]
    if a.prompt is not None:
        return [check_text_value(a.prompt, "--prompt")]
    prompts = read_prompt_set(a.prompts)[0]
    for p in prompts:
        check_text_value(p.text, f"--prompts record {p.line}")
    return prompts
