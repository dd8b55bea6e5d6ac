"""Prompts through a model's chat template (``--chat``): the token ids a user gets from
``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``, so that a chat decode
starts from exactly the ids ``generate`` would be given.

The template is the one saved beside the base model (``tokenizer_config.json``'s
``chat_template`` or ``chat_template.jinja``), rendered by transformers' own tokenizer of that
directory. A plain prompt becomes one user message.

    >>> t = ChatTemplate.load("models/smollm2")                        # doctest: +SKIP
    >>> t.ids([{"role": "user", "content": "Hi"}])                       # doctest: +SKIP
    array([1, 9690, 198, ..., 1, 520, 9531, 198])                        # ...<|im_start|>assistant\\n
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from latticedraft.errors import InputError


class ChatTemplate:
    """The chat template of the base model in ``base_dir`` (transformers' tokenizer of it)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, base_dir, opt: str = "--chat") -> "ChatTemplate":
        """Refuses a directory without a chat template in one line naming ``opt`` (the option that
        asked for the template)."""
        from transformers import AutoTokenizer

        d = Path(base_dir)
        try:
            tok = AutoTokenizer.from_pretrained(str(d))
        except (OSError, ValueError) as e:
            raise InputError(f"{opt}: cannot load the tokenizer of {d} ({str(e).splitlines()[0]}); "
                             f"pass a model directory with tokenizer files, or drop {opt}") from None
        if not getattr(tok, "chat_template", None):
            raise no_template(d, opt)
        return cls(tok)

    def ids(self, messages: list[dict]) -> np.ndarray:
        """int64[t]: ``messages`` rendered with the generation prompt (the assistant's turn opened)."""
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(out, dict) or hasattr(out, "keys"):  # transformers >= 5 returns a BatchEncoding
            out = out["input_ids"]
        return np.asarray(out, dtype=np.int64).reshape(-1)

    def around_user_text(self) -> tuple[str, str]:
        """(before, after): the text a one-message conversation holds around its user message's
        text, the assistant's turn opened after it (SmolLM2: its system turn and the user turn's
        header; ``<|im_end|>\n<|im_start|>assistant\n``)."""
        mark = "\u2063latticedraft-user-text\u2063"
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": mark}], tokenize=False,
                                                  add_generation_prompt=True)
        if mark not in text:
            raise InputError("the chat template does not render a user message's text verbatim; "
                             "the base cannot write chat questions of its own")
        i = text.index(mark)
        return text[:i], text[i + len(mark):]

    def user_prefix_ids(self) -> np.ndarray:
        """int64[t]: the ids a conversation holds before the text of its first user message (the
        template's default system turn, if any, then the user turn's header): what a model continues
        to write a question of its own."""
        ids = self.tokenizer(self.around_user_text()[0], add_special_tokens=False)["input_ids"]
        return np.asarray(ids, dtype=np.int64).reshape(-1)


def no_template(d, opt: str = "--chat") -> InputError:
    """The refusal of ``opt`` for base directory ``d``, which has no chat template."""
    return InputError(f"{opt}: {d} has no chat template (tokenizer_config.json 'chat_template' or "
                      f"chat_template.jinja); drop {opt} to decode the prompts as plain text")


def has_template(base_dir) -> bool:
    """Whether the files of ``base_dir`` carry a chat template (``tokenizer_config.json``'s
    ``chat_template``, ``chat_template.jinja`` or ``chat_template.json``), read without loading a
    tokenizer; an unreadable config counts as carrying one (loading it then names the problem)."""
    import json

    d = Path(base_dir)
    if (d / "chat_template.jinja").is_file() or (d / "chat_template.json").is_file():
        return True
    try:
        cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True
    return not isinstance(cfg, dict) or bool(cfg.get("chat_template"))


def check_chat(prompts: list, chat: bool, model_dir) -> None:
    """What the model's files alone answer, before any model loads: a chat record (``messages`` /
    ``turns``) needs ``chat``, and ``chat`` needs a chat template beside the base of ``model_dir``
    (None: the bundled heads). ``InputError`` naming the line or the directory and the fix."""
    from latticedraft.decoding.runs.loaders import base_dir_from_files
    from latticedraft.decoding.runs.prompt_set import refuse_chat

    if not chat:
        refuse_chat(prompts, "--prompts", "pass --chat to decode it through the model's chat template")
        return
    base = base_dir_from_files(model_dir)
    if not has_template(base):
        raise no_template(base)


def prompt_ids(session, prompts: list, chat: bool) -> list[np.ndarray]:
    """Token ids of ``prompts`` (``prompt_set.Prompt``s or plain strings): through the base's chat
    template with ``chat`` (a plain prompt as one user message), else the tokenizer's encoding; a
    chat record without ``chat`` is refused naming its line."""
    from latticedraft.decoding.runs.loaders import encode
    from latticedraft.decoding.runs.prompt_set import refuse_chat

    if not chat:
        refuse_chat(prompts, "--prompts", "pass --chat to decode it through the model's chat template")
        return encode(session.tokenizer, [p if isinstance(p, str) else p.text for p in prompts])
    template = session.chat_template()
    out = []
    for p in prompts:
        msgs = [{"role": "user", "content": p}] if isinstance(p, str) else (
            p.messages or [{"role": "user", "content": p.text}])
        out.append(template.ids(msgs))
    return out
