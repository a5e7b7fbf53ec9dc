"""xtrain studio in a real browser (Debian's chromium through Playwright's Python package, as
tests/test_report_browser.py drives it; never ``playwright install``), on the tiniest built-in
job, a run folder whose name has a space and a non-ASCII letter:

- the default journey: the new-run form for the built-in chat job and its data check (trained
  tokens marked); Launch, and the loss curve gains points while it trains; the studio killed
  mid-run and started again: the run is found from its files and its curves go on; Stop (a
  checkpoint, then the stop, through the run's stop request; its end record says 130);
- the soak journey (``-m soak``; a second launch of about as long is more than this file's share
  of the suite's time): Resume, and it finishes, its history one line per window across the stop;
  a second run compared with the first (curves overlaid, the evaluations side by side), the start
  and the trained result answering side by side, an export to q8_0 with llama.cpp's table, the
  machine as xtrain doctor sees it.

No request leaves the studio's origin, no script error, no console error. The screenshots are
those of docs/studio.md: ``XTRAIN_STUDIO_SCREENSHOTS=docs/images`` writes them there."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import pytest
from support import studio as served
from test_report_browser import FLAGS, _browser, _chromium, _pixels

from xtrain.runtime import run_control
from xtrain.train.checkpoint.layout import list_checkpoints
from xtrain.train.run_files import read_history

pytestmark = [pytest.mark.slow]
NAME = "chat ü 1"
STEPS = 300  # more than it trains before it is stopped, on any machine (the soak journey resumes it)
LOSS_POINTS = (
    "(() => { const p = document.querySelector('#run-curves figure svg polyline');"
    " return p ? p.getAttribute('points').trim().split(' ').length : 0; })()"
)
SHOTS = os.environ.get("XTRAIN_STUDIO_SCREENSHOTS")


def until(page, expression: str, timeout_s: float = 120.0):  # noqa: ANN001, ANN201
    """The value of ``expression`` in the page once it is truthy (polled: the page's CSP allows no
    eval, so Playwright's ``wait_for_function`` cannot run there)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if found := page.evaluate(expression):
            return found
        time.sleep(0.25)
    raise AssertionError(f"not within {timeout_s:.0f} s: {expression}")


def shot(page, name: str) -> None:  # noqa: ANN001
    """A screenshot, not blank; kept for docs/studio.md when asked (small: a palette PNG)."""
    from PIL import Image

    data = page.screenshot(full_page=True)
    size, spread = _pixels(data)
    assert size[0] == 1200 and spread > 10, name
    if SHOTS:
        image = Image.open(io.BytesIO(data)).convert("RGB").quantize(colors=64)
        image.save(Path(SHOTS) / f"studio-{name}.png", optimize=True)


@pytest.fixture(scope="module")
def studio(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """The studio, offline, over a runs folder with a space and a non-ASCII letter, the session's
    built-in cache shared; killed at the end (its runs are processes of their own: ended too)."""
    _browser()
    from support.jobs import offline_env, session_root

    root = session_root(tmp_path_factory)
    runs = tmp_path_factory.mktemp("studio") / "mes runs ü"
    env = {**offline_env(runs.parent, root / "offline-caches" / "xtrain"), "COLUMNS": "160"}
    found = served.start(runs, env)
    box = {"studio": found}
    yield box
    box["studio"].stop()
    for folder in runs.glob("*"):  # a run still going (a failed test): asked to stop
        run_control.request_stop(folder)


@pytest.fixture(scope="module")
def browser(studio):  # noqa: ANN001, ANN201
    from playwright.sync_api import sync_playwright

    seen: dict[str, list[str]] = {"console": [], "errors": [], "requests": []}
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(studio["studio"].runs.parent / "profile"), executable_path=_chromium(),
            headless=True, args=FLAGS, viewport={"width": 1200, "height": 860},
        )  # fmt: skip
        page = context.new_page()
        page.on("console", lambda m: seen["console"].append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: seen["errors"].append(str(e)))
        page.on("request", lambda r: seen["requests"].append(r.url))
        try:
            yield page, seen
        finally:
            context.close()


def _open(page, found: served.Studio, hash_: str) -> None:  # noqa: ANN001
    page.goto(found.url)  # the token, into its cookie
    page.goto(found.base + hash_)


def _offline(seen: dict[str, list[str]], base: str) -> None:
    """Every request went to the studio; no script error; no console error but the connection
    refused while the studio was killed."""
    assert all(url.startswith(base.rsplit(":", 1)[0]) for url in seen["requests"]), seen["requests"]
    assert seen["errors"] == []
    killed = ("ERR_CONNECTION_REFUSED", "ERR_INCOMPLETE_CHUNKED_ENCODING")  # the stream the kill cut
    errors = [c for c in seen["console"] if c.startswith("error") and not any(k in c for k in killed)]
    assert errors == [], errors


def test_a_run_from_the_form_to_its_end(studio, browser) -> None:  # noqa: ANN001
    page, seen = browser
    found: served.Studio = studio["studio"]
    _open(page, found, "#new")
    page.wait_for_selector("#stages .stage input[data-key='run.max_steps']")
    _all_keys_follow_the_task(page)
    page.fill("#new-name", NAME)
    for key, value in (("run.max_steps", str(STEPS)), ("run.log_every", "2"), ("run.eval_every", "")):
        page.fill(f"#stages .stage input[data-key='{key}']", value)
    page.click("#new-check")
    page.wait_for_selector(".data-check mark, #error:not([hidden])", timeout=180_000)
    assert page.inner_text("#error") == ""
    assert "it is" in page.inner_text(".data-check mark")  # an answer of the chat data: trained
    assert "global batch 16 = 8 per-device x 1 process x 2 accumulation" in page.inner_text("body")
    assert f"max_steps: {STEPS}" in page.inner_text(".check-yaml") and "xtrain train" in page.inner_text(
        "#check-command"
    )
    shot(page, "new-run")

    page.click("#new-launch")
    page.wait_for_selector("#view-run:not([hidden])")
    assert until(page, LOSS_POINTS + " >= 2", 180)  # the loss curve draws while the run trains
    run = found.runs / NAME
    found.kill()  # the studio dies mid-run; the run does not
    found = studio["studio"] = served.start(found.runs, found.env, port=found.port)
    _open(page, found, f"#run={NAME}")
    before = until(page, LOSS_POINTS)  # found again from its files
    assert until(page, f"{LOSS_POINTS} > {before}", 60)  # ... and its curves go on
    assert page.inner_text("#run-status") in ("running", "finished") or pytest.fail("not running")
    shot(page, "run")

    until(page, f"{LOSS_POINTS} >= 12", 60)  # step 24
    page.click("#run-stop")
    page.wait_for_selector("#run-status .badge.stopped", timeout=120_000)
    assert "checkpoint saved" in page.inner_text("#run-line")
    (stopped_at, _), *_ = list_checkpoints(run)
    assert 24 <= stopped_at < STEPS and not run_control.stop_pending(run)
    assert run_control.read_end(run).exit_code == 130  # how it ended, in its folder
    _offline(seen, found.base)


def _all_keys_follow_the_task(page) -> None:  # noqa: ANN001
    """A task of one's own: "All keys" lists its keys first and hides another task's."""
    from xtrain.tasks import default_quickstart
    from xtrain.tasks.validation import task_keys

    stage = "#stages .stage"
    page.select_option(f"{stage} select.job", "")
    page.select_option(f"{stage} select.task", "distill")
    hidden = "row => row.hidden"
    assert page.eval_on_selector(f"{stage} tr[data-row='grpo.rewards']", hidden) is True
    assert page.eval_on_selector(f"{stage} tr[data-row='distill.teacher']", hidden) is False
    first = page.eval_on_selector(f"{stage} .keys tbody tr", "row => row.dataset.row")
    assert "distill" in task_keys()[first]  # the task's own keys lead
    page.select_option(f"{stage} select.job", default_quickstart())  # back to the built-in chat job


def _launched(page, found: served.Studio, name: str, values: dict[str, str]) -> None:  # noqa: ANN001
    """A run of the built-in chat job launched from the form, waited for until it finished."""
    _open(page, found, "#new")
    page.wait_for_selector("#stages .stage input[data-key='run.max_steps']")
    page.fill("#new-name", name)
    for key, value in values.items():
        page.fill(f"#stages .stage input[data-key='{key}']", value)
    page.click("#new-launch")
    page.wait_for_selector("#view-run:not([hidden])")
    page.wait_for_selector("#run-status .badge.finished", timeout=240_000)


@pytest.mark.soak
def test_resume_compare_try_export_and_machine(studio, browser) -> None:  # noqa: ANN001
    """The stopped run resumed to its end; a second run compared with it; the start and the
    result answering side by side; an export to q8_0; the machine view."""
    page, seen = browser
    found: served.Studio = studio["studio"]
    run = found.runs / NAME
    if run_control.read_end(run) is None:  # (the default journey not run first)
        _launched(page, found, NAME, {"run.max_steps": str(STEPS), "run.log_every": "2"})
    elif not (run / "train_result.json").is_file():
        stopped_at = list_checkpoints(run)[-1][0]
        _open(page, found, f"#run={NAME}")
        page.click("#run-resume")
        page.wait_for_selector("#run-status .badge.finished", timeout=180_000)
        history = read_history(run)
        assert history is not None
        logged = [r["step"] for r in history.log_history]  # each window once, rising, across the stop
        every = set(range(2, STEPS + 1, 2))
        assert logged == sorted(set(logged)) and every <= set(logged) <= {*every, stopped_at}
        assert run_control.read_end(run).exit_code == 0
        assert (run / "train.log").read_text(encoding="utf-8").count("--- xtrain studio") == 2  # one log
    _launched(page, found, "chat lr 3e-3", {"run.max_steps": "40", "run.log_every": "2", "optim.lr": "3e-3"})

    page.goto(found.base + f"#compare={NAME}|chat lr 3e-3")
    page.wait_for_selector("#compare-out #curves svg", timeout=60_000)
    legend = page.locator("#compare-out #curves .legend").first.inner_text()
    assert NAME in legend and "chat lr 3e-3" in legend
    assert "token_accuracy" in page.inner_text("#compare-out #evaluation")
    shot(page, "compare")

    page.goto(found.base + f"#run={NAME}")
    page.wait_for_selector("#try-go:visible")
    page.fill("#try-prompt", "where is the fish?")
    page.click("#try-go")
    page.wait_for_selector("#try-answers tbody tr, #error:not([hidden])", timeout=300_000)
    assert page.inner_text("#error") == ""
    cells = page.locator("#try-answers tbody tr").first.locator("td").all_inner_texts()
    assert cells[0] == "where is the fish?" and cells[1] != cells[2]  # the start and the result differ
    assert not cells[2].startswith("{") and "river" in cells[2], cells  # the answer's text (the chat data's)
    shot(page, "try")

    page.click("#export-go")  # q8_0 is ticked
    page.wait_for_selector("#export-list .badge.done, #export-list .badge.failed", timeout=600_000)
    text = page.inner_text("#export-list")
    assert "done" in text and "q8_0" in text and ".gguf" in text, text
    (result,) = [
        p for p in (found.runs / NAME / "exports").glob("*.json") if not p.name.endswith(".job.json")
    ]
    answer = json.loads(result.read_text(encoding="utf-8"))
    assert answer["ok"] and answer["answers"]["head"][2].startswith("llama.cpp")
    shot(page, "export")
    page.goto(found.base + "#machine")  # xtrain doctor's findings, plan and facts
    page.click("#machine-go")
    page.wait_for_selector("#machine-out table.plan, #error:not([hidden])", timeout=120_000)
    assert page.inner_text("#error") == "" and "num_processes" in page.inner_text("#machine-out")
    shot(page, "machine")
    _offline(seen, found.base)
