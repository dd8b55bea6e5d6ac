"""latticedraft: faster LLM decoding without changing what the model says.

Subpackages: ``lattice`` (sausage lattices, numpy only), ``lm`` (n-gram building and
scoring, WFSTs), ``decoding`` (BPD loop, drafters, DynaMo), ``gpu`` (torch modules).
"""

__version__ = "0.1.0"
