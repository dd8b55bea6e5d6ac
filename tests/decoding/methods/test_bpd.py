"""``decoding/methods/bpd.py``'s option handling (what ``--do-sample`` changes in a drafter's settings) and
its warm-up at prepare."""


import numpy as np
import pytest

from latticedraft.decoding.methods.bpd import METHOD, DrafterSpec
from latticedraft.errors import InputError


def test_sampling_drafts_less_where_the_user_is_silent():
    """Under ``--do-sample`` what is not given drafts less (``_sampled_defaults``: the first
    SAMPLED_SLOTS heads, no LM drafts, a fixed tree); what is given, even at the greedy default,
    stays (every draft is lossless under the shared noise); the oracle, which drafts the greedy
    output, is refused."""
    from latticedraft.cli import decode_options
    from latticedraft.decoding.methods.bpd import SAMPLED_SLOTS

    values = {"drafter": "top1", "tree": "auto", "context_ngrams": 3, "lm_drafts": 2, "suffix_drafts": 2, "slots": 3}
    assert METHOD.configure({**values, "do_sample": True}, set(values)) == METHOD.configure(values, set(values))
    values.pop("slots")
    sampled = METHOD.configure({**values, "do_sample": True}, {"drafter"})
    assert (sampled.slots, sampled.lm_drafts, sampled.tree, sampled.context_ngrams) == (SAMPLED_SLOTS, 0, "fixed", 3)
    assert METHOD.configure({**values, "do_sample": True, "slots": 5}, {"slots"}).slots == 5
    assert METHOD.configure({"drafter": "none", "do_sample": True}, {"drafter"}).slots is None  # no heads drafted
    typed = decode_options("--do-sample", "--tree", "auto", "--lm-drafts", "auto")[1]  # typed at the default
    assert (typed.tree, typed.lm_drafts, typed.slots) == ("auto", "auto", SAMPLED_SLOTS)
    assert decode_options("--do-sample")[1].tree == "fixed"
    with pytest.raises(InputError, match="--drafter oracle drafts the greedy output"):
        METHOD.configure({"drafter": "oracle", "do_sample": True}, {"drafter"})


def test_lm_drafts_option():
    """``--lm-drafts``: a depth, 0 for off, or auto; ``--lm`` applies to any drafter while LM drafts
    are on."""
    import pytest

    from latticedraft.errors import InputError

    conf = lambda **v: METHOD.configure({"drafter": "none", **v}, set(v))  # noqa: E731
    assert conf(lm_drafts="auto").lm_drafts == "auto"
    assert conf(lm_drafts="5").lm_drafts == 5 and conf(lm_drafts=0).lm_drafts == 0
    # values left out take the CLI's defaults (the library decodes as latticedraft decode does)
    assert METHOD.configure({"drafter": "none"}, set()) == DrafterSpec("none").fast()
    assert DrafterSpec("none").lm_drafts == 0  # the paper's drafter, built directly: off
    assert DrafterSpec("none").fast().lm_drafts == "auto"
    assert conf(lm_drafts=2, do_sample=True).lm_drafts == 2
    assert conf(lm_drafts=3, lm="/some/lm").lm_drafts == 3
    for values, needle in (
        ({"lm_drafts": "x"}, "--lm-drafts 'x'"),
        ({"lm_drafts": -1}, "--lm-drafts -1"),
        ({"lm": "/some/lm", "lm_drafts": 0}, "--lm does not apply to --drafter none without --lm-drafts"),
    ):
        with pytest.raises(InputError, match=needle):
            METHOD.configure({"drafter": "none", **values}, set(values) - {"do_sample"})


def test_sampling_a_model_without_heads_drafts_its_ngrams_unless_a_head_drafter_is_asked_for(tmp_path):
    """The CLI's default drafter (top1) on a plain causal LM under ``--do-sample``: the context n-grams
    (LM drafts off unless given, as for every sampled drafter; a head drafter would sample nothing);
    named, it is refused."""
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    values = {"drafter": "top1", "do_sample": True, "model": str(plain), "context_ngrams": 4, "lm_drafts": "auto"}
    spec = METHOD.configure(values, set())
    assert (spec.name, spec.context_ngrams, spec.lm_drafts) == ("none", 4, 0)
    assert METHOD.configure(values, {"lm_drafts"}).lm_drafts == "auto"
    with pytest.raises(InputError, match=r"--drafter top1 drafts from multi-token heads, and --model .*plain has"):
        METHOD.configure(values, {"drafter"})
    heads = METHOD.configure({**values, "model": None}, set())  # the default model has heads: they draft
    assert (heads.name, heads.context_ngrams) == ("top1", 4)  # the n-grams beside them
    assert METHOD.configure({**values, "do_sample": False}, set()).name == "top1"  # greedy keeps it (n-grams beside)


def test_the_warm_up_at_prepare_teaches_neither_the_gate_nor_the_suffix_memory():
    """``prepare`` decodes a warm-up prompt (T(n), acceptance rates); the session's head gate,
    suffix drafts and rate correction start the first real call as if it had not run; the
    correction then learns from the calls, one per sampling setting."""
    from latticedraft.decoding.accept.sampling import SamplingOptions
    from latticedraft.decoding.runs.session import Session
    from latticedraft.decoding.sources import build_all

    s = Session()
    spec = DrafterSpec("top1", tree="auto", context_ngrams=3, suffix_drafts=3)
    s.prepare("bpd", spec)
    gate, (_, suffix) = s.learned.gate(spec), build_all(s, spec)
    assert gate.steps.sum() == 0 and gate.decisions.sum() == 0
    assert suffix.seen == {} and suffix.drafts.memory == []
    greedy = s.learned.correction(spec, None)
    assert np.array_equal(greedy.expected, greedy.prior) and np.array_equal(greedy.kept, greedy.prior)
    prompt = np.asarray(s.tokenizer.encode("def f(x):\n").ids)
    s.decode([prompt], "bpd", spec, max_new_tokens=8)
    assert gate.steps.sum() > 0 and len(suffix.seen) == 1
    assert greedy.expected.sum() > greedy.prior.sum()  # it saw the call's verified nodes
    sampled = s.learned.correction(spec, SamplingOptions(seed=1))
    assert sampled is not greedy and np.array_equal(sampled.expected, sampled.prior)
    taught = greedy.expected.copy()
    s.decode([prompt], "bpd", spec, max_new_tokens=8, sampling=SamplingOptions(seed=1))
    assert sampled.expected.sum() > sampled.prior.sum() and np.array_equal(greedy.expected, taught)


@pytest.mark.parametrize("dest,reader,other", [
    ("k", "top1", "none"), ("slots", "parallel", "model"), ("draft_vocab", "neural", "none"),
    ("alpha", "ngram", "parallel-base"), ("nbest", "parallel-base", "top1"), ("draft_confidence", "model", "top1"),
    ("rescorer", "neural", "ngram"), ("gamma", "model", "parallel"),
])
def test_a_drafting_option_applies_to_the_drafters_its_declaration_names(dest, reader, other):
    """Which ``--drafter`` values read an option comes from its ``option(..., only=...)``
    declaration (or, for the file options DrafterSpec does not hold, ``FILE_OPTIONS``)."""
    value = {"k": 4, "slots": 2, "draft_vocab": 0, "alpha": 0.5, "nbest": 2, "draft_confidence": 0.3,
             "rescorer": "/r", "gamma": 3}[dest]
    extra = {"draft_model": "/d"} if reader == "model" else {}  # (what --drafter model needs)
    METHOD.configure({"drafter": reader, dest: value, **extra}, {dest, *extra})
    flag = "--" + dest.replace("_", "-")
    with pytest.raises(InputError, match=f"{flag} does not apply to --drafter {other} "):
        METHOD.configure({"drafter": other, dest: value}, {dest})


@pytest.mark.parametrize("drafter,lm_drafts,files", [
    ("top1", 0, ()), ("ngram", 0, ("lm",)), ("parallel", 3, ("lm",)), ("neural", 0, ("rescorer",)),
    ("neural", 3, ("rescorer", "lm")), ("model", 0, ("draft_model",)), ("none", 2, ("lm",)),
])
def test_the_files_a_drafter_reads_decide_its_output_fingerprint(drafter, lm_drafts, files):
    """``METHOD.files``: the drafter's own file (``drafters.DRAFTERS``) and the LM where LM drafts read it."""
    spec = DrafterSpec(name=drafter, lm_drafts=lm_drafts)
    assert METHOD.files(spec) == files
    assert all(METHOD.uses_file(dest, spec) == (dest in files) for dest in ("lm", "rescorer", "draft_model"))


def test_auto_draft_vocabulary_stays_within_what_the_heads_were_trained_on(tmp_path):
    """``--draft-vocab auto`` is AUTO_DRAFT_VOCAB where the heads ship a ranking, fewer where they were
    trained on fewer tokens (``train heads --draft-vocab``), and off without a ranking or heads."""
    from types import SimpleNamespace

    import numpy as np

    from latticedraft.decoding.methods.bpd_session import AUTO_DRAFT_VOCAB, draft_vocab
    from latticedraft.gpu.models.draft_vocab import write_ranked

    def session(where, heads=3):
        return SimpleNamespace(model_dir=where, model=SimpleNamespace(num_heads=heads), once=lambda key, make: make())

    stream = np.arange(4 * AUTO_DRAFT_VOCAB) % (2 * AUTO_DRAFT_VOCAB)
    write_ranked(tmp_path / "all", stream, 2 * AUTO_DRAFT_VOCAB, "toy")
    write_ranked(tmp_path / "few", stream, 2 * AUTO_DRAFT_VOCAB, "toy", trained=100)
    assert len(draft_vocab(session(tmp_path / "all"), "auto")) == AUTO_DRAFT_VOCAB
    assert len(draft_vocab(session(tmp_path / "few"), "auto")) == 100
    assert len(draft_vocab(session(tmp_path / "few"), 300)) == 300  # an explicit size is the user's
    assert draft_vocab(session(tmp_path / "all", heads=1), "auto") is None
    assert draft_vocab(session(tmp_path / "none"), "auto") is None


def test_the_n_gram_weight_is_learned_unless_alpha_is_given():
    """``--drafter ngram / parallel`` learn alpha (``spec.alpha`` None) unless ``--alpha`` is typed,
    even at the library's default; the neural drafter and a ``DrafterSpec`` built directly (the
    paper's drafters as published) keep a fixed 1.0."""
    from latticedraft.cli import decode_options
    from latticedraft.decoding.methods.bpd_session import learns_alpha

    assert decode_options("--drafter", "parallel")[1].alpha is None
    assert decode_options("--drafter", "ngram")[1].alpha is None
    assert decode_options("--drafter", "parallel", "--alpha", "1.0")[1].alpha == 1.0
    assert decode_options("--drafter", "ngram", "--alpha", "0.25")[1].alpha == 0.25
    assert METHOD.configure({"drafter": "parallel"}, set()).alpha is None
    assert METHOD.configure({"drafter": "parallel", "alpha": 0.5}, {"alpha"}).alpha == 0.5
    assert METHOD.configure({"drafter": "neural"}, set()).alpha == 1.0
    assert METHOD.configure({"drafter": "parallel-base"}, set()).alpha == 1.0  # (it reads no LM)
    assert DrafterSpec("parallel").alpha == 1.0
    assert learns_alpha(decode_options("--drafter", "parallel")[1])
    assert not learns_alpha(decode_options("--drafter", "parallel", "--alpha", "0.5")[1])
    assert not learns_alpha(DrafterSpec("parallel"))
    with pytest.raises(InputError, match="--alpha -1.0 must be a finite number >= 0"):
        METHOD.configure({"drafter": "parallel", "alpha": -1.0}, {"alpha"})


def test_a_session_learns_the_weight_stores_it_and_the_next_session_reads_it(own_cache):
    """A decode with the learned weight writes its learner under the cache's rescore_weight folder
    after the call (the warm-up at prepare teaches it nothing) and a new session starts from it;
    ``--alpha`` given: nothing is learned or stored; the output is greedy's either way."""
    from latticedraft.decoding.methods.greedy import greedy_decode
    from latticedraft.decoding.planning import rescore_weight as rw
    from latticedraft.decoding.methods import bpd_session
    from latticedraft.decoding.runs.session import Session
    from latticedraft.paths import repo_root

    lm = repo_root() / ".cache" / "lm" / "stdlib-4gram"
    if not (lm / "manifest.json").is_file():
        pytest.skip("the bundled 4-gram is built by scripts/setup.sh")
    s = Session(lm_dir=lm, threads=1)
    spec = s.configure("bpd", {"drafter": "parallel", "tree": "fixed", "nbest": 4, "slots": 3})
    assert spec.alpha is None
    s.prepare("bpd", spec)
    learner = bpd_session.rescore_weight(s, spec)
    assert learner.steps == 0  # the warm-up decoded on a copy
    prompt = np.asarray(s.tokenizer.encode("import os\nimport sys\n\n\ndef main(").ids)
    r = s.decode([prompt], "bpd", spec, max_new_tokens=16)
    ref = greedy_decode(s.model, [prompt], eos_token_id=s.eos, max_new_tokens=16).sequences[0].tokens
    assert np.array_equal(r.sequences[0].tokens, ref)
    assert learner.steps > 0
    key = bpd_session.rescore_weight_key(s, spec)
    assert rw.path_of(key).is_file() and rw.load(key).steps == learner.steps
    again = Session(lm_dir=lm, threads=1, model=s.model)
    assert bpd_session.rescore_weight(again, spec).to_json() == learner.to_json()
    assert any("read from" in e and "alpha" in e for e in again.learned.events)
    fixed = s.configure("bpd", {"drafter": "parallel", "tree": "fixed", "nbest": 4, "slots": 3, "alpha": 0.5})
    s.decode([prompt], "bpd", fixed, max_new_tokens=16)
    assert len(list((own_cache / "rescore_weight").iterdir())) == 1
    auto = s.configure("bpd", {"drafter": "parallel", "tree": "auto", "nbest": 4, "slots": 3})
    assert bpd_session.rescore_weight_key(s, auto) != key  # (a ranking is scored by another tree there)
