"""Every place xtrain writes, on a read-only, full or forbidden disk: one line naming the place and
the variable, key or option that moves it, exit 2, nothing of what was there lost and nothing
half-written left (xtrain.atomic: ``Place``, ``writing``, ``CannotWrite``).

Tests run as root, for whom a chmod'ed folder is writable, and CI may not mount a read-only
file system: ``refusing`` makes every create or write under a folder fail with the errno a
read-only (EROFS), full (ENOSPC) or forbidden (EACCES) disk gives, at the calls Python makes
(``os.mkdir``, ``os.open``, ``open``, ``os.replace``/``os.rename``). The two cases of issue 41
(a read-only HOME, a read-only XTRAIN_CACHE) also go through the CLI. Checked by hand on a real
read-only tmpfs (``mount -t tmpfs -o ro``): the same lines."""

from __future__ import annotations

import builtins
import errno
import io
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from xtrain import atomic
from xtrain.errors import XtrainError

ERRNOS = {"read-only": errno.EROFS, "full": errno.ENOSPC, "forbidden": errno.EACCES}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


@contextmanager
def refusing(root: Path, code: int, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every create or write under ``root`` fails with ``code``, as on a disk that refuses them."""
    root = root.resolve()

    def under(path: object) -> bool:
        if isinstance(path, int):
            return False
        return Path(os.path.abspath(os.fsdecode(path))).is_relative_to(root)  # type: ignore[arg-type]

    def refuse(path: object) -> OSError:
        return OSError(code, os.strerror(code), os.fsdecode(path))  # type: ignore[arg-type]

    real_mkdir, real_os_open, real_open = os.mkdir, os.open, builtins.open
    real_replace, real_rename = os.replace, os.rename

    def mkdir(path, *args, **kwargs):
        if under(path):
            raise refuse(path)
        return real_mkdir(path, *args, **kwargs)

    def os_open(path, flags, *args, **kwargs):
        if flags & WRITE_FLAGS and under(path):
            raise refuse(path)
        return real_os_open(path, flags, *args, **kwargs)

    def open_(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+") and under(file):
            raise refuse(file)
        return real_open(file, mode, *args, **kwargs)

    def replace(src, dst, *args, **kwargs):
        if under(dst):
            raise refuse(dst)
        return real_replace(src, dst, *args, **kwargs)

    def rename(src, dst, *args, **kwargs):
        if under(dst):
            raise refuse(dst)
        return real_rename(src, dst, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(os, "mkdir", mkdir)
        m.setattr(os, "open", os_open)
        m.setattr(builtins, "open", open_)
        m.setattr(io, "open", open_)
        m.setattr(os, "replace", replace)
        m.setattr(os, "rename", rename)
        yield


@dataclass(frozen=True)
class Case:
    """One place: ``arrange(tmp, monkeypatch)`` returns (the folder that refuses, the write)."""

    name: str
    moved_by: str  # what the line must name
    arrange: Callable[[Path, pytest.MonkeyPatch], tuple[Path, Callable[[], object]]]


def _builtin_home(tmp: Path, mp: pytest.MonkeyPatch):
    from xtrain import builtin

    mp.setenv("HOME", str(tmp / "home"))
    mp.delenv("XTRAIN_CACHE", raising=False)
    return tmp / "home", lambda: builtin.ensure_builtin_data("builtin:sentiment")


def _builtin_cache(tmp: Path, mp: pytest.MonkeyPatch):
    from xtrain import builtin

    mp.setenv("XTRAIN_CACHE", str(tmp / "cache"))
    return tmp / "cache", lambda: builtin.ensure_builtin_data("builtin:sentiment")


def _utf8_copies(tmp: Path, mp: pytest.MonkeyPatch):
    from xtrain import encoding

    mp.setenv("XTRAIN_CACHE", str(tmp / "cache"))
    data = tmp / "bom.jsonl"
    data.write_bytes(b'\xef\xbb\xbf{"text": "a"}\n')  # a BOM: xtrain reads a UTF-8 copy of it
    return tmp / "cache", lambda: encoding.utf8_copy(data, "data file")


def _datasets_cache(tmp: Path, mp: pytest.MonkeyPatch):
    import datasets

    from xtrain.data.sources import load_source

    mp.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp / "datasets"))
    data = tmp / "rows.jsonl"
    data.write_text('{"text": "a", "label": "positive"}\n', encoding="utf-8")
    return tmp / "datasets", lambda: load_source(str(data))


def _tokenized(tmp: Path, mp: pytest.MonkeyPatch):
    import datasets

    from xtrain.data.encoded import Encoding, encode
    from xtrain.data.sources import load_source

    mp.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp / "datasets"))
    data = tmp / "rows.jsonl"
    data.write_text('{"text": "a"}\n{"text": "b"}\n', encoding="utf-8")
    ds = load_source(str(data))  # its Arrow copy written; the map's cache file goes next to it
    counting = Encoding("counting", lambda batch: {"n": [len(t) for t in batch["text"]]}, {}, (tmp.name,),
                        with_indices=False)  # fmt: skip
    return tmp / "datasets", lambda: encode(ds, counting, "counting")


def _hub_cache(tmp: Path, mp: pytest.MonkeyPatch):
    import huggingface_hub.constants
    import transformers

    from xtrain.model.load import load_config

    hub = tmp / "hub"
    mp.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))

    def download(*args, **kwargs):  # what a download into the hub cache meets
        (hub / "models--someone--model").mkdir(parents=True)

    mp.setattr(transformers.AutoConfig, "from_pretrained", download)
    return hub, lambda: load_config("someone/model", trust_remote_code=False)


def _run_lock(tmp: Path, mp: pytest.MonkeyPatch):
    from xtrain.runtime import lock

    return tmp / "runs", lambda: lock.acquire(tmp / "runs" / "my-run")


def _final_outputs(tmp: Path, mp: pytest.MonkeyPatch):
    from xtrain.train.checkpoint.save import write_on_main

    out = tmp / "run"
    out.mkdir()
    one = SimpleNamespace(is_main_process=True, num_processes=1)
    write = lambda: atomic.write_text(out / "train_result.json", "{}")  # noqa: E731
    return out, lambda: write_on_main(one, "the final outputs", out, write)  # type: ignore[arg-type]


def _temp(tmp: Path, mp: pytest.MonkeyPatch, folder: Callable[[], object]):
    mp.setattr(tempfile, "tempdir", str(tmp / "temp"))
    (tmp / "temp").mkdir()
    return tmp / "temp", folder


def _report_dir(tmp: Path, mp: pytest.MonkeyPatch):
    from xtrain.launch import launcher

    def enter():
        with launcher._reports():
            pass

    return _temp(tmp, mp, enter)


def _temporary_folder(tmp: Path, mp: pytest.MonkeyPatch):
    return _temp(tmp, mp, lambda: atomic.temporary_folder("xtrain-test-").cleanup())


def _configure_check(tmp: Path, mp: pytest.MonkeyPatch):
    from xtrain.launch.accelerate_config import validate_dict

    return _temp(tmp, mp, lambda: validate_dict({"distributed_type": "NO", "num_processes": 1}))


def _predict_output(tmp: Path, mp: pytest.MonkeyPatch):
    from xtrain.commands.predict import write_results

    return tmp / "preds", lambda: write_results(tmp / "preds" / "out.jsonl", [{"prediction": "a"}])


def _doctor_save(tmp: Path, mp: pytest.MonkeyPatch):
    from xtrain.commands.doctor import write_snapshot

    (tmp / "facts").mkdir()
    return tmp / "facts", lambda: write_snapshot(tmp / "facts" / "machine.json", "{}")


def _configure_output(tmp: Path, mp: pytest.MonkeyPatch):
    from xtrain.launch.accelerate_config import write_text_safely

    return tmp / "cfg", lambda: write_text_safely("x: 1\n", tmp / "cfg" / "accelerate.yaml")


def _report_output(tmp: Path, mp: pytest.MonkeyPatch):
    from xtrain.report.page import write

    (tmp / "reports").mkdir()
    return tmp / "reports", lambda: write(tmp / "reports" / "report.html", "<html></html>", force=False)


PLACES = [
    Case("built-in cache, read-only HOME", "XTRAIN_CACHE", _builtin_home),
    Case("built-in cache, XTRAIN_CACHE", "XTRAIN_CACHE", _builtin_cache),
    Case("UTF-8 copies of data files", "XTRAIN_CACHE", _utf8_copies),
    Case("datasets cache: a data file's Arrow copy", "HF_DATASETS_CACHE", _datasets_cache),
    Case("datasets cache: tokenized rows", "HF_DATASETS_CACHE", _tokenized),
    Case("Hugging Face hub cache", "HF_HUB_CACHE", _hub_cache),
    Case("output folder: the run lock", "run.output_dir", _run_lock),
    Case("output folder: final outputs", "run.output_dir", _final_outputs),
    Case("workers' report folder", "TMPDIR", _report_dir),
    Case("temporary folder", "TMPDIR", _temporary_folder),
    Case("temporary folder: configure --dry-run's check", "TMPDIR", _configure_check),
    Case("predict --output", "--output", _predict_output),
    Case("report --output (a run folder on a read-only share)", "--output", _report_output),
    Case("doctor --save", "--save", _doctor_save),
    Case("configure --output", "--output", _configure_output),
]


def test_the_table_holds_every_place_xtrain_names() -> None:
    """A place added to xtrain.atomic.PLACES gets a row here (by the variable that moves it)."""
    covered = {case.moved_by for case in PLACES}
    assert {p.moved_by.split(" ")[0] for p in atomic.PLACES} <= covered


@pytest.mark.parametrize("fault", list(ERRNOS))
@pytest.mark.parametrize("case", PLACES, ids=[c.name for c in PLACES])
def test_a_refused_write_is_one_line_naming_what_moves_it(
    case: Case, fault: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, write = case.arrange(tmp_path, monkeypatch)
    root.mkdir(parents=True, exist_ok=True)
    (root / "kept.txt").write_text("the user's", encoding="utf-8")  # what was there before
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    with refusing(root, ERRNOS[fault], monkeypatch), pytest.raises(XtrainError) as raised:
        write()
    line = raised.value.one_line()
    assert "\n" not in line and raised.value.exit_code == 2, line
    assert case.moved_by in line, line
    words = atomic.WRITE_FAULTS[ERRNOS[fault]]
    assert words in line or os.strerror(ERRNOS[fault]) in line or "no candidate" in line, line
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before  # nothing half-written
    assert (root / "kept.txt").read_text(encoding="utf-8") == "the user's"


def test_an_unreadable_input_is_not_taken_for_a_cache_that_cannot_be_written(tmp_path: Path) -> None:
    """The filesystem refusing a file elsewhere (the user's data, not the place) keeps its error."""
    error = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "data" / "train.jsonl"))
    assert atomic.cannot_write(atomic.DATASETS_CACHE, tmp_path / "cache", error) is None
    under = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "cache" / "x.arrow"))
    refused = atomic.cannot_write(atomic.DATASETS_CACHE, tmp_path / "cache", under)
    assert isinstance(refused, atomic.CannotWrite) and refused.exit_code == 2
    above = OSError(errno.EROFS, "Read-only file system", str(tmp_path))  # mkdir of a parent
    assert atomic.cannot_write(atomic.DATASETS_CACHE, tmp_path / "cache", above) is not None


def test_no_writable_temporary_folder_at_all_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def none(*args, **kwargs):
        raise FileNotFoundError(errno.ENOENT, "No usable temporary directory found in ['/tmp']")

    monkeypatch.setattr(tempfile, "TemporaryDirectory", none)
    with pytest.raises(atomic.CannotWrite, match=r"temporary folder .*\(set TMPDIR"):
        atomic.temporary_folder("xtrain-report-", atomic.REPORT_DIR)


@pytest.mark.parametrize("moved", ["HOME", "XTRAIN_CACHE"])
def test_a_read_only_home_or_cache_is_one_line_from_the_cli(
    moved: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 41: the built-in job's first build on a read-only HOME (nothing cached) or an empty
    read-only XTRAIN_CACHE ended in a PermissionError traceback."""
    from xtrain.cli import main
    from xtrain.tasks import JOBS_DIR

    ro = tmp_path / "ro"
    ro.mkdir()
    if moved == "HOME":
        monkeypatch.setenv("HOME", str(ro))
        monkeypatch.delenv("XTRAIN_CACHE", raising=False)
    else:
        monkeypatch.setenv("XTRAIN_CACHE", str(ro))
    out = tmp_path / "run"
    with refusing(ro, errno.EROFS, monkeypatch):
        code = main(["train", str(JOBS_DIR / "quickstart.yaml"), "--dry-run", f"run.output_dir={out}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and "PermissionError" not in err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "read-only" in errors[0] and "XTRAIN_CACHE" in errors[0], err
    assert not any(ro.iterdir()) and not out.exists()


def test_faults_are_recognised_as_before() -> None:
    """train/checkpoint/write_faults.py reads them through xtrain.atomic's one recogniser."""
    from xtrain.train.checkpoint import write_faults

    assert write_faults.disk_fault is atomic.disk_fault
