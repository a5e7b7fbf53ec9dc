"""Files the way Windows PowerShell 5.1 writes them: configs, data files, facts snapshots.

``>`` and ``Out-File`` write UTF-16 LE with a BOM; ``Out-File -Encoding utf8`` UTF-8 with a BOM;
``Set-Content`` the ANSI code page (cp1252) without one; all with CRLF line ends. BOM-marked files
are read; ANSI bytes are refused with one line naming the file and how to save it as UTF-8.
"""

from __future__ import annotations

import codecs
import json
import sys
from pathlib import Path

import pytest
from conftest import MACHINES_DIR
from support import warm

from xtrain import encoding
from xtrain.errors import XtrainError
from xtrain.machine.facts import Facts


def powershell_bytes(text: str, how: str) -> bytes:
    """``text`` as Windows PowerShell 5.1 would save it."""
    crlf = text.replace("\r\n", "\n").replace("\n", "\r\n")
    if how == "out-file":  # `>` and Out-File: UTF-16 LE with a BOM
        return codecs.BOM_UTF16_LE + crlf.encode("utf-16-le")
    if how == "utf8-bom":  # Out-File -Encoding utf8
        return codecs.BOM_UTF8 + crlf.encode("utf-8")
    if how == "utf16-be":
        return codecs.BOM_UTF16_BE + crlf.encode("utf-16-be")
    if how == "utf8":
        return crlf.encode("utf-8")
    if how == "set-content":  # the ANSI code page
        return crlf.encode("cp1252")
    raise ValueError(how)


READABLE = ["utf8", "utf8-bom", "out-file", "utf16-be"]


# -- the shared reader -------------------------------------------------------------------------------
@pytest.mark.parametrize("how", READABLE)
def test_decode_reads_every_marked_encoding(how):
    text = "name: Jörg\ncity: Zürich – café\n"
    got = encoding.decode(powershell_bytes(text, how), "f.yaml", "config file")
    assert got.replace("\r\n", "\n") == text


def test_decode_refuses_ansi_with_one_line():
    with pytest.raises(XtrainError) as e:
        encoding.decode(powershell_bytes("name: Jörg\n", "set-content"), "C:/x/f.yaml", "config file")
    line = e.value.one_line()
    assert "\n" not in line and "C:/x/f.yaml" in line and "not UTF-8" in line
    assert "Set-Content -Encoding utf8" in line and "byte 0xf6" in line


def test_ascii_in_the_ansi_code_page_is_just_utf8():
    assert encoding.decode(powershell_bytes("a: 1\n", "set-content"), "f", "x") == "a: 1\r\n"


def test_utf16_without_bom_is_recognised():
    assert encoding.decode("a: 1\n".encode("utf-16-le"), "f", "x") == "a: 1\n"


# -- train configs -------------------------------------------------------------------------------------
CONFIG = """\
# Jörg's run
model:
  name_or_path: builtin:tiny-llama
data:
  train: builtin:stories
run:
  output_dir: runs/zürich
  max_steps: 3
"""


@pytest.mark.parametrize("how", READABLE)
def test_config_in_each_encoding_loads(tmp_path, how):
    from xtrain.config.loading import _read_yaml

    path = tmp_path / "train.yaml"
    path.write_bytes(powershell_bytes(CONFIG, how))
    data = _read_yaml(path)
    assert data["run"] == {"output_dir": "runs/zürich", "max_steps": 3}
    assert data["model"]["name_or_path"] == "builtin:tiny-llama"


def test_config_in_ansi_is_refused_in_one_line(tmp_path):
    from xtrain.config.loading import _read_yaml

    path = tmp_path / "train.yaml"
    path.write_bytes(powershell_bytes(CONFIG, "set-content"))
    with pytest.raises(XtrainError) as e:
        _read_yaml(path)
    assert str(path) in e.value.one_line() and "UTF-8" in e.value.one_line()


def test_example_config_saved_by_out_file_loads_like_the_original(tmp_path):
    from xtrain.config.loading import config_to_dict
    from xtrain.tasks.validation import load_config

    example = Path(__file__).parent.parent / "examples" / "lora-causal-lm.yaml"
    if not example.exists():
        pytest.skip("no example config")
    copy = tmp_path / example.name
    copy.write_bytes(powershell_bytes(example.read_text(encoding="utf-8"), "out-file"))
    for rel in ("data",):  # relative data paths resolve next to the config
        if (example.parent / rel).exists():
            (tmp_path / rel).symlink_to(example.parent / rel)
    try:
        original = config_to_dict(load_config(str(example), []))
    except XtrainError:
        pytest.skip("the example needs files not present here")
    got = config_to_dict(load_config(str(copy), []))
    for section in ("model", "lora", "optim", "batch", "run"):
        assert got[section] == original[section], section


# -- data files ------------------------------------------------------------------------------------------
ROWS = [{"text": "Grüße aus Zürich", "label": "é"}, {"text": "naïve café", "label": "ü"}]


def _data_text(kind: str) -> str:
    if kind == "jsonl":
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ROWS)
    if kind == "json":
        return json.dumps(ROWS, ensure_ascii=False, indent=2) + "\n"
    if kind == "csv":
        return "text,label\n" + "".join(f"{r['text']},{r['label']}\n" for r in ROWS)
    raise ValueError(kind)


@pytest.fixture
def xtrain_cache(tmp_path, monkeypatch):
    cache = tmp_path / "xtrain-cache"
    monkeypatch.setenv("XTRAIN_CACHE", str(cache))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    return cache


@pytest.mark.parametrize("kind", ["jsonl", "json", "csv"])
@pytest.mark.parametrize("how", READABLE)
def test_data_file_in_each_encoding_loads(tmp_path, xtrain_cache, kind, how):
    from xtrain.data.sources import load_source

    path = tmp_path / f"train.{kind}"
    path.write_bytes(powershell_bytes(_data_text(kind), how))
    ds = load_source(str(path))
    assert ds.column_names == ["text", "label"]  # no "\ufefftext" column from a BOM
    assert ds.to_list() == ROWS
    copies = list((xtrain_cache / "utf8").glob("*")) if (xtrain_cache / "utf8").exists() else []
    assert (copies == []) == (how == "utf8")  # only non-plain files get a cached UTF-8 copy
    if copies:
        assert not copies[0].read_bytes().startswith(codecs.BOM_UTF8)
        assert path.read_bytes() == powershell_bytes(_data_text(kind), how)  # the user's file is untouched


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_data_file_in_ansi_is_refused_in_one_line(tmp_path, xtrain_cache, kind):
    from xtrain.data.sources import load_source

    path = tmp_path / f"train.{kind}"
    path.write_bytes(powershell_bytes(_data_text(kind), "set-content"))
    with pytest.raises(XtrainError) as e:
        load_source(str(path))
    line = e.value.one_line()
    assert "\n" not in line and str(path) in line and "not UTF-8" in line and "-Encoding utf8" in line


def test_ansi_byte_deep_in_a_big_file_is_refused_with_its_offset(tmp_path, xtrain_cache, monkeypatch):
    from xtrain.data.sources import load_source

    monkeypatch.setattr(encoding, "CHUNK_BYTES", 64)
    path = tmp_path / "train.jsonl"
    rows = [{"text": f"plain ascii row number {i}"} for i in range(20)] + [{"text": "café"}]
    path.write_bytes("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("cp1252"))
    with pytest.raises(XtrainError) as e:
        load_source(str(path))
    line = e.value.one_line()
    assert str(path) in line and "not UTF-8" in line
    assert f"byte 0xe9 at offset {path.read_bytes().index(b'caf') + 3}" in line


def test_transcoded_copy_is_reused(tmp_path, xtrain_cache):
    path = tmp_path / "train.jsonl"
    path.write_bytes(powershell_bytes(_data_text("jsonl"), "out-file"))
    first = encoding.utf8_copy(path, "data file")
    assert first != path and first.read_bytes() == _data_text("jsonl").replace("\n", "\r\n").encode()
    mtime = first.stat().st_mtime_ns
    assert encoding.utf8_copy(path, "data file") == first and first.stat().st_mtime_ns == mtime


# -- facts snapshots ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", READABLE)
def test_facts_snapshot_in_each_encoding_loads(tmp_path, how):
    src = MACHINES_DIR / "windows-cpu-torch-with-driver.json"
    path = tmp_path / "facts.json"
    path.write_bytes(powershell_bytes(src.read_text(encoding="utf-8"), how))
    assert Facts.load(path) == Facts.load(src)


def test_facts_snapshot_in_ansi_is_refused(tmp_path):
    src = json.loads((MACHINES_DIR / "windows-2x4090.json").read_text(encoding="utf-8"))
    src["python_executable"] = "C:\\Users\\Jörg\\.venv\\Scripts\\python.exe"
    path = tmp_path / "facts.json"
    path.write_bytes(powershell_bytes(json.dumps(src, ensure_ascii=False), "set-content"))
    with pytest.raises(XtrainError) as e:
        Facts.load(path)
    assert str(path) in e.value.one_line() and "not UTF-8" in e.value.one_line()


def test_doctor_reads_a_snapshot_saved_with_powershell_redirect(tmp_path):
    """`xtrain doctor --json > facts.json` in PowerShell 5.1 writes UTF-16: doctor reads it back."""
    src = MACHINES_DIR / "windows-2x4090.json"
    doc = warm.run(
        [sys.executable, "-m", "xtrain", "doctor", "--facts", str(src), "--json"],
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
    ).stdout
    path = tmp_path / "facts.json"
    path.write_bytes(powershell_bytes(doc, "out-file"))  # what `... --json > facts.json` leaves
    assert Facts.load(path) == Facts.load(src)
    done = warm.run(
        [sys.executable, "-m", "xtrain", "doctor", "--facts", str(path), "--json"],
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["facts"]["hostname"] == "DESKTOP-7Q2K9LM"
    path.write_bytes(powershell_bytes(src.read_text(encoding="utf-8").replace("alex", "Jörg"), "set-content"))
    done = warm.run(
        [sys.executable, "-m", "xtrain", "doctor", "--facts", str(path)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "not UTF-8" in done.stderr and "Traceback" not in done.stderr
