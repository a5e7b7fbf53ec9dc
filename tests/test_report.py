"""`xtrain report`: run folders (written here as a run writes them: its result, its newest
checkpoint's state, its record, its data check and samples) as one page: every section, the
user's text escaped (a data row that holds a script stays text), several runs overlaid, a chain's
stages in order, where the page goes (never over a file it did not write), bad input in one line;
and the property: any content of those files gives a page or xtrain's one line, never another
exception. The page of a real run in a real browser: tests/test_report_browser.py."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xtrain.errors import XtrainError
from xtrain.report import page
from xtrain.report.runs import read_runs

SECTIONS = ["lineage", "plan", "data", "curves", "evaluation", "benchmarks", "samples"]
ATTACK = '<script>alert("x")</script><img src=x onerror=alert(1)>"\'&'
# the tags the page is made of: anything else in it came from a run's files unescaped
OURS = {
    "html",
    "head",
    "meta",
    "title",
    "style",
    "body",
    "h1",
    "h2",
    "h3",
    "p",
    "div",
    "nav",
    "a",
    "section",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "code",
    "b",
    "pre",
    "mark",
    "span",
    "i",
    "details",
    "summary",
    "figure",
    "figcaption",
    "svg",
    "line",
    "text",
    "rect",
    "polyline",
    "circle",
    "footer",
}


def write_run(
    folder: Path,
    *,
    name: str = "causal-lm",
    steps: int = 20,
    lineage: list | None = None,
    text: str = "it is in the river.",
    eval_at_start: bool = True,
) -> Path:
    """A finished run's files, as the loop writes them (no weights: the report reads none)."""
    folder.mkdir(parents=True)
    log = [{"step": s, "loss": 2 / s, "lr": 0.01 * (1 - s / (steps + 1))} for s in range(2, steps + 1, 2)]
    evals = [{"step": s, "eval_loss": 3 / (s + 1), "token_accuracy": s / steps} for s in (0, steps)]
    evals = evals if eval_at_start else evals[1:]
    result = {
        "final_step": steps,
        "total_steps": steps,
        "losses": [[r["step"], r["loss"]] for r in log],
        "log_history": log,
        "eval_history": evals,
        "eval_metrics": evals[-1],
        "world_size": 2,
        "accumulation": 2,
        "global_batch": 16,
        "samples_per_s": 12.5,
        "tokens_per_s": 900.0,
        "outputs": {"adapter": str(folder / "adapter")},
        "run_info": {
            "device": "cuda:0",
            "backend": "nccl",
            "precision": "bf16",
            "plan_os": "linux",
            "peak_mem_mib": 2048.0,
            "memory_estimate_gib": 2.5,
            "lora_targets": ["q_proj", "v_proj"],
            "lora_layers": 4,
        },
    }
    (folder / "train_result.json").write_text(json.dumps(result), encoding="utf-8")
    config = {
        "model": {"name_or_path": "builtin:tiny-llama-chat", "task": name},
        "lora": {"enabled": True, "r": 8, "alpha": 16},
        "optim": {"lr": 0.01, "schedule": "cosine"},
        "data": {"train": "train.jsonl", "eval": "eval.jsonl", "max_length": 48},
    }
    step = folder / "checkpoints" / f"step-{steps}"
    step.mkdir(parents=True)
    (step / "xtrain_state.json").write_text(json.dumps({"step": steps, "config": config}), encoding="utf-8")
    (folder / "adapter").mkdir()
    record = {"task": name, "chat": True, **({"lineage": lineage} if lineage else {})}
    (folder / "adapter" / "xtrain_run.json").write_text(json.dumps(record), encoding="utf-8")
    check = {
        "task": name,
        "max_length": 48,
        "notes": ["warning: a note"],
        "sources": [
            {"role": "train", "source": "train.jsonl", "checked": 3, "total": 3, "lengths": [5, 9, 7]}
        ],
        "example": {
            "source": "train.jsonl",
            "row": 0,
            "tokens": 9,
            "trained": 4,
            "pieces": [{"text": "where is the fish? ", "trained": False}, {"text": text, "trained": True}],
        },
    }
    (folder / "data_check.json").write_text(json.dumps(check), encoding="utf-8")
    samples = [
        {
            "step": s,
            "samples": [
                {"reference": text, "prediction": f"answer at {s}", "labels": ["reference", "prediction"]}
            ],
        }
        for s in (0, steps)
    ]
    (folder / "eval_samples.json").write_text(json.dumps({"evaluations": samples}), encoding="utf-8")
    return folder


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.ids: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.ids += [v for k, v in attrs if k == "id" and v]
        assert not [k for k, _ in attrs if k.startswith("on")], (tag, attrs)  # no event handler

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parsed(html: str) -> Tags:
    found = Tags()
    found.feed(html)
    return found


def render(*folders: Path) -> str:
    runs, chained = read_runs(list(folders))
    return page.render(runs, chained)


def test_a_run_has_every_section_and_its_facts(tmp_path: Path) -> None:
    html = render(write_run(tmp_path / "run"))
    found = parsed(html)
    assert found.ids == SECTIONS and found.tags <= OURS
    text = " ".join(" ".join(found.text).split())
    for fact in (
        "16 = 4 per-device x 2 processes x 2 accumulation",
        "cuda:0 on linux, 2 processes over nccl",
        "LoRA r=8, alpha=16 on q_proj, v_proj (4 layers)",  # the layers the run adapted (issue 60)
        "2048 MiB peak",
        "before (step 0)",
        "after (step 20)",
        "base model (step 0)",
        "trained (step 20)",
        "answer at 20",
        "tokens per row 5-9",
    ):
        assert fact in text, fact
    assert html.count("<svg") == 3  # loss (eval_loss in it), learning rate, token accuracy (eval)
    assert "<title>train, step 2: 1</title>" in html  # a tooltip on a point


def test_text_from_the_run_is_escaped(tmp_path: Path) -> None:
    folder = write_run(tmp_path / f"run {ATTACK[:8]}", text=ATTACK)
    html = render(folder)
    found = parsed(html)
    assert found.tags <= OURS and "<script" not in html and "<img" not in html
    assert sum(ATTACK in t for t in ["".join(found.text)]) == 1  # shown as text
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html


def test_several_runs_are_overlaid_and_a_chain_is_put_in_order(tmp_path: Path) -> None:
    a = write_run(tmp_path / "sft")
    b = write_run(
        tmp_path / "dpo",
        name="preference",
        steps=10,
        lineage=[
            {
                "task": "causal-lm",
                "source": str(a / "adapter"),
                "adapter_sha256": "ab" * 32,
                "mode": "continue",
                "base": "builtin:tiny-llama-chat",
            }
        ],
    )
    runs, chained = read_runs([b, a])  # given in the wrong order
    assert chained and [r.name for r in runs] == ["sft", "dpo"]
    html = page.render(runs, chained)
    assert html.count('class="stage"') == 2 * 3  # both stages marked on the 3 shared panels
    loss = next(p for p in page.merged_panels(runs, chained) if p.title == "loss")
    assert {line.run for line in loss.lines} == {"sft", "dpo"}
    assert max(x for line in loss.lines if line.run == "dpo" for x, _ in line.points) == 30  # after sft's 20
    assert "stage 2 of a chain on builtin:tiny-llama-chat" in " ".join(parsed(html).text)
    # the stages answered the same inputs: the first one's step 0 is the base model's answers
    assert "base model (step 0)" in html and "start: sft" not in html
    # another eval set: each stage's own table, the dpo stage's step 0 named for the sft stage (issue 60)
    samples = [{"step": s, "samples": [{"reference": "other", "prediction": f"at {s}"}]} for s in (0, 10)]
    other = json.dumps({"evaluations": samples})
    (b / "eval_samples.json").write_text(other, encoding="utf-8")
    text = " ".join(" ".join(parsed(page.render(*read_runs([a, b]))).text).split())
    assert "base model (step 0)" in text and "start: sft (step 0)" in text  # sft's, then dpo's
    assert "start: sft (step 0)" in " ".join(parsed(render(b)).text)  # alone: named by its folder
    # not a chain: overlaid on the same steps, as given
    c = write_run(tmp_path / "other", steps=10)
    runs, chained = read_runs([c, a])
    assert not chained and [r.name for r in runs] == ["other", "sft"]
    assert "sft: before -&gt; after" in page.render(runs, chained)


def test_the_page_goes_beside_the_run_and_never_over_a_file_it_did_not_write(tmp_path: Path) -> None:
    from xtrain.cli import main

    run = write_run(tmp_path / "run")
    assert main(["report", str(run)]) == 0
    first = (run / "report.html").read_text(encoding="utf-8")
    assert page.GENERATOR in first
    assert main(["report", str(run)]) == 0  # its own page: replaced
    mine = tmp_path / "notes.html"
    mine.write_text("my notes", encoding="utf-8")
    assert main(["report", str(run), "-o", str(mine)]) != 0
    assert mine.read_text(encoding="utf-8") == "my notes"
    assert main(["report", str(run), "-o", str(mine), "--force"]) == 0
    assert main(["report", str(run), str(write_run(tmp_path / "b")), "-o", str(tmp_path)]) == 0
    assert (tmp_path / "report.html").is_file()


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: p / "missing", "is not a folder"),
        (lambda p: p, "is not an xtrain run"),
        (lambda p: (write_run(p / "run-1"), p)[1], "holds runs, it is not one"),
        (lambda p: ((p / "logs").mkdir(), p)[1], "has no history yet"),
    ],
    ids=["missing", "not-a-run", "a-folder-of-runs", "no-history-yet"],
)
def test_bad_input_is_one_line(
    tmp_path: Path, make: Any, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from xtrain.cli import main

    assert main(["report", str(make(tmp_path))]) != 0
    out, err = capsys.readouterr()
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


scalars = st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats() | st.text(max_size=10)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=4), inner, max_size=2),
    max_leaves=6,
)


def shaped(schema: Any) -> st.SearchStrategy:
    """Content of a file's shape (``schema``: its keys, each value's shape) with any value in any
    place: at each level the right shape (each key there or not) or something else."""
    if isinstance(schema, dict) and schema:
        right = st.fixed_dictionaries({}, optional={k: shaped(v) for k, v in schema.items()})
    elif isinstance(schema, dict):  # a dict with any keys
        right = st.dictionaries(st.text(max_size=6), values, max_size=3)
    elif isinstance(schema, list):
        right = st.lists(shaped(schema[0]), max_size=3)
    else:
        right = st.just(schema) | scalars
    return right | values


CALL = {"name": "f", "arguments": {}, "result": "1"}
SAMPLE = {
    "reference": "",
    "prediction": "",
    "labels": [""],
    "details": {"reward": 0.5, "rewards": {}, "answer": "", "calls": [CALL]},
}
SOURCE = {
    "role": "",
    "source": "",
    "checked": 1,
    "total": 1,
    "row_format": "",
    "lengths": [1],
    "truncated": 0,
    "trained": 1,
    "trained_kept": 1,
    "labels": {},
    "images": [1],
    "seconds": [1.0],
}
EXAMPLE = {
    "source": "",
    "row": 0,
    "pieces": [{"text": "", "trained": True, "more": 0}],
    "inputs": [""],
    "label": "",
    "tokens": 1,
    "trained": 1,
}
INFO = {"device": "", "backend": "", "precision": "", "peak_mem_mib": 1.0, "memory_estimate_gib": 1.0}
CONFIG = {
    "model": {"name_or_path": "", "task": ""},
    "lora": {"enabled": True, "r": 8, "target_modules": [""]},
    "optim": {"lr": 0.1},
    "data": {"train": ""},
}
FILES = {
    "train_result.json": {
        "final_step": 4,
        "total_steps": 4,
        "losses": [[1, 0.5]],
        "log_history": [{"step": 1}],
        "eval_history": [{"step": 0}],
        "eval_metrics": {},
        "outputs": {},
        "world_size": 1,
        "global_batch": 8,
        "samples_per_s": 1.0,
        "run_info": INFO,
        "stopped_early": {"reason": ""},
    },
    "eval_samples.json": {"evaluations": [{"step": 0, "samples": [SAMPLE]}]},
    "data_check.json": {"task": "", "max_length": 8, "notes": [""], "sources": [SOURCE], "example": EXAMPLE},
    "adapter/xtrain_run.json": {"task": "", "base": "", "lineage": [{"task": "", "source": "", "mode": ""}]},
    "answers.json": {
        "rows": [{"prompt": "", "base": "", "trained": "", "reference": ""}],
        "metrics": {"m": {"base": 0}},
    },
    "checkpoints/step-20/xtrain_state.json": {"step": 20, "config": CONFIG},
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.one_of(*(st.tuples(st.just(name), shaped(schema)) for name, schema in FILES.items())))
def test_any_content_of_a_runs_files_is_a_page_or_one_line(tmp_path: Path, content: tuple[str, Any]) -> None:
    import tempfile

    which, content = content
    with tempfile.TemporaryDirectory(dir=tmp_path) as root:
        folder = write_run(Path(root) / "run")
        (folder / which).write_text(json.dumps(content), encoding="utf-8")
        try:
            html = render(folder)
        except XtrainError as e:
            assert "\n" not in e.one_line()
            return
        assert parsed(html).tags <= OURS


def test_a_run_not_finished_is_reported_from_its_newest_checkpoint(tmp_path: Path) -> None:
    folder = write_run(tmp_path / "run")
    result = json.loads((folder / "train_result.json").read_text(encoding="utf-8"))
    (folder / "train_result.json").unlink()
    state = folder / "checkpoints" / "step-20" / "xtrain_state.json"
    saved = {**json.loads(state.read_text(encoding="utf-8")), "step": 10, "total_steps": 20}
    saved |= {k: [r for r in result[k] if r["step"] <= 10] for k in ("log_history", "eval_history")}
    state.write_text(json.dumps(saved), encoding="utf-8")
    text = " ".join(" ".join(parsed(render(folder)).text).split())
    assert "10 of 20 (not finished: its newest checkpoint)" in text and "after (step 10)" in text
