"""A checkpoint's ``config_key`` against this run's, named as the options the user typed.

``run_training`` refuses ``--resume`` when the settings differ; ``differences`` says which, as
``--lr 0.001 (checkpoint) vs 0.002 (now)``, never as the key's internal fields ("optim", "arch").
A nested field is named by its leaf (``optim.lr`` -> ``--lr``) unless ``FLAGS`` maps its dotted
path (the distillation settings, whose options carry a prefix) or its leaf (``num_heads`` ->
``--heads``). Example::

    differences({"optim": {"lr": 1e-3}}, {"optim": {"lr": 2e-3}})
    # ['--lr 0.001 (checkpoint) vs 0.002 (now)']
"""

from __future__ import annotations

# dotted path or leaf -> what the user types; anything else is "--" + leaf with "-" for "_"
FLAGS = {
    "num_heads": "--heads", "tokens": "--corpus (tokens)", "tokenizer": "--tokenizer (fingerprint)",
    "base_config": "--base (config.json sha256)", "distill": "--self-distill",
    "distill.text": "--distill-text", "distill.loss": "--distill-loss",
    "distill.continuation.prompts": "--distill-prompts", "distill.continuation.temperature": "--distill-temperature",
    "distill.continuation.batch_size": "--gen-batch-size", "distill.continuation.chat_fraction": "--distill-chat",
    "distill.continuation.seq_len": "--seq-len", "distill.continuation.seed": "--seed",
}
_ABSENT = object()


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, path + "."))
        else:
            out[path] = v
    return out


def flag_of(path: str) -> str:
    """The option that sets field ``path`` of a config key (``optim.batch_size`` -> ``--batch-size``)."""
    leaf = path.rsplit(".", 1)[-1]
    return FLAGS.get(path) or FLAGS.get(leaf) or "--" + leaf.replace("_", "-")


def _value(v) -> str:
    if v is _ABSENT or v is None:
        return "unset"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, (list, tuple)):
        return " ".join(map(str, v))
    return str(v)


def differences(old: dict, new: dict) -> list[str]:
    """Each setting that differs between checkpoint key ``old`` and this run's ``new``, as
    ``FLAG OLD (checkpoint) vs NEW (now)``, in the key's order, one entry per option; a group
    present on one side only (heads' ``distill``) is named by its switch, ``on`` / ``off``."""
    a, b = _flatten(old), _flatten(new)
    out: dict[str, str] = {}
    for path in list(a) + [p for p in b if p not in a]:
        va, vb = a.get(path, _ABSENT), b.get(path, _ABSENT)
        if va == vb:
            continue
        top = path.split(".")[0]
        if "." in path and (top in old) != (top in new):
            path, va, vb = top, top in old, top in new
        flag = flag_of(path)
        out.setdefault(flag, f"{flag} {_value(va)} (checkpoint) vs {_value(vb)} (now)")
    return list(out.values())
