"""Fixtures shared by every test directory."""

from __future__ import annotations

import json
import shutil

import pytest


@pytest.fixture
def one_torch_thread():
    """Tiny models on a shared 2-core CPU: one intra-op thread is ~10x faster than two.

    Use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _grad_mode_is_left_as_found():
    """A test (or the benchmark ``main`` it runs in-process) that switches autograd off globally breaks every
    training test after it; fail the culprit instead."""
    import torch

    before = torch.is_grad_enabled()
    yield
    after = torch.is_grad_enabled()
    if after != before:
        torch.set_grad_enabled(before)
        pytest.fail(f"the test left autograd {'on' if after else 'off'} (use `with torch.no_grad()`, not "
                    "torch.set_grad_enabled(False))")


DISTILL_ARCHS = ["gpt2", "llama", "mistral"]


@pytest.fixture(scope="session")
def saved_bases(tmp_path_factory):
    """arch -> directory of a tiny random base (2 layers x 32, 64 positions) with the bundled
    tokenizer (vocabulary 8192), for the training tests that load a base from a directory."""
    from latticedraft.paths import data_dir
    from tests.gpu.conftest import make_tiny

    root = tmp_path_factory.mktemp("bases")
    out = {}
    for arch in DISTILL_ARCHS:
        d = root / arch
        make_tiny(arch, vocab=8192, hidden=32).save_pretrained(d)
        shutil.copy(data_dir() / "tokenizer" / "tokenizer.json", d / "tokenizer.json")
        out[arch] = d
    return out


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """Continuations and token streams go to a cache of this test, not the checkout's .cache."""
    monkeypatch.setenv("LATTICEDRAFT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


CHAT = ("{% for m in messages %}<|endoftext|>{{ m['role'] }}\n{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}")  # a tiny chat template


@pytest.fixture
def chat_base(saved_bases, tmp_path):
    """The tiny llama base of ``saved_bases`` with ``CHAT`` as its chat template (end id ``<|endoftext|>``)."""
    d = tmp_path / "chat-base"
    shutil.copytree(saved_bases["llama"], d)
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT, "eos_token": "<|endoftext|>"}))
    return d
