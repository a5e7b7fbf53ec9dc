"""A real run's report as a person sees it: `xtrain quickstart`'s run (the session's, shared with
the other tests: support.jobs.session_quickstart), its files copied into a folder whose name has a
space and non-ASCII letters, one of its answers carrying a script; `xtrain report` writes the
page, and headless chromium (Debian's, driven by Playwright's Python package through its
``executable_path``; never ``playwright install``, which downloads) opens it from disk: it loads
with no console error and no request but the file itself, every section is there, the planted
script stays text (no dialog), the screenshot is not blank. The run's curves.png is read back.

Outside CI a machine without chromium or playwright skips with the reason; under CI (``CI`` set:
.ci/run installs chromium) it fails instead."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("private_caches")]

CHROMIUM = Path("/usr/bin/chromium")  # Debian's (shutil.which finds it elsewhere)
# the flags a closed network and a root user need: no sandbox (root), no GPU, none of its
# background connections (refused here), a fresh profile (the persistent context's own folder)
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]  # fmt: skip
SECTIONS = ["lineage", "plan", "data", "curves", "evaluation", "benchmarks", "samples"]
PLANTED = '<script>alert("planted")</script>'


def _chromium() -> str | None:
    return str(CHROMIUM) if CHROMIUM.is_file() else shutil.which("chromium")


def _browser() -> None:
    """Skip (outside CI) or fail (under CI) without chromium and Playwright."""
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install -e '.[dev]')")
    if _chromium() is None:
        missing.append("chromium (apt-get install chromium)")
    if missing:
        why = f"no {' and no '.join(missing)}: the report is not opened in a browser"
        if os.environ.get("CI"):
            pytest.fail(f"{why} (CI installs both: .ci/run)")
        pytest.skip(why)


def _pixels(data: bytes) -> tuple[tuple[int, int], float]:
    """(size, spread of its grey levels): a blank picture's spread is 0."""
    from PIL import Image, ImageStat

    image = Image.open(io.BytesIO(data)).convert("L")
    return image.size, ImageStat.Stat(image).stddev[0]


def _copy(run: Path, to: Path) -> Path:
    """What the report reads of ``run`` (no weights), into ``to``; a script planted in an answer."""
    shutil.copytree(run, to, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.pt", "*.pth", "logs"))
    answers = json.loads((to / "answers.json").read_text(encoding="utf-8"))
    answers["rows"][0]["prompt"] = PLANTED + answers["rows"][0]["prompt"]
    (to / "answers.json").write_text(json.dumps(answers), encoding="utf-8")
    return to


def test_a_real_runs_report_in_a_real_browser(tmp_path_factory: pytest.TempPathFactory) -> None:
    _browser()
    from playwright.sync_api import sync_playwright
    from support.jobs import session_quickstart

    from xtrain.cli import main

    run = session_quickstart(tmp_path_factory)[1]
    size, spread = _pixels((run / "curves.png").read_bytes())  # the run's own picture
    assert size[0] == 1120 and size[1] > 300 and spread > 10
    root = tmp_path_factory.mktemp("report")
    folder = _copy(run, root / "my runs" / "Lauf ü 1")
    assert main(["report", str(folder)]) == 0
    html = folder / "report.html"

    seen: dict[str, list[str]] = {"console": [], "errors": [], "requests": [], "dialogs": []}
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(root / "profile"), executable_path=_chromium(),
            headless=True, args=FLAGS, viewport={"width": 1280, "height": 900},
        )  # fmt: skip
        try:
            page = browser.new_page()
            page.on("console", lambda m: seen["console"].append(f"{m.type}: {m.text}"))
            page.on("pageerror", lambda e: seen["errors"].append(str(e)))
            page.on("request", lambda r: seen["requests"].append(r.url))
            page.on("dialog", lambda d: (seen["dialogs"].append(d.message), d.dismiss()))
            page.goto(html.as_uri(), wait_until="load")
            shown = {key: page.locator(f"section#{key}").is_visible() for key in SECTIONS}
            charts = page.locator("#curves svg").count()
            samples = page.inner_text("#samples")
            shot = page.screenshot(full_page=True)
        finally:
            browser.close()

    assert shown == dict.fromkeys(SECTIONS, True)
    assert charts >= 3  # loss, learning rate, the eval metrics
    assert seen["requests"] == [html.as_uri()]  # offline: nothing else fetched
    assert not [c for c in seen["console"] if c.startswith(("error", "warning"))], seen["console"]
    assert seen["errors"] == [] and seen["dialogs"] == []
    assert PLANTED in samples  # the planted script is text on the page
    size, spread = _pixels(shot)
    assert size[0] == 1280 and size[1] > 2000 and spread > 10
