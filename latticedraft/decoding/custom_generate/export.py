"""``latticedraft export custom-generate -o DIR``: a directory transformers loads as a decoding method.

DIR holds ``custom_generate/generate.py`` (a thin ``generate`` calling
``latticedraft.decoding.custom_generate.entry.generate``: transformers allows relative imports
only inside ``custom_generate/``, and latticedraft is an installed package),
``custom_generate/requirements.txt`` (latticedraft, checked by transformers when it loads the
method), a ``README.md`` (usage; a Hub repository's card) and the marker ``MARKER`` by which a
later ``--force`` recognises the export (``outputs.CUSTOM_GENERATE``). Written atomically.

    >>> export_custom_generate("latticedraft_generate")                   # doctest: +SKIP
    >>> model.generate(ids, custom_generate="latticedraft_generate", trust_remote_code=True, max_new_tokens=40)
"""

from __future__ import annotations

import json
from pathlib import Path

from latticedraft import __version__
from latticedraft.atomic import atomic_dir
from latticedraft.outputs import CUSTOM_GENERATE, claim_dir, remove_stale
from latticedraft.outputs import MARKER_CUSTOM_GENERATE as MARKER

GENERATE_PY = '''"""latticedraft's decode loop as a transformers custom_generate method.

Written by `latticedraft export custom-generate` (latticedraft {version}). Use:

    model.generate(input_ids, custom_generate="<this directory>", trust_remote_code=True, max_new_tokens=64)

Greedy output equals generate(do_sample=False) token for token; do_sample=True samples the model's
distribution. Keywords beyond generate's: heads=DIR (multi-token heads; default the bundled heads
on latticedraft's bundled base), drafter=, lm=DIR, seed=N and every `latticedraft decode --method bpd`
option by its Python name. See latticedraft.decoding.custom_generate.entry.
"""

from latticedraft.decoding.custom_generate.entry import generate as _latticedraft_generate


def generate(model, input_ids=None, generation_config=None, **kwargs):
    return _latticedraft_generate(model, input_ids, generation_config, **kwargs)
'''

README = '''---
library_name: transformers
tags:
- custom_generate
---

# latticedraft

Blockwise parallel decoding with sausage-lattice drafts (latticedraft {version}): multi-token
heads draft, the model verifies the drafts in one parallel pass; the output is the model's own.

```python
out = model.generate(input_ids, custom_generate="<this directory>", trust_remote_code=True, max_new_tokens=64)
```

Greedy output equals `generate(do_sample=False)`; `do_sample=True` samples the model's distribution
(`temperature`, `top_k`, `top_p`, `repetition_penalty`; `seed=N` or `torch.manual_seed`). Keywords:
`heads=DIR` (from `latticedraft train heads`; default the bundled heads on latticedraft's bundled
base), `drafter=` (`top1`, `ngram`, `parallel`, `neural`, `model`, `none` ...), `lm=DIR` (an n-gram
LM from `latticedraft lm build`), and every `latticedraft decode --method bpd` option by its Python
name. `return_dict_in_generate=True` adds each row's target `calls` and `block_efficiency`.
Requires `pip install latticedraft` (custom_generate/requirements.txt).
'''


def export_custom_generate(out, force: bool = False) -> Path:
    """Write the custom_generate directory ``out`` (see the module docstring); returns ``out``.
    ``InputError`` before writing anything when ``out`` holds anything but an earlier export, or
    an earlier export without ``force``."""
    out = Path(out)
    claim_dir(out, CUSTOM_GENERATE, force=force)
    with atomic_dir(out) as stage:
        (stage / "custom_generate").mkdir()
        (stage / "custom_generate" / "generate.py").write_text(GENERATE_PY.format(version=__version__))
        (stage / "custom_generate" / "requirements.txt").write_text(f"latticedraft>={__version__}\n")
        (stage / "README.md").write_text(README.format(version=__version__))
        (stage / MARKER).write_text(json.dumps({"format": "latticedraft-custom-generate", "version": 1,
                                                "latticedraft": __version__}, indent=1) + "\n")
        written = {p.name for p in stage.iterdir()}
    remove_stale(out, CUSTOM_GENERATE, written)
    return out
