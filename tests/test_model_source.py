"""Where ``model.name_or_path`` is, decided before anything loads it (``xtrain.model.hub``, the
preflight's ``_model_source``): a local path that is not there fails the dry run in one line; a
hub model neither in the Hugging Face cache nor reachable is one line at once, never
huggingface_hub's retries; a cached one loads offline. No test touches the network: "unreachable"
is a closed local port, or a local socket that never answers; the cache is a folder laid out as
huggingface_hub lays it out."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import pytest
from support.jobs import REPO

from xtrain.errors import XtrainError
from xtrain.model import hub

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session

HUB_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.mark.parametrize(
    ("name", "repo_id"),
    [
        ("gpt2", True),
        (HUB_MODEL, True),
        ("Qwen/Qwen2.5-0.5B-Instruct", True),
        ("./my-model", False),
        ("/models/mine", False),
        ("~/models/mine", False),
        ("C:\\models\\mine", False),
        ("C:/models/mine", False),
        ("runs/out/adapter", False),  # more than one "/"
        ("models\\mine", False),
        ("org/na me", False),
        ("a--b", False),  # huggingface_hub forbids "--" and ".."
        ("a..b", False),
        ("x" * 97, False),
    ],
)
def test_repo_ids_and_paths_as_huggingface_hub_decides(name: str, repo_id: bool) -> None:
    assert hub.is_repo_id(name) is repo_id


@pytest.fixture
def no_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The hub unreachable (a closed local port), online mode, an empty hub cache: returns the
    cache folder. What ``go_offline`` switches is put back after the test."""
    from huggingface_hub import constants

    with socket.socket() as s:  # a port nothing listens on: connections are refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def fake_cache(cache: Path, repo_id: str, files: tuple[str, ...]) -> None:
    """``repo_id`` in the hub cache as huggingface_hub lays it out: refs/main names a snapshot
    holding ``files`` (blobs linked by name)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in files:
        (snapshot / name).write_text("{}")


def test_a_hub_model_neither_cached_nor_reachable_is_one_line_at_once(no_hub: Path) -> None:
    with pytest.raises(XtrainError) as e:
        hub.locate(HUB_MODEL)
    line = e.value.one_line()
    assert line.startswith(
        f"model '{HUB_MODEL}' is not in the Hugging Face cache and the hub cannot be reached ("
    )
    assert f"`hf download {HUB_MODEL}`" in line and "set model.name_or_path to a local folder" in line
    assert hub.offline_mode()  # nothing after it waits for the network
    # another machine's plan (--facts): what this one lacks is said, not refused
    assert "is not in the Hugging Face cache" in (hub.locate(HUB_MODEL, here=False).note or "")


def test_a_cached_hub_model_loads_from_the_cache_when_the_hub_cannot_be_reached(no_hub: Path) -> None:
    fake_cache(no_hub, "org/tiny", ("config.json", "model.safetensors"))
    fake_cache(no_hub, "org/config-only", ("config.json",))  # xtrain fetched its config.json, no weights
    source = hub.locate("org/tiny")
    assert source.kind == "cached" and "loads from its cache" in (source.note or "")
    assert hub.offline_mode()  # the loads read the cache, no HEAD waits for the network
    assert hub.locate("org/tiny") == hub.Source("cached")  # offline now: the cache, nothing to say
    with pytest.raises(XtrainError, match="'org/config-only' is not in the Hugging Face cache"):
        hub.locate("org/config-only")


def test_a_hub_that_never_answers_is_given_up_after_the_probe_timeout() -> None:
    """A server that takes the connection and never answers (a filtered network): one HEAD, given
    up after its timeout, no retries (huggingface_hub's own would take about a minute)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)  # the kernel completes the handshake; nobody reads or answers
        start = time.monotonic()
        why = hub.unreachable(HUB_MODEL, timeout=0.5, endpoint=f"http://127.0.0.1:{server.getsockname()[1]}")
        assert why is not None and time.monotonic() - start < 20  # well under the retries' ~51 s


def test_a_lookup_that_hangs_is_given_up_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name lookup that hangs is not bounded by the request's timeout: the probe as a whole is."""
    monkeypatch.setattr(hub, "_head", lambda *a: time.sleep(30))
    assert hub.unreachable(HUB_MODEL, timeout=0.2) == "no answer within 0.2 s"


def _dry_run(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> tuple[int, str]:
    from xtrain.cli import main

    monkeypatch.chdir(REPO)
    code = main(["train", *argv, "--dry-run"])
    said = capsys.readouterr()
    return code, said.out + said.err


def test_the_preference_example_without_its_model_is_one_line_at_once(
    no_hub: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """examples/preference-dpo.yaml names a hub model: with no network and no cache, its dry run
    ends in that one line (exit 2), with no retry."""
    code, text = _dry_run(["examples/preference-dpo.yaml"], monkeypatch, capsys)
    assert code == 2, text
    errors = [ln for ln in text.splitlines() if re.search(r"\berror:", ln)]
    assert len(errors) == 1 and "'Qwen/Qwen2.5-0.5B-Instruct' is not in the Hugging Face cache" in errors[0]
    assert "Retrying" not in text and "Traceback" not in text


def test_a_local_model_path_that_is_not_there_fails_the_dry_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    missing = tmp_path / "models" / "mine"
    argv = [
        "examples/lora-causal-lm.yaml",
        f"model.name_or_path={missing}",
        f"run.output_dir={tmp_path / 'o'}",
    ]
    code, text = _dry_run(argv, monkeypatch, capsys)
    assert code == 2, text
    errors = [ln for ln in text.splitlines() if re.search(r"\berror:", ln)]
    assert len(errors) == 1 and f"model path {missing} not found" in errors[0]
    # another machine's plan (--facts): the folder may be there, this one says it is not here
    assert hub.locate(str(missing), here=False) == hub.Source(
        "folder", f"model path {missing} is not on this machine"
    )
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(XtrainError, match="is a file, not a model folder"):
        hub.locate(str(tmp_path / "weights.bin"))
