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
        parse_prompt_set(text, "IN", skip_option="--skip-bad")
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


USER, SYSTEM = {"role": "user", "content": "Hi"}, {"role": "system", "content": "Be brief."}
MALFORMED_CHATS = [  # (record, what the refusal names, the fix it gives)
    ({"messages": [{"role": "wizard", "content": "Hi"}]}, "message 1 has the role 'wizard'", "use one of system, user"),
    ({"messages": [USER, {"role": "Assistant", "content": "Hello"}, USER]}, "message 2 has the role 'Assistant'",
     "use one of"),
    ({"messages": [SYSTEM]}, "'messages' holds only system messages", "add the user's message"),
    ({"messages": [SYSTEM, USER, {"role": "assistant", "content": "Hello"}]},
     "'messages' ends with a message of the assistant", "end it with the user's message"),
    ({"messages": [USER, SYSTEM]}, "'messages' ends with a message of the system", "end it with the user's message"),
    ({"prompt": "Hi", "messages": [USER]}, "both 'prompt' and 'messages'", "keep one of them"),
    ({"turns": ["Hi"], "messages": [USER]}, "both 'messages' and 'turns'", "keep one of them"),
    ({"prompt": "Hi", "turns": ["Hi"]}, "both 'prompt' and 'turns'", "keep one of them"),
    ({"messages": []}, "'messages' is not a non-empty list", 'give [{"role": "user"'),
    ({"messages": [{"role": "user"}]}, 'message 1 is not {"role": string, "content": string}', "give [{"),
    ({"messages": [USER, {"role": "user", "content": ""}]}, "an empty prompt (the last message is empty)",
     "give the user's message text"),
    ({"turns": ["Hi", ""]}, "an empty prompt (turn 2 is empty)", "give every turn text"),
    ({"turns": "Hi"}, "'turns' is not a non-empty list of strings", 'give ["first question"'),
]


@pytest.mark.parametrize("record, why, fix", MALFORMED_CHATS, ids=[m[1] for m in MALFORMED_CHATS])
def test_every_malformed_chat_record_is_refused_naming_its_line_and_the_fix(record, why, fix):
    """Issue 59, class B: each shape of chat record a template cannot answer is a bad line."""
    text = _jsonl({"messages": [SYSTEM, USER]}, record, {"turns": ["a", "b"]})
    with pytest.raises(InputError) as e:
        parse_prompt_set(text, "IN")
    msg = str(e.value)
    assert msg.startswith(f"IN line 2: {why}; {fix}") and "\n" not in msg, msg
    assert "--skip-bad" not in msg  # named only where the caller offers it (skip_option)
    ps, bad = parse_prompt_set(text, "IN", skip_bad=True)
    assert [p.line for p in ps] == [1, 3] and bad[0].why == why


def test_the_skip_option_is_named_only_where_the_caller_has_one():
    """Issue 59, class C: the advice names --skip-bad only for a caller that offers it."""
    text = _jsonl({"prompt": "a"}, {"prompt": ""})
    for option in (None, "--skip-bad"):
        with pytest.raises(InputError) as e:
            parse_prompt_set(text, "IN", skip_option=option)
        assert str(e.value) == ("IN line 2: an empty prompt; give the prompt text"
                                + (", or pass --skip-bad to leave bad lines out" if option else ""))
