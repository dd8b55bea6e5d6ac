"""``decoding/registry.py``: which options apply to which method, derived from what each method
lists (no hand-kept list of the options every method reads)."""

from latticedraft.decoding import registry


def test_an_option_no_method_lists_applies_to_every_method():
    table = registry.methods()
    for dest in ("model", "max_new_tokens", "chat", "output", "quiet_ranks", "verbose", "some_new_common_option"):
        assert registry.readers(dest) == list(table)


def test_a_listed_option_applies_only_to_the_methods_that_list_it():
    assert registry.readers("k") == [m.name for m in registry.methods().values() if "k" in m.options]
    assert "bpd" in registry.readers("k") and "greedy" not in registry.readers("k")
    assert registry.method_options() >= {"k", "gamma", "lm"}


def test_sampling_options_apply_to_the_methods_that_sample():
    samplers = [m.name for m in registry.methods().values() if m.sampling != "never"]
    assert registry.readers("temperature") == samplers and "greedy" not in samplers
