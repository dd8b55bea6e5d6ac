"""Prompt ids and the bad lines of a data set (issue 13)."""

import json

import pytest

from latticedraft.decoding.runs.prompt_set import parse_prompt_set, summarize_bad
from latticedraft.errors import InputError


def _jsonl(*recs) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs)


def test_ids_are_the_id_field_else_the_line_number():
    text = _jsonl({"prompt": "a"}, "", {"id": "q7", "prompt": "b"}, {"id": 9, "prompt": "c\u2028d"})
    ps, bad = parse_prompt_set(text, "IN")
    assert [(p.id, p.line, p.text) for p in ps] == [(1, 1, "a"), ("q7", 3, "b"), (9, 4, "c\u2028d")] and bad == []


@pytest.mark.parametrize("line, why", [
    ('{"prompt": "a"', "not JSON"),
    ('["a"]', "not a JSON object"),
    ('{"text": "a"}', "no string 'prompt'"),
    ('{"prompt": ""}', "an empty prompt"),
    ('{"prompt": "a", "id": 1.5}', "neither a string nor an integer"),
    ('{"prompt": "a", "id": null}', "'id' null is neither a string nor an integer"),  # as written, not Python's None
    ('{"prompt": "a", "id": true}', "'id' true is neither a string nor an integer"),
    ('{"prompt": "a", "id": "x"}', "a duplicate id \"x\" (first on line 1)"),
])
def test_bad_lines_are_refused_naming_the_line_or_skipped_and_counted(line, why):
    text = _jsonl({"id": "x", "prompt": "first"}, line, {"prompt": "last"})
    with pytest.raises(InputError, match=r"IN line 2: .*--skip-bad") as e:
        parse_prompt_set(text, "IN")
    assert why in str(e.value)
    ps, bad = parse_prompt_set(text, "IN", skip_bad=True)
    assert [p.text for p in ps] == ["first", "last"] and [b.line for b in bad] == [2] and why in bad[0].why
    assert summarize_bad(bad).startswith("skipped 1 bad line(s): line 2 (")


def test_a_line_number_id_can_collide_with_an_id_field():
    with pytest.raises(InputError, match="line 2: a duplicate id 1"):
        parse_prompt_set(_jsonl({"prompt": "a"}, {"id": 1, "prompt": "b"}), "IN")


def test_nothing_usable_is_an_error_even_when_skipping():
    with pytest.raises(InputError, match=r"no usable prompts \(2 bad line\(s\) skipped\)"):
        parse_prompt_set(_jsonl({"prompt": ""}, "nope"), "IN", skip_bad=True)
    assert summarize_bad([]) == ""
