"""Decoding algorithms: the BPD loop, drafters, DynaMo sampling, metrics."""
