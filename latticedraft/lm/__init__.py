"""Language models for rescoring: n-gram building (KenLM → ARPA → WFST), scoring, statistics."""
