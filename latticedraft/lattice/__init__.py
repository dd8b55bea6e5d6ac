"""Sausage lattices from multi-token heads: thresholding, rescoring, p-best drafts (numpy only)."""
