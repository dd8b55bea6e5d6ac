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


def test_every_method_refuses_what_it_does_not_read_in_its_own_option_check():
    """``Method.configure`` (what the CLI, ``Session`` and ``custom_generate`` call) refuses a given
    option the method does not read, naming it, its value and the methods that read it; a value
    that asks for nothing (``--self-draft off``, 0, None) goes with any method."""
    import pytest

    from latticedraft.errors import InputError

    dests = sorted(registry.method_options() | set(registry.SAMPLING))
    needs = {"mtad": {"draft_model": "DIR"}}  # what a method's configure needs beside
    for m in registry.methods().values():
        base = needs.get(m.name, {})
        for dest in (d for d in dests if not m.reads(d)):
            flag = "--" + dest.replace("_", "-")
            with pytest.raises(InputError) as e:
                m.configure({dest: 7}, {dest})
            msg = str(e.value)
            assert msg.startswith(f"{flag} 7 does not apply to --method {m.name} (it applies to --method "), msg
            assert "\n" not in msg and all(r in msg for r in registry.readers(dest))
            for off in (None, False, 0, "off", "none"):
                m.configure({**base, dest: off}, {dest})
            m.configure({**base, dest: 7}, set())  # not given: a default of another method's, never refused


def test_the_self_draft_is_refused_for_every_method_but_those_that_read_it():
    import pytest

    from latticedraft.errors import InputError

    for m in registry.methods().values():
        if m.reads("self_draft"):
            continue
        with pytest.raises(InputError, match=f"^--self-draft int4 does not apply to --method {m.name} "):
            m.configure({"self_draft": "int4"}, {"self_draft"})
