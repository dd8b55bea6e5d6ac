"""Torch modules: multi-token heads on HF causal LMs, tree verification, KV caches, training."""
