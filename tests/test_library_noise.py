"""Library noise xtrain silences (xtrain/runtime/quiet.py), exactly that and nothing more."""

from __future__ import annotations

import importlib.util
import logging
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
