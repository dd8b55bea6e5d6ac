"""latticedraft as a transformers ``custom_generate`` method.

``latticedraft export custom-generate -o DIR`` writes ``DIR/custom_generate/generate.py``
(``export.py``); ``model.generate(ids, custom_generate=DIR, trust_remote_code=True, ...)`` then
calls ``entry.generate``, which reads generate's arguments into a plain request
(``arguments.py``) and runs BPD on the one decode loop through a ``Session`` wrapping the model.
"""
