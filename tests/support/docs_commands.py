"""The machinery of tests/test_docs_commands.py: read the docs' code blocks, classify each command,
run or check it in a session of its own, and check PowerShell/bash syntax.

How a doc is read (the convention; keep docs to it):

- ```` ```bash ```` blocks hold commands, one per line; a trailing ``\\`` continues a line, ``#``
  starts a comment, ``;`` and ``&&`` chain commands. Every command in them must be one of:

  * **run**: ``xtrain ...`` (``xtrain configure`` gets ``--dry-run``, ``xtrain train`` gets
    ``--dry-run``; ``xtrain quickstart`` trains, so its arguments are only parsed), ``export`` /
    ``unset`` (applied to the environment of the commands after it in the same doc), and the
    harmless shell commands in ``RUN_IN_SHELL`` (run with bash);
  * **checked**: a training launch, ``python -m xtrain.run``, ``accelerate launch ... -m
    xtrain.run`` or ``torchrun ... -m xtrain.run``: its arguments go through the launcher's own
    parser and xtrain.run's, and the train config through xtrain's loader, but nothing trains
    (tests/test_launch_modes.py trains through each of them);
  * **skipped**: matched by an entry of the test's ``SKIPPED`` (installs, GPUs, SLURM, sudo, Windows or
    WSL-only programs), or by its ``COVERED_ELSEWHERE`` (run by another test). Each entry must match at
    least one doc line, so the lists hold nothing stale.

  A command that is none of these fails ``test_every_doc_command_is_classified``: run it, check
  it, or add it to ``SKIPPED`` with the reason.
- ```` ```powershell ```` blocks are PowerShell: checked for PowerShell syntax (``$env:NAME =
  "value"``, backtick continuation, no ``export``, ``&&``, ``python3``, ``.venv/bin``, ...). Their
  ``xtrain`` and ``python -m xtrain.run`` lines are run / checked like bash ones.
- ```` ```console ```` blocks are transcripts: ``$ command`` (bash) or ``PS> command``
  (PowerShell) followed by the output the doc shows. The command runs like any other and every
  shown line must appear in its real output, in order and adjacent, except where a ``...`` line
  stands for lines left out. (In PowerShell transcripts ``\\`` and ``/`` count as the same, and a
  launcher's port matches any port: xtrain picks a free one when 29500 is taken.)
- Other blocks (``text``, ``yaml``, ``json``, none) are not commands.

Static checks (parsing only, every page, prose and skipped commands too): every ``xtrain SUB
--option`` and ``-m xtrain.run --option`` names a command and an option the CLI has (read off the
typer app and xtrain.run's parser); a PowerShell line (and, on pages whose reader types PowerShell,
an inline command of the prose) has no unquoted comma list (``--gpus 0,1`` is an array there: the
program gets ``0 1``; runs split it the same way); no line installs the public index's ``xtrain``
(an unrelated project) or uses ``huggingface-cli`` (the hub client ships ``hf``).

Which machine a command describes: a doc about a platform plans for that platform's saved
snapshot (``DOC_MACHINES``; ``--facts tests/fixtures/machines/NAME.json`` is added to ``xtrain
doctor`` / ``xtrain configure`` / ``xtrain train`` lines that do not name one, and PowerShell blocks
plan for Windows). An HTML comment ``<!-- docs-test: machine=NAME -->`` on the line before a block
sets the snapshot for that block (``machine=here`` for this machine).

Every doc runs as one session in a temporary folder holding copies of ``examples/``,
``accelerate_configs/`` and ``tests/fixtures/machines/``, with ``HOME``, ``HF_HOME``,
``XDG_CACHE_HOME`` and ``XTRAIN_CACHE`` inside it: nothing touches the user's ``~/.cache``.
``YOUR.yaml``, ``job.yaml`` and ``train.yaml`` (the docs' placeholders) are copies of
``examples/lora-causal-lm.yaml`` there (with ``examples/data`` beside them: the dry-run reads the
data), and ``node.json`` (a snapshot "saved on a cluster node")
is the 8x A100 fixture.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from support.ps_syntax import unquoted_commas

ROOT = Path(__file__).resolve().parents[2]
MACHINES = ROOT / "tests" / "fixtures" / "machines"
# the one line of a dry run whose hub model is neither cached nor reachable (xtrain.model.hub)
HUB_MODEL_ABSENT = "is not in the Hugging Face cache and the hub cannot be reached"
FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"<!--\s*docs-test:\s*machine=([\w.-]+)\s*-->")


@dataclass(frozen=True)
class Policy:
    """What the docs test decides (tests/test_docs_commands.py): which commands are skipped or
    covered by another test, which shell commands run as they are, and which machine each doc
    plans for."""

    skipped: list[tuple[str, str]]  # (regex searched in the command, reason)
    covered_elsewhere: list[tuple[str, str, str]]  # (doc, regex, the test that runs them)
    run_in_shell: list[str]  # regexes of harmless shell commands, run with bash
    doc_machines: dict[str, str]  # doc -> fixture machine it plans for
    powershell_machine: str  # PowerShell blocks in docs about no one platform
    placeholder_configs: tuple[str, ...]  # the docs' config placeholders: copies of example_config
    placeholder_snapshots: dict[str, str]  # snapshot placeholders -> fixture machine
    example_config: str


# ---------------------------------------------------------------------------------------------
# Reading the docs
# ---------------------------------------------------------------------------------------------
@dataclass
class Block:
    doc: str  # path relative to the repo, e.g. "docs/wsl2.md"
    lang: str
    line: int  # line number of the first line inside the fence
    lines: list[str]
    machine: str | None  # from a docs-test marker; "here" for this machine


@dataclass
class Command:
    doc: str
    line: int
    shell: str  # "bash" | "powershell"
    text: str  # one simple command: continuations joined, comment removed
    machine: str | None = None
    expect: list[str] | None = None  # transcript output (console blocks)

    def where(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


def read_blocks(path: Path) -> list[Block]:
    rel = path.relative_to(ROOT).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i].strip())
        if not m:
            i += 1
            continue
        indent = len(lines[i]) - len(lines[i].lstrip())
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        marker = MARKER.search(lines[j]) if j >= 0 else None
        body: list[str] = []
        k = i + 1
        while k < len(lines) and lines[k].strip() != "```":
            body.append(lines[k][indent:] if lines[k][:indent].strip() == "" else lines[k])
            k += 1
        blocks.append(Block(rel, m.group(1), i + 2, body, marker.group(1) if marker else None))
        i = k + 1
    return blocks


def split_top_level(text: str, shell: str) -> list[str]:
    """``a; b && c`` -> [a, b, c], leaving quoted separators (and pipelines) alone."""
    parts, cur, quote, i = [], "", None, 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = None
            elif ch == "\\" and shell == "bash" and quote == '"' and i + 1 < len(text):
                cur += ch + text[i + 1]
                i += 2
                continue
        elif ch in "'\"":
            quote = ch
        elif ch == ";" or text.startswith("&&", i):
            parts.append(cur)
            cur = ""
            i += 2 if ch == "&" else 1
            continue
        cur += ch
        i += 1
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def strip_comment(text: str, shell: str) -> str:
    """Drop a ``#`` comment that is outside quotes (and starts a word)."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1] in " \t"):
            return text[:i].rstrip()
    return text.rstrip()


def join_continuations(lines: list[str], shell: str) -> list[tuple[int, str]]:
    """(offset of the first line, the logical line) for each logical line of a block."""
    cont = "`" if shell == "powershell" else "\\"
    out: list[tuple[int, str]] = []
    buf, start = "", 0
    for n, raw in enumerate(lines):
        if not buf:
            start = n
        if raw.rstrip().endswith(cont):
            buf += raw.rstrip()[:-1] + " "
            continue
        out.append((start, buf + raw))
        buf = ""
    if buf:
        out.append((start, buf))
    return out


def commands_of(block: Block) -> list[Command]:
    shell = "powershell" if block.lang == "powershell" else "bash"
    out: list[Command] = []
    if block.lang in ("bash", "powershell"):
        for off, logical in join_continuations(block.lines, shell):
            text = strip_comment(logical.strip(), shell)
            for part in split_top_level(text, shell):
                out.append(Command(block.doc, block.line + off, shell, part, block.machine))
    elif block.lang == "console":
        current: Command | None = None
        for off, raw in enumerate(block.lines):
            prompt = next((p for p in ("$ ", "PS> ") if raw.startswith(p)), None)
            if prompt:
                sh = "powershell" if prompt == "PS> " else "bash"
                text = strip_comment(raw[len(prompt) :].strip(), sh)
                current = Command(block.doc, block.line + off, sh, text, block.machine, expect=[])
                out.append(current)
            elif current is not None and current.expect is not None:
                current.expect.append(raw.rstrip())
    return out


def all_blocks(docs: list[Path]) -> list[Block]:
    return [b for path in docs for b in read_blocks(path)]


def all_commands(docs: list[Path]) -> list[Command]:
    return [c for b in all_blocks(docs) for c in commands_of(b)]


# ---------------------------------------------------------------------------------------------
# Classifying a command
# ---------------------------------------------------------------------------------------------
XTRAIN = re.compile(r"^(\.venv[/\\](bin|Scripts)[/\\])?xtrain(\.exe)?(\s|$)")
PYTHON_RUN = re.compile(r"^(\.venv[/\\](bin|Scripts)[/\\])?(python3?|py)(\.exe)? -m xtrain\.run(\s|$)")
ACCELERATE = re.compile(r"^accelerate launch(\s|$)")
TORCHRUN = re.compile(r"^torchrun(\s|$)")
BASH_ENV = re.compile(r"^(export\s+[A-Za-z_]\w*=\S*|unset\s+[A-Za-z_]\w*)$")
PS_ENV = re.compile(r'^(\$env:[A-Za-z_]\w*\s*=\s*"[^"]*"|Remove-Item Env:[A-Za-z_]\w*)$')


@dataclass
class Kind:
    what: str  # run | check | env | shell | skip | covered | syntax-only | unknown
    reason: str = ""


def classify(cmd: Command, policy: Policy) -> Kind:
    text = cmd.text
    for doc, pattern, test in policy.covered_elsewhere:
        if cmd.doc == doc and re.search(pattern, text):
            return Kind("covered", test)
    for pattern, reason in policy.skipped:
        if re.search(pattern, text):
            return Kind("skip", reason)
    if XTRAIN.match(text):
        return Kind("run")
    if PYTHON_RUN.match(text) or ACCELERATE.match(text) or TORCHRUN.match(text):
        return Kind("check")
    if cmd.shell == "bash" and BASH_ENV.match(text):
        return Kind("env")
    if cmd.shell == "powershell" and PS_ENV.match(text):
        return Kind("env")
    if cmd.shell == "bash" and any(re.search(p, text) for p in policy.run_in_shell):
        return Kind("shell")
    if cmd.shell == "powershell":
        return Kind("syntax-only")
    return Kind("unknown")


# ---------------------------------------------------------------------------------------------
# Running a doc as one session
# ---------------------------------------------------------------------------------------------
def ps_split(text: str) -> list[str]:
    """PowerShell-ish argument splitting: whitespace outside quotes; quotes removed. An unquoted
    comma makes an array, whose items a program gets as separate arguments (``--gpus 0,1`` ->
    ``--gpus 0 1``), as PowerShell does."""
    out, cur, quote, have = [], "", None, False
    for ch in text:
        if quote:
            if ch == quote:
                quote = None
            else:
                cur += ch
        elif ch in "'\"":
            quote, have = ch, True
        elif ch.isspace() or ch == ",":
            if cur or have:
                out.append(cur)
            cur, have = "", False
        else:
            cur += ch
    if cur or have:
        out.append(cur)
    return out


def argv_of(cmd: Command) -> list[str]:
    if cmd.shell == "powershell":
        # paths: examples\x.yaml -> examples/x.yaml (this machine is not Windows)
        return [a.replace("\\", "/") for a in ps_split(cmd.text)]
    return shlex.split(cmd.text)


def user_data(examples: Path) -> None:
    """The user's own data that example configs name (``lines/train.csv`` of trocr-printed.yaml,
    ``clips/`` of whisper-small.yaml, the ``captions`` image folder of vit-gpt2-captions.yaml), two
    rows each: ``xtrain train --dry-run`` reads the data (docs/training.md#the-data-check)."""
    import numpy as np
    import soundfile
    from PIL import Image

    for folder in ("lines", "clips", "captions"):
        (examples / folder).mkdir(exist_ok=True)
    for i in range(2):
        Image.new("RGB", (64, 16), (255, 255, 255)).save(examples / "lines" / f"{i}.png")
        Image.new("RGB", (32, 32), (200, 40 * i, 0)).save(examples / "captions" / f"{i}.png")
        tone = np.sin(np.linspace(0, 440 * 2 * np.pi, 8000)).astype("float32")
        soundfile.write(examples / "clips" / f"{i}.wav", tone, 16000)
    for split in ("train", "eval"):
        (examples / "lines" / f"{split}.csv").write_text("image,text\n0.png,hello\n1.png,world\n")
        (examples / "clips" / f"{split}.csv").write_text("audio,text\n0.wav,hello\n1.wav,world\n")
    captions = "file_name,caption\n0.png,a red square\n1.png,an orange square\n"
    (examples / "captions" / "metadata.csv").write_text(captions)


@dataclass
class Session:
    """One doc's commands, in order, in one temporary folder with its own environment."""

    root: Path
    env: dict[str, str]
    policy: Policy
    log: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, tmp: Path, policy: Policy) -> Session:
        work = tmp / "work"
        work.mkdir()
        for rel in ("examples", "accelerate_configs", "tests/fixtures/machines"):
            if (ROOT / rel).is_dir():
                shutil.copytree(ROOT / rel, work / rel)
        user_data(work / "examples")
        example = ROOT / policy.example_config
        for name in policy.placeholder_configs:
            if example.exists():
                shutil.copy(example, work / name)
            else:  # until the examples exist: an empty config is all defaults
                (work / name).write_text("{}\n", encoding="utf-8")
        if (work / "examples" / "data").is_dir():  # the placeholders' data paths, next to them
            shutil.copytree(work / "examples" / "data", work / "data")
        for name, machine in policy.placeholder_snapshots.items():
            shutil.copy(MACHINES / f"{machine}.json", work / name)
        env = {
            k: v
            for k, v in os.environ.items()
            if not (
                k.startswith(("NCCL_", "XTRAIN_", "ACCELERATE_", "TORCH_"))
                or k in ("CUDA_VISIBLE_DEVICES", "USE_LIBUV", "WORLD_SIZE", "RANK", "LOCAL_RANK")
                or k in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")
            )
        }
        home = tmp / "home"
        env.update(
            HOME=str(home),
            USERPROFILE=str(home),
            HF_HOME=str(tmp / "hf"),
            XDG_CACHE_HOME=str(tmp / "cache"),
            XTRAIN_CACHE=str(tmp / "xtrain-cache"),
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            COLUMNS="100",
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        )
        home.mkdir()
        return cls(work, env, policy)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """This session's environment and folder for an in-process command."""
        saved_env, saved_cwd = dict(os.environ), os.getcwd()
        os.environ.clear()
        os.environ.update(self.env)
        os.chdir(self.root)
        try:
            yield
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)

    def machine_file(self, cmd: Command) -> str | None:
        name = cmd.machine or self.policy.doc_machines.get(cmd.doc)
        if name is None and cmd.shell == "powershell":
            name = self.policy.powershell_machine
        if name in (None, "here"):
            return None
        path = Path("tests/fixtures/machines") / f"{name}.json"
        assert (self.root / path).exists(), f"{cmd.where()}: no fixture machine {name!r}"
        return path.as_posix()

    # -- the kinds of commands -------------------------------------------------------------
    def apply_env(self, cmd: Command) -> None:
        if cmd.shell == "bash":
            words = shlex.split(cmd.text)
            if words[0] == "export":
                for w in words[1:]:
                    k, _, v = w.partition("=")
                    self.env[k] = expand(v, self.env)
            else:
                for k in words[1:]:
                    self.env.pop(k, None)
        else:
            m = re.match(r'^\$env:(\w+)\s*=\s*"([^"]*)"$', cmd.text)
            if m:
                self.env[m.group(1)] = m.group(2)
            else:
                self.env.pop(cmd.text.split("Env:", 1)[1], None)

    def run_xtrain(self, cmd: Command) -> str:
        argv = argv_of(cmd)[1:]
        if not argv:
            argv = ["--help"]
        sub = argv[0]
        facts = self.machine_file(cmd)
        if "--help" in argv:
            return self._xtrain(cmd, argv, ok=(0,))
        if sub == "quickstart":
            parse_xtrain(cmd, argv)  # trains for about a minute: the quickstart tests run it
            return ""
        if sub in ("configure", "train") and "--dry-run" not in argv:
            argv.append("--dry-run")
        if "--slurm" in argv:
            facts = None  # the script is planned for the cluster's nodes, not for this doc's machine
        smoke = sub == "doctor" and "--smoke" in argv  # --smoke tests this machine: no snapshot
        if facts and "--facts" not in argv and not smoke and supports(sub, "--facts"):
            argv += ["--facts", facts]
        if sub == "train" and facts and not supports("train", "--facts"):
            # `xtrain train` has no --facts: it probes, so give it the snapshot as the probe's answer
            with snapshot_as_probe(self.root / facts):
                self.log.append(f"(planned for {facts})")
                return self._xtrain(cmd, argv, ok=(0,))
        # doctor exits 1 when it finds an error (some docs show such machines); 2 is bad input
        return self._xtrain(cmd, argv, ok=(0, 1) if sub == "doctor" else (0,))

    def _xtrain(self, cmd: Command, argv: list[str], ok: tuple[int, ...]) -> str:
        from xtrain.cli import main

        out, err = io.StringIO(), io.StringIO()
        with self.active(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
        text = out.getvalue() + err.getvalue()
        self.log.append(f"$ xtrain {' '.join(argv)}  -> {code}")
        if code == 2 and argv[0] == "train" and HUB_MODEL_ABSENT in text:
            return text  # a doc's hub model (Qwen/..., openai/whisper-small): no network or cache here
        assert code in ok, f"{cmd.where()}\n  ran: xtrain {' '.join(argv)}\n  exit {code}\n{text}"
        assert "Traceback" not in text, f"{cmd.where()}\n{text}"
        return text

    def check_launch(self, cmd: Command) -> str:
        """Parse a training launch with the launcher's own parser; load its train config."""
        words = argv_of(cmd)
        with self.active():
            if PYTHON_RUN.match(cmd.text):
                run_args = words[words.index("xtrain.run") + 1 :]
            elif ACCELERATE.match(cmd.text):
                from accelerate.commands.launch import launch_command_parser

                args = parse_or_fail(launch_command_parser(), words[2:], cmd)
                assert args.module and args.training_script == "xtrain.run", cmd.where()
                if args.config_file:
                    from xtrain.launch.accelerate_config import validate

                    validate(args.config_file)
                run_args = list(args.training_script_args)
            else:
                from torch.distributed.run import get_args_parser

                args = parse_or_fail(get_args_parser(), words[1:], cmd)
                assert args.module and args.training_script == "xtrain.run", cmd.where()
                run_args = list(args.training_script_args)
            from xtrain.run import parse_args

            try:
                parsed = parse_args(run_args)
            except SystemExit as e:
                raise AssertionError(f"{cmd.where()}: xtrain.run refused {run_args}") from e
            load_train_config(parsed.config, parsed.overrides, cmd)
        self.log.append(f"checked: {cmd.text}")
        return ""

    def run_shell(self, cmd: Command) -> str:
        res = subprocess.run(
            ["bash", "-c", cmd.text], cwd=self.root, env=self.env, capture_output=True, text=True, timeout=120
        )
        self.log.append(f"$ {cmd.text}  -> {res.returncode}")
        assert res.returncode == 0, f"{cmd.where()}\n{res.stdout}{res.stderr}"
        return res.stdout + res.stderr

    def run(self, cmd: Command) -> None:
        kind = classify(cmd, self.policy)
        if kind.what == "env":
            self.apply_env(cmd)
            return
        output = {
            "run": self.run_xtrain,
            "check": self.check_launch,
            "shell": self.run_shell,
        }.get(kind.what, lambda c: None)(cmd)
        if cmd.expect is not None and kind.what in ("run", "shell"):
            check_transcript(cmd, output or "")


def expand(value: str, env: dict[str, str]) -> str:
    """$NAME and ${NAME} from the session's environment (unset: empty, as in bash)."""
    return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), value)


@contextlib.contextmanager
def snapshot_as_probe(path: Path) -> Iterator[None]:
    """``xtrain.machine.probe.collect`` answers with a saved snapshot (for commands without --facts)."""
    import xtrain.machine.probe
    from xtrain.machine.facts import Facts

    facts = Facts.load(path)
    real = xtrain.machine.probe.collect
    xtrain.machine.probe.collect = lambda *a, **k: facts  # type: ignore[assignment]
    try:
        yield
    finally:
        xtrain.machine.probe.collect = real  # type: ignore[assignment]


def parse_or_fail(parser, words: list[str], cmd: Command):
    try:
        return parser.parse_args(words)
    except SystemExit as e:
        raise AssertionError(f"{cmd.where()}: the launcher's parser refused it") from e


def load_train_config(config: str | None, overrides: list[str], cmd: Command) -> None:
    try:
        from xtrain.tasks.validation import load_config
    except ImportError:  # the loader is not there yet: the parsers' check is all we can do
        return
    from xtrain.errors import XtrainError

    try:
        load_config(config, overrides)
    except XtrainError as e:
        raise AssertionError(f"{cmd.where()}: {e.one_line()}") from None


def supports(sub: str, option: str) -> bool:
    """Whether ``xtrain SUB`` has ``option`` (read from the CLI itself)."""
    import typer.main

    from xtrain.cli import app

    group = typer.main.get_command(app)
    command = group.commands.get(sub)  # type: ignore[attr-defined]
    return command is not None and any(option in p.opts for p in command.params)


def parse_xtrain(cmd: Command, argv: list[str]) -> None:
    """Parse ``xtrain ARGV`` with the CLI's own parser, without running the command."""
    import click
    import typer.main

    from xtrain.cli import app

    group = typer.main.get_command(app)
    sub = group.commands.get(argv[0])  # type: ignore[attr-defined]
    assert sub is not None, f"{cmd.where()}: xtrain has no command {argv[0]!r}"
    try:
        sub.make_context(argv[0], list(argv[1:]))
    except click.ClickException as e:
        raise AssertionError(f"{cmd.where()}: {e.format_message()}") from None


ANY_PORT = re.compile(r"(--main_process_port|--master_port) \d+")


def check_transcript(cmd: Command, output: str) -> None:
    """The doc's shown lines appear in the real output: in order, adjacent unless ``...``."""
    actual = [ln.rstrip() for ln in output.splitlines()]
    shown = list(cmd.expect or [])
    if cmd.shell == "powershell":  # Windows paths ran here with / (see argv_of)
        actual = [ln.replace("\\", "/") for ln in actual]
        shown = [ln.replace("\\", "/") for ln in shown]
    # a busy 29500 (another job, or a parallel test) makes xtrain's launcher pick a free port
    actual, shown = [[ANY_PORT.sub(r"\1 PORT", ln) for ln in lines] for lines in (actual, shown)]
    while shown and not shown[-1].strip():
        shown.pop()
    pos, free = 0, True  # free: the next shown line may come after a gap
    for line in shown:
        if line.strip() == "...":
            free = True
            continue
        if free:
            try:
                pos = actual.index(line, pos) + 1
            except ValueError:
                raise AssertionError(
                    f"{cmd.where()}: the doc shows {line!r}, the real output has no such line "
                    f"(after line {pos}):\n" + "\n".join(actual)
                ) from None
        else:
            assert pos < len(actual) and actual[pos] == line, (
                f"{cmd.where()}: the doc shows {line!r} next, the real output has "
                f"{actual[pos] if pos < len(actual) else 'nothing'!r}:\n" + "\n".join(actual)
            )
            pos += 1
        free = False


# ---------------------------------------------------------------------------------------------
# PowerShell stays PowerShell, bash stays bash
# ---------------------------------------------------------------------------------------------
PS_FORBIDDEN = [
    (r"^export\s", '`export NAME=value` is bash: use $env:NAME = "value"'),
    (r"^unset\s", "`unset` is bash: use Remove-Item Env:NAME"),
    (r"^source\s", "`source` is bash: run .venv\\Scripts\\Activate.ps1"),
    (r"^[A-Z_][A-Z0-9_]*=\S*\s", "bash's `NAME=value command` prefix: set $env:NAME first"),
    (r"\\$", "`\\` does not continue a line in PowerShell: use a backtick"),
    (r"&&|\|\|", "Windows PowerShell 5.1 has no && or ||: use ; or separate lines"),
    (r"\bpython3\b", "Windows has `python` (or `py`), not python3"),
    (r"\.venv/bin\b|\.venv\\bin\b", "a Windows venv keeps its programs in .venv\\Scripts"),
    (r"(^|\s)~/", "PowerShell does not expand ~ for programs: use $env:USERPROFILE"),
    (r"`[ \t]+$", "a space after the continuation backtick breaks the continuation"),
    (r"\S`$", "put a space before the continuation backtick"),
    (r"\$env:\w+\s*=\s*[^\"'(\s]", 'quote the value: $env:NAME = "value" (or compute it in parentheses)'),
    (r"\$env:\w+=", 'spaces around =: $env:NAME = "value"'),
]
PS_AUTOMATIC = {"HOME", "PWD", "PROFILE", "LASTEXITCODE", "NULL", "TRUE", "FALSE", "ENV"}

BASH_FORBIDDEN = [
    (r"\$env:", "$env: is PowerShell: use export NAME=value"),
    (r"Remove-Item|Set-ExecutionPolicy|Add-Content", "a PowerShell cmdlet in a bash block"),
    (r"\.venv\\Scripts", "a Linux venv keeps its programs in .venv/bin"),
    (r"`$", "a backtick does not continue a line in bash: use \\"),
]


def _code_lines(block: Block) -> list[tuple[int, str]]:
    out = []
    for n, raw in enumerate(block.lines):
        if block.lang == "console":
            prompt = "PS> " if raw.startswith("PS> ") else "$ " if raw.startswith("$ ") else None
            if prompt is None:
                continue
            raw = raw[len(prompt) :]
        out.append((block.line + n, raw))
    return out


def is_powershell(block: Block) -> bool:
    return block.lang == "powershell" or (
        block.lang == "console" and any(ln.startswith("PS> ") for ln in block.lines)
    )


def is_bash(block: Block) -> bool:
    return block.lang == "bash" or (
        block.lang == "console" and any(ln.startswith("$ ") for ln in block.lines)
    )


def powershell_problems(block: Block) -> list[str]:
    problems = []
    for n, raw in _code_lines(block):
        code = raw if raw.rstrip().endswith("`") else strip_comment(raw, "powershell")
        for pattern, why in PS_FORBIDDEN:
            if re.search(pattern, raw if "`" in pattern else code):
                problems.append(f"{block.doc}:{n}: {raw.strip()}  <- {why}")
        problems += [f"{block.doc}:{n}: {raw.strip()}  <- {why}" for why in array_problems(code)]
        for var in re.findall(r"(?<![\w:])\$([A-Za-z_]\w*)\b(?!:)", code):
            if var.upper() not in PS_AUTOMATIC:
                problems.append(f"{block.doc}:{n}: ${var} is a PowerShell variable: use $env:{var}")
    return problems


def bash_problems(block: Block) -> list[str]:
    return [
        f"{block.doc}:{n}: {raw.strip()}  <- {why}"
        for n, raw in _code_lines(block)
        for pattern, why in BASH_FORBIDDEN
        if re.search(pattern, raw)
    ]


def array_problems(code: str) -> list[str]:
    """A PowerShell line's unquoted comma lists, each said as the mistake it is."""
    return [
        f"unquoted {word!r} is an array in PowerShell (a program gets "
        f"{word.replace(',', ' ')!r}): quote it, {quote_ps(word)}"
        for word in unquoted_commas(code)
    ]


def quote_ps(word: str) -> str:
    """``--gpus=0,1`` -> ``--gpus='0,1'``; ``key=[a,b]`` -> ``'key=[a,b]'`` (as xtrain.shell quotes)."""
    from xtrain.shell import quote

    return quote("powershell", word)


# ---------------------------------------------------------------------------------------------
# Static checks (parsing only): commands and options that exist, install lines that install
# xtrain's checkout, PowerShell prose that survives being typed
# ---------------------------------------------------------------------------------------------
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
# an inline span that is a command or an option a reader would type
# (not output quoted in prose: "xtrain 2 processes on cuda, ..." is the start banner)
TYPED = re.compile(
    r"^(\.venv[/\\](bin|Scripts)[/\\])?(xtrain\s+(-|[a-z])|(python3?|py|accelerate|torchrun)\s)|^--?[a-z]"
)


@dataclass(frozen=True)
class Span:
    doc: str
    line: int
    text: str  # an inline code span of the prose (outside fenced blocks)

    def where(self) -> str:
        return f"{self.doc}:{self.line}: `{self.text}`"


def prose_spans(path: Path) -> list[Span]:
    """The inline code spans of a doc's prose (fenced blocks left out; table cells included)."""
    rel = path.relative_to(ROOT).as_posix()
    out, fenced = [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if (not fenced and FENCE.match(line.strip())) or (fenced and line.strip() == "```"):
            fenced = not fenced
        elif not fenced:
            out += [Span(rel, n, m.group(1)) for m in INLINE.finditer(line)]
    return out


def typed_spans(path: Path) -> list[Span]:
    return [s for s in prose_spans(path) if TYPED.match(s.text)]


def powershell_prose_problems(path: Path) -> list[str]:
    """In a page whose reader types PowerShell, the commands and options of its prose too."""
    return [f"{s.where()}  <- {why}" for s in typed_spans(path) for why in array_problems(s.text)]


def _words(text: str, shell: str) -> list[str]:
    if shell == "powershell":
        return ps_split(text)
    try:
        return shlex.split(text)
    except ValueError:  # prose: an apostrophe, a placeholder with a quote in it
        return text.split()


XTRAIN_WORD = re.compile(r"^(\.venv[/\\](bin|Scripts)[/\\])?xtrain(\.exe)?$")


def xtrain_calls(words: list[str]) -> list[list[str]]:
    """The arguments of each ``xtrain ...`` and ``-m xtrain.run ...`` in one command's words (also
    behind a launcher: ``srun -N1 xtrain doctor``, ``accelerate launch -m xtrain.run``)."""
    for i, w in enumerate(words):
        if XTRAIN_WORD.match(w):
            return [["xtrain", *words[i + 1 :]]]
        if w == "xtrain.run" and i and words[i - 1] == "-m":
            return [["xtrain.run", *words[i + 1 :]]]
    return []


def _cli_options() -> dict[str, set[str]]:
    """``{subcommand: its option names}`` read off the typer app (``""``: the app's own), and
    ``xtrain.run``'s from its argparse parser; nothing runs."""
    import argparse
    from unittest import mock

    import typer.main

    import xtrain.run
    from xtrain.cli import app

    group = typer.main.get_command(app)
    out = {"": {o for p in group.params for o in p.opts} | {"--help"}}
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        out[name] = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    with mock.patch.object(argparse.ArgumentParser, "parse_args", lambda self, argv=None: self):
        parser = xtrain.run.parse_args([])
    out["xtrain.run"] = set(parser._option_string_actions)  # type: ignore[attr-defined]
    return out


def option_problems(where: str, words: list[str], options: dict[str, set[str]]) -> list[str]:
    """What in ``xtrain SUB --option ...`` (or ``-m xtrain.run --option``) the CLI does not have."""
    problems = []
    for call in xtrain_calls(words):
        prog, args = call[0], call[1:]
        if prog == "xtrain":
            sub = next((a for a in args if not a.startswith("-")), "")
            if sub and sub not in options:
                if sub.isupper() or not re.fullmatch(r"[a-z][a-z-]*", sub):
                    continue  # a placeholder (`xtrain COMMAND --help`)
                problems.append(f"{where}  <- xtrain has no command {sub!r}")
                continue
            known = options[sub]
        else:
            known = options["xtrain.run"]
        for arg in args:
            if arg == "--":
                break  # what follows goes to the program, not to xtrain
            name = arg.split("=", 1)[0]
            if re.fullmatch(r"--?[A-Za-z][\w-]*", name) and name not in known:
                what = f"xtrain {sub}" if prog == "xtrain" and sub else "xtrain" if prog == "xtrain" else prog
                problems.append(f"{where}  <- {what} has no option {name}")
    return problems


# Lines that install something under xtrain's name: the `xtrain` on the public index is an
# unrelated project (FIELD_NOTES), and huggingface_hub 2.x ships `hf`, not `huggingface-cli`.
INSTALLS_ANOTHER_PROJECT = [
    (
        re.compile(r"(?<![\w./\\-])xtrain\[(?!/)"),
        "an extra of the public index's `xtrain` (an unrelated project): install the checkout, "
        'pip install -e ".[extra]", or the package itself (e.g. "bitsandbytes>=0.46.1")',
    ),
    (
        re.compile(r"\bpip3?(\.exe)? install\b[^`\n]*?\s['\"]?xtrain(?![\w./\\\[-])"),
        "installs the public index's `xtrain`, an unrelated project: pip install -e . from the checkout",
    ),
    (re.compile(r"\bhuggingface-cli\b"), "transformers 5's hub client ships `hf` (hf download REPO)"),
]


def install_problems(path: Path) -> list[str]:
    rel = path.relative_to(ROOT).as_posix()
    return [
        f"{rel}:{n}: {_around(line, m.start())}  <- {why}"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for pattern, why in INSTALLS_ANOTHER_PROJECT
        for m in [pattern.search(line)]
        if m
    ]


def _around(line: str, at: int, width: int = 40) -> str:
    start, end = max(0, at - width), at + width
    return ("..." if start else "") + line[start:end].strip() + ("..." if end < len(line) else "")
