"""Library noise xtrain silences (xtrain/runtime/quiet.py), exactly that and nothing more."""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from xtrain.runtime import quiet


def _kernels_hint(logger: logging.Logger, error: Exception) -> None:
    # the call bitsandbytes makes (backends/cpu/ops.py) when the optional `kernels` package fails
    logger.warning(
        quiet.BNB_KERNELS_HINT + ": %s. Please make sure you already `pip install kernels` and the "
        "kernels >= 0.11.1",
        error,
    )


def test_the_bitsandbytes_kernels_hint_is_dropped_and_nothing_else(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger(quiet.BNB_CPU_LOGGER)
    saved = list(logger.filters)
    try:
        quiet.quiet_bitsandbytes()
        quiet.quiet_bitsandbytes()  # idempotent: one filter
        assert sum(isinstance(f, quiet._NoKernelsPackageHint) for f in logger.filters) == 1
        with caplog.at_level(logging.WARNING, logger=quiet.BNB_CPU_LOGGER):
            _kernels_hint(logger, ModuleNotFoundError("No module named 'kernels'"))
            _kernels_hint(logger, OSError("quantization-bitsandbytes: 404"))  # installed, but broken
            logger.warning("another bitsandbytes warning")
            logging.getLogger("bitsandbytes.cextension").warning(
                quiet.BNB_KERNELS_HINT + ": %s", ModuleNotFoundError("kernels")
            )  # another logger
        shown = [r.getMessage() for r in caplog.records]
        assert len(shown) == 3, shown
        assert "404" in shown[0] and shown[1] == "another bitsandbytes warning"
        assert not any("No module named 'kernels'" in m for m in shown)
    finally:
        logger.filters[:] = saved


def test_the_filter_matches_the_installed_bitsandbytes() -> None:
    """The logger name and the message are bitsandbytes' own: read from its source, not imported."""
    spec = importlib.util.find_spec("bitsandbytes")
    if spec is None or spec.origin is None:
        pytest.skip("bitsandbytes is not installed")
    ops = Path(spec.origin).parent / "backends" / "cpu" / "ops.py"
    if not ops.is_file():
        pytest.skip("this bitsandbytes has no CPU backend module")
    source = ops.read_text(encoding="utf-8")
    assert "logger = logging.getLogger(__name__)" in source
    assert quiet.BNB_CPU_LOGGER == "bitsandbytes.backends.cpu.ops"
    assert f'"{quiet.BNB_KERNELS_HINT}: %s.' in source


def test_xtrain_verbose_keeps_the_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    logger = logging.getLogger(quiet.BNB_CPU_LOGGER)
    saved = list(logger.filters)
    try:
        logger.filters[:] = []
        monkeypatch.setenv(quiet.VERBOSE_ENV, "1")
        quiet.quiet_bitsandbytes()
        assert logger.filters == []
    finally:
        logger.filters[:] = saved


def test_deepspeeds_cpu_line_is_dropped_and_nothing_else() -> None:
    logger = logging.getLogger(quiet.DS_LOGGER)
    saved, shown = list(logger.filters), []
    handler = logging.Handler()
    handler.emit = lambda record: shown.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        quiet.quiet_deepspeed()
        quiet.quiet_deepspeed()  # idempotent: one filter
        assert sum(isinstance(f, quiet._NoDeepSpeedCpuHint) for f in logger.filters) == 1
        logger.warning(quiet.DS_CPU_HINT + ". If you have GPU or other accelerator, we were unable to ...")
        logger.warning("another DeepSpeed warning")
        assert shown == ["another DeepSpeed warning"]
    finally:
        logger.removeHandler(handler)
        logger.filters[:] = saved


def test_the_deepspeed_filter_matches_the_installed_deepspeed() -> None:
    """The logger's name and the message are DeepSpeed's own, and its logger factory reuses the
    logger (so a filter added before the import stays): read from its source, not imported."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or spec.origin is None:
        pytest.skip("deepspeed is not installed")
    root = Path(spec.origin).parent
    logging_source = (root / "utils" / "logging.py").read_text(encoding="utf-8")
    assert "logger_ = logging.getLogger(name)" in logging_source
    assert f'create_logger(name="{quiet.DS_LOGGER}"' in logging_source
    detection = (root / "accelerator" / "real_accelerator.py").read_text(encoding="utf-8")
    assert f'"{quiet.DS_CPU_HINT}.' in detection


# Third-party tqdm bars (transformers' GGUF reader: "Converting and de-quantizing GGUF tensors...")
BARS = """
import sys
if sys.argv[1] == "imported-first":
    import tqdm.auto
from xtrain.runtime import quiet
quiet.quiet_progress_bars()
from tqdm.auto import tqdm
for _ in tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."):
    pass
for _ in tqdm(range(2), desc="asked for", disable=False):
    pass
"""


@pytest.mark.parametrize("order", ["imported-first", "imported-after"])
def test_third_party_progress_bars_are_off_whoever_imports_tqdm_first(order: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in (quiet.TQDM_ENV, quiet.VERBOSE_ENV)}
    proc = subprocess.run([sys.executable, "-c", BARS, order], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "de-quantizing" not in proc.stderr and "asked for" in proc.stderr, proc.stderr


def test_xtrain_verbose_keeps_the_bars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(quiet.TQDM_ENV, raising=False)
    monkeypatch.setenv(quiet.VERBOSE_ENV, "1")
    quiet.quiet_progress_bars()
    assert quiet.TQDM_ENV not in os.environ


def test_the_gguf_bar_is_a_plain_tqdm_of_transformers() -> None:
    """The bar `xtrain export` showed: transformers' GGUF reader calls tqdm.auto itself (its
    disable_progress_bar does not reach it), so tqdm's own switch is the one that does."""
    spec = importlib.util.find_spec("transformers")
    assert spec is not None and spec.origin is not None
    source = (Path(spec.origin).parent / "modeling_gguf_pytorch_utils.py").read_text(encoding="utf-8")
    assert "from tqdm.auto import tqdm" in source and "Converting and de-quantizing GGUF tensors" in source


# A data file datasets cannot parse: xtrain's one line names the line; datasets' own log line goes
@pytest.mark.usefixtures("private_caches")
@pytest.mark.parametrize(
    ("second", "why"),
    [
        (
            '{"text": "bad", "label": "negative"',
            "line 2: not valid JSON (Expecting ',' delimiter, column 36)",
        ),
        (
            '{"text": "bad \\ud83d x", "label": "negative"}',
            "line 2: a \\u escape that is half of a character (a lone surrogate)",
        ),
    ],
)
def test_a_broken_json_line_is_said_once_naming_its_line(
    second: str, why: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from xtrain.data.sources import first_rows, load_source
    from xtrain.errors import XtrainError

    data = tmp_path / "rows.jsonl"
    good = '{"text": "fine", "label": "positive"}'
    data.write_text(f"{good}\n{second}\n{good}\n", encoding="utf-8")
    for read in (lambda: load_source(str(data)), lambda: first_rows(str(data), "auto", 10)):
        with caplog.at_level(logging.DEBUG, logger="datasets"), pytest.raises(XtrainError) as raised:
            read()
        assert raised.value.one_line() == f"data file {data}, {why} (fix or remove that line)"
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records
        caplog.clear()
