"""The studio's Try on an image and an audio file (soak: three quickstarts trained and six models
loaded): the page's base64 file goes through ``trying.try_run`` (the handler behind
``/api/run/try``) to ``xtrain predict``'s own function, and the trained column is what ``xtrain
predict`` answers on the same file from the command line. The browser test drives Try with a chat
prompt (tests/test_studio_browser.py)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from xtrain.cli import main

pytestmark = [pytest.mark.soak, pytest.mark.usefixtures("private_caches")]


@pytest.mark.parametrize("job", ["image-classification", "speech-to-text", "vision-language"])
def test_try_answers_a_file_from_the_page_as_predict_does(job, tmp_path_factory, tmp_path, capsys):
    from support.jobs import session_quickstart

    from xtrain import tasks
    from xtrain.studio import trying

    _, run = session_quickstart(tmp_path_factory, "--task", job)
    file, *rest = tasks.quickstarts()[job].predict_args()
    kind = "audio" if Path(file).suffix == ".wav" else "image"
    body = {kind: {"name": Path(file).name, "data": base64.b64encode(Path(file).read_bytes()).decode()}}
    if rest:  # a vision-language question: the page's prompt
        body["prompt"] = rest[rest.index("--question") + 1]
    answer = trying.try_run(run, body)
    assert answer["ok"] and answer["base"] and answer["trained"]

    out = tmp_path / "predicted.jsonl"
    capsys.readouterr()
    assert main(["predict", str(run), file, *rest, "-o", str(out)]) == 0
    (row,) = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    (trained,) = answer["trained"]
    assert trained == {**row, "input": Path(file).name}  # the file named as the page sent it
