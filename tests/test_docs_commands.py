"""The docs stay true: every command in docs/*.md and README.md that can run here is run.

How a doc is read and what happens to each kind of command is written at the top of
tests/support/docs_commands.py (the machinery). This file holds the decisions (which commands are
skipped or run by another test, which machine a doc plans for) and the tests.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from support import warm
from support.docs_commands import (
    ROOT,
    Block,
    Command,
    Policy,
    Session,
    _words,
    all_blocks,
    all_commands,
    array_problems,
    bash_problems,
    classify,
    commands_of,
    install_problems,
    is_bash,
    is_powershell,
    option_problems,
    powershell_problems,
    powershell_prose_problems,
    typed_spans,
)

DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]

# The snapshot each platform doc plans for (see the module docstring).
DOC_MACHINES = {
    "docs/windows-powershell.md": "windows-2x4090",
    "docs/wsl2.md": "wsl2-2x4090",
    "docs/linux.md": "linux-2x3090",
}
POWERSHELL_MACHINE = "windows-2x4090"  # PowerShell blocks in docs about no one platform
PLACEHOLDER_CONFIGS = ("YOUR.yaml", "job.yaml", "train.yaml")
PLACEHOLDER_SNAPSHOTS = {"node.json": "linux-8xa100-nvlink"}  # saved on a cluster node in linux.md
EXAMPLE_CONFIG = "examples/lora-causal-lm.yaml"

# Commands that cannot run on this machine (2 CPU cores, no GPU, no network, not Windows), as
# (regex searched in the command, reason). Keep each entry as narrow as it can be.
SKIPPED: list[tuple[str, str]] = [
    (r"^(python3? -m )?pip3? install|/pip3? install|-m pip install", "installs packages"),
    (r"^python3? -m venv ", "creates a virtual environment (the suite runs in one)"),
    (r"^source \S*activate$", "activates a virtual environment"),
    (r"-m pytest\b", "runs the test suite itself"),
    (r"^cd ", "changes into a user's own folder"),
    (r"\bsudo\b", "changes the system (sudo)"),
    (r"^docker ", "needs docker"),
    (r"^nvidia-smi\b", "needs an NVIDIA driver"),
    (r"^(sbatch|srun|squeue|scancel|sinfo)\b", "needs a SLURM cluster"),
    (r"^ls /usr/lib/wsl/lib", "WSL2 only"),
    (r"^wsl(\.exe)? ", "Windows only"),
    (r"\bbenchmarks/\S+\.py\b", "runs a benchmark (a timing run, not a test)"),
    (r"^bash benchmarks/gpu_session\.sh\b", "the GPU session's checks (needs a CUDA GPU)"),
    (r"^tensorboard --logdir ", "starts TensorBoard's web server"),
    (r"\bmlflow ui ", "starts MLflow's web server (the full mlflow package)"),
    (r"^trackio show\b", "starts trackio's web server"),
    (r"^wandb sync ", "uploads to W&B (network)"),
    (r"^ollama (create|run) ", "needs Ollama (not installable from the package registries)"),
    (r"^lms import ", "needs LM Studio"),
    (r"\bxtrain studio\b", "starts the studio's web server and a browser (tests/test_studio*.py drive it)"),
    (r"^xtrain eval \S+ --tasks (arc_|gsm8k|mmlu)", "downloads lm-eval's benchmark data (network)"),
]

# Doc commands another test already runs, as (doc, regex, the test that runs them).
COVERED_ELSEWHERE: list[tuple[str, str, str]] = [
    (
        "docs/export.md",
        r"^xtrain export\b",  # needs a trained run: the test builds one first
        "tests/test_export.py::test_the_cli_exports_and_prints_the_checks_files_and_next_command",
    ),
    (
        "docs/report.md",
        r"^xtrain report xtrain-quickstart/",  # needs a finished run: the session's quickstart
        "tests/test_report_browser.py::test_a_real_runs_report_in_a_real_browser",
    ),
    (
        "docs/report.md",
        r"^xtrain report runs/",  # several runs, a chain's stages: the test writes their files
        "tests/test_report.py::test_several_runs_are_overlaid_and_a_chain_is_put_in_order",
    ),
    (
        "docs/configure.md",
        r"^xtrain configure\b",
        "tests/test_configure.py::test_doc_configure_commands_run",
    ),
    (
        "docs/performance.md",
        r"^xtrain bench\b",  # a timing run (minutes); the test runs it short
        "tests/test_bench.py::test_bench_json_one_vs_two_processes",
    ),
    *[  # predict over a data file needs a trained result: the test builds one first
        (doc, r"^xtrain predict .*--data\b", "tests/test_predict_file.py::" + test)
        for doc, test in (
            ("docs/training.md", "test_every_row_is_one_line_with_its_reference_and_exact_match"),
            ("docs/image-to-text.md", "test_a_csv_of_image_paths_is_read_with_the_runs_columns"),
            ("docs/image-classification.md", "test_image_labels_are_named_as_training_named_them"),
            ("docs/speech-to-text.md", "test_a_speech_file_transcribes_as_the_file_inputs_do"),
            ("docs/vision-language.md", "test_vision_language_rows_batched_answer_as_one_at_a_time"),
        )
    ],
    (
        "docs/image-to-text.md",
        r"^xtrain predict\b",  # needs a trained run: the test trains one first
        "tests/test_image_to_text.py::test_predict_reads_images_with_the_trained_adapter",
    ),
    (
        "docs/image-classification.md",
        r"^xtrain predict\b",  # needs a trained run: the test trains one first
        "tests/test_image_classification.py::test_predict_prints_the_label_and_its_probability",
    ),
    (
        "docs/speech-to-text.md",
        r"^xtrain predict\b",  # needs a trained run: the test trains one first
        "tests/test_speech_to_text.py::test_predict_transcribes_audio_with_the_trained_adapter",
    ),
    (
        "docs/vision-language.md",
        r"^xtrain predict runs/qwen2-vl-lora\b",  # needs a trained run: the test trains one first
        "tests/test_vision_language.py::test_predict_with_the_trained_run_gives_its_eval_answers",
    ),
    (
        "docs/vision-language.md",
        r"^xtrain predict xtrain-output/chat-sft\b",  # needs a trained chat run: the test trains one
        "tests/test_chat.py::test_predict_renders_a_chat_prompt_as_training_rendered_it",
    ),
    (
        "docs/preference.md",
        r"^xtrain predict runs/preference-dpo .*--data\b",  # a preference result: the test makes one
        "tests/test_evaluate.py::test_predict_data_on_a_preference_result_in_every_row_shape",
    ),
    *[  # xtrain eval needs a trained run and (its task names) lm-eval's data: the tests build their own
        ("docs/evaluation.md", pattern, "tests/test_evaluate.py::" + test)
        for pattern, test in (
            (r"^xtrain eval runs/sft .*--samples\b", "test_samples_are_each_rows_answer_and_its_metric"),
            (
                r"^xtrain eval runs/sft (runs/dpo )?--tasks my_tasks/",
                "test_xtrain_eval_equals_lm_evals_own_simple_evaluate",
            ),
            (r"^xtrain eval runs/recipe/dpo --stages\b", "test_a_chains_stages_are_scored_in_order"),
            (
                r"^xtrain (export runs/sft|eval runs/sft-export/)",
                "test_a_gguf_export_is_scored_in_llama_cpp_beside_the_merged_model",
            ),
        )
    ],
    (
        "docs/preference.md",
        r"^xtrain predict runs/preference-dpo\b",  # needs a trained run: the test trains one first
        "tests/test_preference.py::test_predict_continues_a_prompt_with_the_trained_run",
    ),
    (
        "docs/reward-models.md",
        r"^xtrain predict runs/reward-model\b",  # needs a trained reward run: the test trains one first
        "tests/test_reward.py::test_predict_after_reload_scores_as_the_model_did_at_the_end_of_training",
    ),
    (
        "docs/agents.md",
        r"^xtrain predict xtrain-output/agent-tools\b",  # needs a trained run: the test stands one in
        "tests/test_agents_job.py::test_predict_with_tools_renders_them_and_shows_the_parsed_call",
    ),
    (
        "docs/agents.md",
        r"^xtrain export xtrain-output/agent-tools\b",  # needs a trained run: the test stands one in
        "tests/test_ollama_tools.py::test_an_agent_run_exports_a_modelfile_with_tools_and_a_gguf_with_its_template",
    ),
    (
        "docs/grpo.md",
        r"^xtrain predict xtrain-output/grpo-tools\b",  # needs a trained run: the test trains one
        "tests/test_grpo_tools_processes.py::test_one_and_two_processes_run_the_same_episodes_and_train_the_same",
    ),
    (
        "docs/training.md",
        r"^xtrain predict xtrain-output/chat-sft\b",  # needs a trained chat run: the test trains one
        "tests/test_chat.py::test_predict_renders_a_chat_prompt_as_training_rendered_it",
    ),
    *[  # a stage that starts from a trained result, and that result: the test trains the chain
        ("docs/chains.md", pattern, "tests/test_chain_results.py::" + test)
        for pattern, test in (
            (
                r"^xtrain (train dpo\.yaml|predict runs/dpo|chat runs/dpo)\b",
                "test_the_docs_chain_commands_run",
            ),
            (r"^xtrain export runs/dpo\b", "test_the_gguf_runs_in_llamacpp_and_answers_as_the_merged_chain"),
        )
    ],
]

# Shell commands that are harmless here and run as they are (with bash).
RUN_IN_SHELL = [r"^python3? -c ", r"^df -h /dev/shm$", r"^free -g$"]

POLICY = Policy(
    skipped=SKIPPED,
    covered_elsewhere=COVERED_ELSEWHERE,
    run_in_shell=RUN_IN_SHELL,
    doc_machines=DOC_MACHINES,
    powershell_machine=POWERSHELL_MACHINE,
    placeholder_configs=PLACEHOLDER_CONFIGS,
    placeholder_snapshots=PLACEHOLDER_SNAPSHOTS,
    example_config=EXAMPLE_CONFIG,
)


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------
DOC_IDS = [p.relative_to(ROOT).as_posix() for p in DOCS]


def test_every_doc_command_is_classified() -> None:
    unknown = [c.where() for c in all_commands(DOCS) if classify(c, POLICY).what == "unknown"]
    assert not unknown, (
        "doc commands that are neither run, checked nor skipped (see the top of "
        "tests/support/docs_commands.py; the lists are in this file):\n" + "\n".join(unknown)
    )


def test_skip_lists_hold_nothing_stale() -> None:
    commands = all_commands(DOCS)
    for pattern, reason in SKIPPED:
        assert any(re.search(pattern, c.text) for c in commands), (
            f"SKIPPED {pattern!r} ({reason}) matches no doc"
        )
    for doc, pattern, test in COVERED_ELSEWHERE:
        assert any(c.doc == doc and re.search(pattern, c.text) for c in commands), (doc, pattern)
        path, _, name = test.partition("::")
        assert f"def {name}(" in (ROOT / path).read_text(encoding="utf-8"), test


def test_fences_are_known_languages() -> None:
    """Commands in an unknown fence (```sh, ```cmd, ```ps1) would escape these checks."""
    known = {"bash", "powershell", "console", "text", "yaml", "json", "python", "toml", ""}
    odd = [f"{b.doc}:{b.line - 1}: ```{b.lang}" for b in all_blocks(DOCS) if b.lang not in known]
    assert not odd, "use bash, powershell, console or text fences:\n" + "\n".join(odd)


@pytest.mark.parametrize("doc", DOC_IDS)
def test_doc_commands_run(doc: str, tmp_path: Path) -> None:
    commands = [c for b in all_blocks(DOCS) if b.doc == doc for c in commands_of(b)]
    session = Session.create(tmp_path, POLICY)
    for cmd in commands:
        session.run(cmd)


@pytest.mark.parametrize("doc", DOC_IDS)
def test_powershell_blocks_are_powershell(doc: str) -> None:
    problems = [
        p for b in all_blocks(DOCS) if b.doc == doc and is_powershell(b) for p in powershell_problems(b)
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", DOC_IDS)
def test_bash_blocks_are_bash(doc: str) -> None:
    problems = [p for b in all_blocks(DOCS) if b.doc == doc and is_bash(b) for p in bash_problems(b)]
    assert not problems, "\n".join(problems)


def test_the_syntax_checks_catch_the_usual_mistakes() -> None:
    bad_ps = [
        "export USE_LIBUV=0",
        "USE_LIBUV=0 python -m xtrain.run",
        "$env:USE_LIBUV=0",
        "$env:USE_LIBUV = 0",
        "python3 -m xtrain.run",
        ".venv/bin/xtrain doctor",
        "xtrain train a.yaml \\",
        "xtrain train a.yaml` ",
        "xtrain doctor && xtrain configure",
        "$HF_HOME\\accelerate",
        "unset CUDA_VISIBLE_DEVICES",
    ]
    for line in bad_ps:
        assert powershell_problems(Block("x.md", "powershell", 1, [line], None)), line
    good_ps = ['$env:USE_LIBUV = "0"', "xtrain train a.yaml `", "Remove-Item Env:CUDA_VISIBLE_DEVICES"]
    assert not powershell_problems(Block("x.md", "powershell", 1, good_ps, None))
    for line in ['$env:USE_LIBUV = "0"', ".venv\\Scripts\\xtrain doctor", "xtrain train a.yaml `"]:
        assert bash_problems(Block("x.md", "bash", 1, [line], None)), line


def test_windows_doc_is_powershell_throughout() -> None:
    langs = {b.lang for b in all_blocks(DOCS) if b.doc == "docs/windows-powershell.md"}
    assert "powershell" in langs
    assert langs <= {"powershell", "console", "text", "yaml"}, langs
    for b in all_blocks(DOCS):
        if b.doc == "docs/windows-powershell.md" and b.lang == "console":
            assert not any(ln.startswith("$ ") for ln in b.lines), f"bash prompt at line {b.line}"


# -- what a reader copies: options that exist, installs of the right project, PowerShell arrays ----
# (parsing only: these run in a second and hold for every page, also the commands SKIPPED above)
POWERSHELL_PROSE = ["docs/windows-powershell.md"]  # pages whose reader types PowerShell


@pytest.fixture(scope="module")
def cli_options() -> dict[str, set[str]]:
    from support.docs_commands import _cli_options

    return _cli_options()


def test_doc_commands_use_options_that_exist(cli_options: dict[str, set[str]]) -> None:
    """Every `xtrain SUB --option` and `-m xtrain.run --option` of the docs, in code blocks (run,
    checked or skipped alike) and in the prose, is an option of the real CLI."""
    problems = [
        p
        for c in all_commands(DOCS)
        for p in option_problems(c.where(), _words(c.text, c.shell), cli_options)
    ]
    for path in DOCS:
        for span in typed_spans(path):
            problems += option_problems(span.where(), _words(span.text, "bash"), cli_options)
    assert not problems, "\n".join(problems)


def test_docs_install_xtrain_from_the_checkout() -> None:
    problems = [p for path in DOCS for p in install_problems(path)]
    assert not problems, "\n".join(problems)


def test_xtrain_prints_no_install_line_of_another_project() -> None:
    """xtrain's own refusals (a tracker or bitsandbytes missing) name the real packages too."""
    sources = sorted((ROOT / "xtrain").rglob("*.py"))
    problems = [p for path in sources for p in install_problems(path)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", POWERSHELL_PROSE)
def test_powershell_prose_quotes_comma_lists(doc: str) -> None:
    problems = powershell_prose_problems(ROOT / doc)
    assert not problems, "\n".join(problems)


def test_the_static_checks_catch_what_readers_copied() -> None:
    """Each class of mistake found in the docs (issue 31) is caught, and its fix passes."""
    options = {"": {"--help"}, "doctor": {"--gpus", "--help"}, "xtrain.run": {"--config", "--help"}}
    assert option_problems("x", ["xtrain", "doctor", "--gpu", "0"], options) == [
        "x  <- xtrain doctor has no option --gpu"
    ]
    assert option_problems("x", ["xtrain", "doctr"], options) == ["x  <- xtrain has no command 'doctr'"]
    assert option_problems("x", ["srun", "xtrain", "doctor", "--gpus=0"], options) == []
    assert option_problems("x", ["accelerate", "launch", "-m", "xtrain.run", "--cfg", "a"], options)
    assert not option_problems("x", ["python", "-m", "xtrain.run", "--config", "a.yaml"], options)
    assert array_problems("xtrain doctor --gpus 0,1") and array_problems("xtrain train a.yaml k=[a,b]")
    for good in ["xtrain doctor --gpus '0,1'", 'xtrain doctor --gpus "0,1"', "xtrain doctor --gpus 0`,1"]:
        assert not array_problems(good), good
    bad_installs = [
        "pip install xtrain",
        'python -m pip install "xtrain[quantization]"',
        "`xtrain[mlflow]` installs mlflow-skinny",
        "huggingface-cli download Qwen/Qwen2-VL-2B-Instruct",
    ]
    good_installs = [
        'pip install -e ".[quantization]"',
        "pip install -e .",
        'pip install "bitsandbytes>=0.46.1"',
        "pip install -e /src/xtrain[mlflow]",
        "hf download Qwen/Qwen2-VL-2B-Instruct",
        "[bold]xtrain[/] 2 processes",
    ]
    for lines, bad in ((bad_installs, True), (good_installs, False)):
        for line in lines:
            path = ROOT / "tests" / "_install_line.md"  # read through the same function as the docs
            path.write_text(line + "\n", encoding="utf-8")
            try:
                assert bool(install_problems(path)) == bad, line
            finally:
                path.unlink()


# -- help of every command --------------------------------------------------------------------------
def test_help_of_every_command(tmp_path: Path) -> None:
    import typer.main

    from xtrain.cli import app

    session = Session.create(tmp_path, POLICY)
    names = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    assert {"doctor", "configure"} <= set(names)
    session._xtrain(Command("-", 0, "bash", "xtrain --help"), ["--help"], ok=(0,))
    for name in names:
        cmd = Command("-", 0, "bash", f"xtrain {name} --help")
        text = session._xtrain(cmd, [name, "--help"], ok=(0,))
        assert "Usage" in text and name in text
    res = warm.run(
        [sys.executable, "-m", "xtrain.run", "--help"],
        cwd=session.root,
        env=session.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0 and "--processes" in res.stdout, res.stderr


# -- links and finding codes ----------------------------------------------------------------------
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            title = m.group(1).strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


MY_DOCS = [
    "docs/index.md",
    "docs/windows-powershell.md",
    "docs/wsl2.md",
    "docs/linux.md",
    "docs/troubleshooting.md",
]


@pytest.mark.parametrize("doc", MY_DOCS)
def test_links_resolve(doc: str) -> None:
    path = ROOT / doc
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target} (no file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor})")
    assert not broken, f"{doc}: " + ", ".join(broken)


def test_docs_home_links_every_doc() -> None:
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([\w.-]+\.md)(?:#[^)]*)?\)", index))
    missing = sorted(
        p.name for p in (ROOT / "docs").glob("*.md") if p.name != "index.md" and p.name not in linked
    )
    assert not missing, f"docs/index.md does not link {missing}"


def _finding_codes() -> set[str]:
    import xtrain.planning.checks
    import xtrain.planning.rules

    files = [Path(xtrain.planning.rules.__file__), *Path(xtrain.planning.checks.__file__).parent.glob("*.py")]
    source = "".join(f.read_text(encoding="utf-8") for f in files)
    return set(re.findall(r'Finding\(\s*"([a-z0-9-]+)"', source))


def test_troubleshooting_names_real_finding_codes() -> None:
    """Each problem says which doctor finding detects it (`Detected by:` lines), with real codes."""
    text = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    codes = _finding_codes()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    assert len(sections) >= 10
    for section in sections:
        title = section.splitlines()[0]
        m = re.search(r"^\*\*Detected by:?\*\*:?(.*)$", section, flags=re.M)
        assert m, f"troubleshooting.md '{title}' has no **Detected by:** line"
        named = re.findall(r"`([a-z0-9-]+)`", m.group(1))
        unknown = [c for c in named if c not in codes]
        assert not unknown, f"'{title}': {unknown} are not finding codes of xtrain/planning/rules.py"
    for code in ("cpu-torch-with-driver", "libuv", "p2p-missing", "cuda-visible-devices", "port-busy"):
        assert f"`{code}`" in text, code


def test_platform_docs_name_real_finding_codes() -> None:
    """A backticked word that looks like one of doctor's codes must be one."""
    codes = _finding_codes()
    prefixes = (
        "nccl|cpu|gpu|gpus|p2p|shm|wsl2|hostname|port|cuda|driver|accelerate|deepspeed|torch|probe"
        "|packages|mismatched|gloo"
    )
    lookalike = re.compile(rf"`((?:{prefixes})-[a-z0-9-]+)`")
    for doc in MY_DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        bad = sorted({c for c in lookalike.findall(text) if c not in codes})
        assert not bad, f"{doc}: {bad} are not finding codes"
