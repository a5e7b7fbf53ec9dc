# ruff: noqa: E501  (the table reads best one case per line)
"""One table of bad inputs (config, data, CLI, environment): each ends in exactly one error line
containing the expected text, the expected exit code, no traceback, and the finished run in the
output folder untouched. docs/reliability.md shows the same table.

Most cases run in-process through the real entry points (``xtrain.run.main``, ``xtrain.cli.main``)
because config errors come before any training; the ``sub`` cases run as real subprocesses
(``python -m xtrain.run`` and the ``xtrain`` console script) to check the process boundary.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from support.jobs import REPO, Job, make_job, run_xtrain

# id: (entry, argv, extra env, expected text in the error line, exit code, subprocess?)
#   entry "run": python -m xtrain.run, "cli": xtrain;  {c} config, {r} job folder, {o} finished output
CASES: dict[str, tuple[str, list[str], dict[str, str], str, int, bool]] = {
    # -- config file --------------------------------------------------------------------------------
    "config file missing": ("run", ["--config", "{r}/nope.yaml"], {}, "config file {r}/nope.yaml not found", 2, True),
    "config is a folder": ("run", ["--config", "{r}"], {}, "is a folder, not a YAML file", 2, False),
    "config not YAML": ("run", ["--config", "{r}/broken.yaml"], {}, "is not valid YAML at line", 2, False),
    "config is a list": ("run", ["--config", "{r}/list.yaml"], {}, "must be a mapping of sections", 2, False),
    "python tag in YAML": ("run", ["--config", "{r}/evil.yaml"], {}, "could not determine a constructor", 2, True),
    "YAML key twice": ("run", ["--config", "{r}/dup.yaml"], {}, "config file {r}/dup.yaml has the key 'run' twice (lines", 2, False),
    "YAML nested too deep": ("run", ["--config", "{r}/deep.yaml"], {}, "config file {r}/deep.yaml nests deeper than 64 levels", 2, False),
    "override nested too deep": ("run", ["--config", "{c}", "data.train=" + "[" * 70], {}, "the value nests deeper than 64 levels", 2, False),
    "unknown section": ("run", ["--config", "{r}/typo.yaml"], {}, "unknown section 'modle'", 2, False),
    "config is /dev/null": ("run", ["--config", "/dev/null"], {}, "config path /dev/null is not a regular file", 2, False),
    "config not UTF-8": ("run", ["--config", "{r}/latin1.yaml"], {}, "config file {r}/latin1.yaml is not UTF-8: byte 0xe9", 2, False),
    "YAML alias bomb": ("run", ["--config", "{r}/laughs.yaml"], {}, "config file {r}/laughs.yaml expands to more than 10000 values through its aliases (*name) at line 7", 2, False),
    "YAML alias in its own anchor": ("run", ["--config", "{c}", "data.train=&a [*a]"], {}, "the value has an alias inside its own anchor's value", 2, False),
    # -- config values and overrides ----------------------------------------------------------------
    "unknown key": ("run", ["--config", "{c}", "optim.learning_rate=1"], {}, "unknown key 'optim.learning_rate'", 2, False),
    "not a number": ("run", ["--config", "{c}", "run.max_steps=abc"], {}, "run.max_steps must be a positive integer", 2, False),
    "negative lr": ("run", ["--config", "{c}", "optim.lr=-1"], {}, "optim.lr must be a positive number", 2, False),
    "unknown precision": ("run", ["--config", "{c}", "run.mixed_precision=fp8"], {}, "run.mixed_precision must be one of", 2, False),
    "unknown task": ("run", ["--config", "{c}", "model.task=translate"], {}, "model.task must be one of", 2, False),
    "custom task unset": ("run", ["--config", "{c}", "model.task=custom"], {}, "model.custom is not set", 2, False),
    "custom spec malformed": ("run", ["--config", "{c}", "model.task=custom", "model.custom=nocolon"], {}, "must look like module:function", 2, False),
    "a long value cut in the line": ("run", ["--config", "{c}", "data.text_column=[" + "'x'," * 5000 + "]"], {}, "data.text_column must be a string, got ['x', 'x', 'x',", 2, False),
    "override without section": ("run", ["--config", "{c}", "max_steps=3"], {}, "must look like section.key=value", 2, False),
    "prompt without response": ("run", ["--config", "{c}", "data.prompt_column=q"], {}, "go together", 2, False),
    "lr scaling without base": ("run", ["--config", "{c}", "optim.lr_scaling=linear"], {}, "needs optim.base_global_batch", 2, False),
    "huge seed": ("run", ["--config", "{c}", "run.seed=99999999999"], {}, "run.seed must be an integer in 0..4294967295", 2, False),
    "huge collective timeout": ("run", ["--config", "{c}", "run.collective_timeout_s=99999999999"], {}, "run.collective_timeout_s must be a whole number of seconds in 1..604800", 2, False),
    "negative keep_checkpoints": ("run", ["--config", "{c}", "run.keep_checkpoints=-1"], {}, "run.keep_checkpoints must be an integer >= 0", 2, False),
    "global batch not divisible": ("run", ["--config", "{c}", "batch.global_batch=10"], {}, "global batch 10 is not divisible", 2, True),
    # -- data and model -----------------------------------------------------------------------------
    "missing data file": ("run", ["--config", "{c}", "data.train={r}/nope.jsonl", "run.output_dir={r}/fresh-nope"], {}, "data file {r}/nope.jsonl not found", 2, True),
    "wrong column": ("run", ["--config", "{c}", "data.text_column=body", "run.output_dir={r}/fresh-col"], {}, "text rows need 'body'", 2, False),
    "numeric text column": ("run", ["--config", "{c}", "data.train={r}/numbers.jsonl", "run.output_dir={r}/fresh-num"], {}, "column 'text' of {r}/numbers.jsonl holds int64 values, not text", 2, False),
    "empty CSV": ("run", ["--config", "{c}", "data.train={r}/empty.csv", "run.output_dir={r}/fresh-empty"], {}, "data file {r}/empty.csv is empty", 2, False),
    "header-only CSV": ("run", ["--config", "{c}", "data.train={r}/header.csv", "run.output_dir={r}/fresh-header"], {}, "data file {r}/header.csv has no rows", 2, False),
    "max_length above the model": ("run", ["--config", "{c}", "data.max_length=100000", "run.output_dir={r}/fresh-len"], {}, "data.max_length=100000 is above the model's limit of 512 positions", 2, False),
    "target_modules match nothing": ("run", ["--config", "{c}", "lora.target_modules=[nomatch]", "run.output_dir={r}/fresh-tm"], {}, "lora.target_modules ['nomatch'] not found in the model", 2, False),
    "target_modules with a typo": ("run", ["--config", "{c}", "lora.target_modules=[q_proj,v_prj]", "run.output_dir={r}/fresh-tm2"], {}, "lora.target_modules ['v_prj'] not found in the model (did you mean 'v_proj'?", 2, False),
    "generation past the decoder": ("run", ["--config", "{c}", "model.task=image-to-text", "model.name_or_path=builtin:tiny-trocr", "data.train=builtin:ocr-lines", "data.eval=null", "data.max_length=24", "generation.max_new_tokens=128", "run.output_dir={r}/fresh-ocr"], {}, "generation.max_new_tokens=128 plus a prompt of up to 1 token is above the decoder's limit of 64 positions", 2, False),
    "labels mix numbers and names": ("run", ["--config", "{c}", "model.task=seq-cls", "model.name_or_path=builtin:tiny-bert", "data.train={r}/mixed-labels.jsonl", "data.eval=null", "run.output_dir={r}/fresh-lab"], {}, "the label column mixes types (number 1, str 'pos')", 2, False),
    "num_labels disagrees with the labels": ("run", ["--config", "{c}", "model.task=seq-cls", "model.name_or_path=builtin:tiny-bert", "data.train={r}/named-labels.jsonl", "data.eval=null", "model.num_labels=5", "run.output_dir={r}/fresh-nl"], {}, "the data has 2 labels but model.num_labels=5", 2, False),
    "text column holds lists": ("run", ["--config", "{c}", "data.train={r}/lists.jsonl", "data.eval=null", "run.output_dir={r}/fresh-list"], {}, "column 'text' of {r}/lists.jsonl holds lists, not text", 2, False),
    "absurd LoRA rank": ("run", ["--config", "{c}", "lora.r=1e30"], {}, "lora.r must be an integer in 1..4096", 2, False),
    "absurd num_labels": ("run", ["--config", "{c}", "model.task=seq-cls", "model.num_labels=1e30"], {}, "model.num_labels must be an integer in 2..1000000", 2, False),
    "unsafe chat template": ("run", ["--config", "{c}", "data.train={r}/chat.jsonl", "data.eval=null", "data.chat_template={{% for m in messages %}}{{{{ m.__class__.__mro__ }}}}{{% endfor %}}", "run.output_dir={r}/fresh-chat"], {}, "data.chat_template is unsafe: the sandbox refused it", 2, False),
    "image bomb": ("run", ["--config", "{c}", "model.task=image-to-text", "model.name_or_path=builtin:tiny-trocr", "data.train={r}/bomb.csv", "data.eval=null", "data.max_length=24", "generation.max_new_tokens=16", "batch.per_device=1", "batch.global_batch=2", "run.output_dir={r}/fresh-bomb"], {}, "cannot read image {r}/bomb.png (row 1 of {r}/bomb.csv): it declares 10000000000 pixels, above data.max_image_pixels=89478485", 2, False),
    "audio with no samples": ("run", ["--config", "{c}", "model.task=speech-to-text", "model.name_or_path=builtin:tiny-whisper", "data.train={r}/clips.csv", "data.eval=null", "data.max_length=24", "generation.max_new_tokens=16", "run.output_dir={r}/fresh-clips"], {}, "audio {r}/empty.wav (row 1 of {r}/clips.csv): no samples, an empty recording", 2, False),
    "unknown data format": ("run", ["--config", "{c}", "data.train={r}/data.bin", "run.output_dir={r}/fresh-bin"], {}, "cannot tell the format", 2, False),
    "missing model path": ("run", ["--config", "{c}", "model.name_or_path={r}/no-model"], {}, "model path {r}/no-model not found", 2, False),
    "custom module missing": ("run", ["--config", "{c}", "model.task=custom", "model.custom=no_such_mod_xyz:build", "run.output_dir={r}/fresh"], {}, "cannot import the custom task module", 2, False),
    # -- outputs and resume -------------------------------------------------------------------------
    "output dir is a file": ("run", ["--config", "{c}", "run.output_dir={r}/train.jsonl/out"], {}, "is a file", 2, False),
    "resume=off over a finished run": ("run", ["--config", "{c}", "run.resume=off"], {}, "resume=off would overwrite them", 2, True),
    "resume path missing": ("run", ["--config", "{c}", "run.resume={r}/step-9"], {}, "checkpoint {r}/step-9 does not exist", 2, False),
    "resume path is a file": ("run", ["--config", "{c}", "run.resume={c}"], {}, "is a file, not a checkpoint folder", 2, False),
    "resume from a partial write": ("run", ["--config", "{c}", "run.resume={r}/step-3.tmp"], {}, "is incomplete", 2, False),
    "checkpoint state of the wrong type": ("run", ["--config", "{c}", "run.resume={r}/typed/step-2"], {}, "checkpoint {r}/typed/step-2 cannot be read: xtrain_state.json: field 'step': an integer expected, got 'two'", 2, False),
    "resume with another LoRA rank": ("run", ["--config", "{c}", "lora.r=8"], {}, "was trained with lora.r=4", 2, False),
    "resume on other data": ("run", ["--config", "{c}", "data.train={r}/eval.jsonl"], {}, "checkpoint {o}/checkpoints/step-2 was trained on another data set: data.train='{r}/train.jsonl', this run has '{r}/eval.jsonl'", 2, False),
    "resume with another model": ("run", ["--config", "{c}", "model.name_or_path=builtin:tiny-llama"], {}, "was trained on another model: model.name_or_path=", 2, False),
    "resume with another lr": ("run", ["--config", "{c}", "run.resume=auto", "optim.lr=0.1"], {}, "was trained with optim.lr=0.005, this run has 0.1", 2, False),
    # -- command line and environment ---------------------------------------------------------------
    "processes zero": ("run", ["--config", "{c}", "--processes", "0"], {}, "--processes must be at least 1", 2, False),
    "override not key=value": ("run", ["--config", "{c}", "oops"], {}, "override 'oops' must look like section.key=value", 2, False),
    "processes vs launcher": ("run", ["--config", "{c}", "--processes", "2"], {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}, "conflicts with the launcher", 2, True),
    "WORLD_SIZE not a number": ("run", ["--config", "{c}"], {"WORLD_SIZE": "two"}, "environment variable WORLD_SIZE='two' is not a whole number", 2, True),
    "RANK not below WORLD_SIZE": ("run", ["--config", "{c}"], {"WORLD_SIZE": "2", "RANK": "5"}, "RANK=5 is not below WORLD_SIZE=2", 2, False),
    "rank 0 whose peers never come": ("run", ["--config", "{c}", "run.collective_timeout_s=2", "run.output_dir={r}/fresh-r0"], {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "{p}"}, "rank 0 of 2 waited for the other processes at 127.0.0.1:{p}, and they never joined", 2, False),
    "rank 1 whose rank 0 never comes": ("run", ["--config", "{c}", "run.collective_timeout_s=2", "run.output_dir={r}/fresh-r1"], {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "{p}"}, "rank 1 of 2 could not reach rank 0 at 127.0.0.1:{p}", 2, False),
    "XTRAIN_PLAN malformed": ("run", ["--config", "{c}"], {"XTRAIN_PLAN": "{oops"}, "XTRAIN_PLAN is not a plan xtrain wrote", 2, False),
    "facts with an impossible value": ("cli", ["doctor", "--facts", "{r}/bad-facts.json"], {}, "facts have an impossible value: cpu_count=0", 2, False),
    "facts nested too deep": ("cli", ["doctor", "--facts", "{r}/deep-facts.json"], {}, "facts file {r}/deep-facts.json nests deeper than 64 levels", 2, False),
    "unknown platform": ("run", ["--config", "{c}"], {"XTRAIN_PLATFORM": "beos"}, "unknown platform 'beos'", 2, False),
    "train: config missing": ("cli", ["train", "{r}/nope.yaml"], {}, "config {r}/nope.yaml not found", 2, True),
    "train: processes not a number": ("cli", ["train", "{c}", "--processes", "abc"], {}, "--processes needs a whole number", 2, False),
    "train: dry run on other data": ("cli", ["train", "{c}", "--dry-run", "data.train={r}/eval.jsonl"], {}, "was trained on another data set: data.train=", 2, False),
    "train: override not key=value": ("cli", ["train", "{c}", "oops"], {}, "override 'oops' must look like section.key=value", 2, False),
}  # fmt: skip


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    """A tiny job, its finished run in ``{r}/out`` (the config's output dir), and bad files."""
    job = make_job(tmp_path_factory.mktemp("bad"), steps=2, save_every=1)
    job.config.write_text(job.config.read_text() + f"  output_dir: {job.root / 'out'}\n")
    proc = run_xtrain([sys.executable, "-m", "xtrain.run", "--config", str(job.config)], job.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = job.root
    (r / "broken.yaml").write_text("model:\n  task: [causal-lm\n")
    (r / "list.yaml").write_text("- model\n- data\n")
    (r / "evil.yaml").write_text(f'model: !!python/object/apply:os.system ["touch {r}/pwned"]\n')
    (r / "typo.yaml").write_text("modle:\n  task: causal-lm\n")
    (r / "data.bin").write_bytes(b"\x00\x01")
    (r / "latin1.yaml").write_bytes(b"model:\n  task: caus\xe9\n")
    (r / "numbers.jsonl").write_text('{"text": 5}\n{"text": 7}\n')
    (r / "chat.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n' * 4
    )
    (r / "lists.jsonl").write_text('{"text": ["a", "b"]}\n{"text": ["c"]}\n')
    (r / "mixed-labels.jsonl").write_text('{"text": "a", "label": 1}\n{"text": "b", "label": "pos"}\n')
    (r / "named-labels.jsonl").write_text('{"text": "a", "label": "neg"}\n{"text": "b", "label": "pos"}\n')
    (r / "empty.csv").write_text("")
    _bad_media(r)
    (r / "header.csv").write_text("text\n")
    from xtrain.machine.facts import Facts

    (r / "bad-facts.json").write_text(Facts(torch_version="2.13.0", cpu_count=0).to_json())
    shutil.copytree(r / "out" / "checkpoints" / "step-2", r / "step-3.tmp")
    (r / "dup.yaml").write_text(job.config.read_text() + "run:\n  max_steps: 9\n")
    (r / "deep.yaml").write_text("model:\n  task: " + "[" * 5000 + "]" * 5000 + "\n")
    (r / "deep-facts.json").write_text('{"launch_env": ' + "[" * 100000 + "]" * 100000 + "}")
    shutil.copytree(r / "out" / "checkpoints" / "step-2", r / "typed" / "step-2")
    state = json.loads((r / "typed" / "step-2" / "xtrain_state.json").read_text())
    (r / "typed" / "step-2" / "xtrain_state.json").write_text(json.dumps({**state, "step": "two"}))
    (r / "step-3.tmp" / "xtrain_state.json").unlink()
    return job


def _bad_media(r: Path) -> None:
    """An image-to-text CSV whose second image is a decompression bomb (a 100000 x 100000 header,
    100 bytes on disk), a speech-to-text CSV whose second clip has no samples, a config whose
    aliases expand nine-fold five times ("billion laughs", 9^5 values from 7 lines)."""
    import numpy as np
    import soundfile
    from PIL import Image
    from support.media import png_declaring

    Image.new("RGB", (32, 16), "white").save(r / "line.png")
    (r / "bomb.png").write_bytes(png_declaring(100_000, 100_000))
    (r / "bomb.csv").write_text("image,text\nline.png,a line\nbomb.png,a bomb\n")
    soundfile.write(r / "word.wav", np.zeros(1600, dtype="float32"), 16000)
    soundfile.write(r / "empty.wav", np.zeros(0, dtype="float32"), 16000)
    (r / "clips.csv").write_text("audio,text\nword.wav,a word\nempty.wav,nothing\n")
    lol = ", ".join(['"lol"'] * 9)
    levels = [f"a0: &a0 [{lol}]"] + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 5)]
    (r / "laughs.yaml").write_text(
        "\n".join(["model:", "  task: seq-cls", *levels, "data:", "  train: *a4"]) + "\n"
    )


def fingerprint(folder: Path) -> dict[str, tuple[float, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_mtime, p.stat().st_size) for p in sorted(folder.rglob("*"))
    }


def _run_in_process(entry: str, argv: list[str], env: dict[str, str], monkeypatch, capsys) -> tuple[int, str]:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for k in (
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "XTRAIN_PLATFORM",
        "MASTER_ADDR",
        "MASTER_PORT",
    ):
        if k not in env:
            monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(REPO)
    if entry == "run":
        from xtrain.run import main

        try:
            code = main(argv)
        except SystemExit as e:  # argparse
            code = int(e.code or 0)
    else:
        from xtrain.cli import main

        code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input(case: str, job: Job, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    entry, argv, extra, expected, code, sub = CASES[case]
    from xtrain.launch.rendezvous import free_port

    fill = {"c": str(job.config), "r": str(job.root), "o": str(job.root / "out"), "p": str(free_port())}
    argv = [a.format(**fill) for a in argv]
    extra = {k: v.replace("{p}", fill["p"]) for k, v in extra.items()}  # others may hold braces
    expected = expected.format(**fill)
    out = job.root / "out"
    before = fingerprint(out)
    if sub:
        cmd = [sys.executable, "-m", "xtrain.run" if entry == "run" else "xtrain", *argv]
        proc = run_xtrain(cmd, {**job.env, **extra}, timeout=120)
        got, err = proc.returncode, proc.stderr
    else:
        got, err = _run_in_process(entry, argv, {**job.env, **extra}, monkeypatch, capsys)
    assert got == code, err[-3000:]
    assert "Traceback" not in err
    errors = [ln for ln in err.splitlines() if re.search(r"\berror:", ln)]
    assert len(errors) == 1, err[-3000:]
    assert expected in errors[0], errors[0]
    # one short line: a user's value is cut (xtrain.errors.shown), however long the input
    assert len(errors[0].replace(str(job.root), "{r}")) <= 400, errors[0]
    assert fingerprint(out) == before, "the finished run was changed"
    assert not (job.root / "pwned").exists()


def test_a_finished_run_run_again_trains_and_writes_nothing(job: Job, monkeypatch, capsys) -> None:
    """The same command on a finished run's folder: one note, exit 0, every file byte for byte
    (and untouched: the same modification times)."""
    import hashlib

    out = job.root / "out"

    def contents() -> dict[str, str]:
        return {
            str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in out.rglob("*")
            if p.is_file()
        }

    before, times = contents(), fingerprint(out)
    for k, v in job.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(REPO)
    from xtrain.run import main

    assert main(["--config", str(job.config)]) == 0
    said = capsys.readouterr()
    assert f"{out} already finished, nothing trained (step 2, every file as it was)" in said.out + said.err
    from xtrain.cli import main as cli

    assert cli(["train", str(job.config), "--dry-run"]) == 0  # the dry run says it too
    assert f"Resume: {out} already finished, nothing to train (step 2)" in capsys.readouterr().out
    assert contents() == before and fingerprint(out) == times


def doc_rows() -> list[str]:
    """The table of docs/reliability.md's "Bad input" section, one row a case (long arguments cut)."""
    from xtrain.errors import shorten

    fill = {"c": "{c}", "r": "{r}", "o": "{o}", "p": "{p}"}
    rows = []
    for n, (name, (entry, argv, env, expected, code, sub)) in enumerate(CASES.items(), 1):
        prog = "python -m xtrain.run" if entry == "run" else "xtrain"
        words = [f"{k}={v}" for k, v in env.items()] + [prog] + [shorten(a.format(**fill)) for a in argv]
        label = name + (" (subprocess)" if sub else "")
        rows.append(f"| {n} | {label} | `{' '.join(words)}` | {code} | {expected.format(**fill)} |")
    return rows


def test_the_docs_show_this_table() -> None:
    doc = (REPO / "docs" / "reliability.md").read_text(encoding="utf-8")
    shown = [ln for ln in doc.splitlines() if re.match(r"^\| \d+ \| ", ln)]
    assert shown == doc_rows(), "regenerate the table: print('\\n'.join(doc_rows()))"


def test_the_table_is_large_enough() -> None:
    assert len(CASES) >= 25
    assert sum(1 for c in CASES.values() if c[5]) >= 5  # real subprocesses
