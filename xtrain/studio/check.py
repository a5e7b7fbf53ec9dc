"""Before launch, what ``xtrain train --dry-run`` would say of the form's run, as the page shows
it: each stage's YAML and the command that runs it (both to copy), the plan (processes, GPUs,
backend, precision, the batch split), the preflight's notes (the memory estimate per GPU among
them, on CUDA plans), the equivalent launcher commands, and the data check on the first rows
with one example's trained tokens marked.

The same calls as the command line: ``train.stages.load_stages`` (every stage read and checked,
``previous`` resolved), ``commands.launching.prepare`` (the plan for this machine and every
preflight check, as a dry run), ``equivalent_commands``; a recipe's stages as
``commands.recipe.run_recipe`` checks them before its first one trains. Nothing is written in
the runs folder: the YAMLs are checked from a private folder.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from xtrain import builtin
from xtrain.errors import XtrainError
from xtrain.report.html import join, tag
from xtrain.report.sections import data_report
from xtrain.shell import quote
from xtrain.studio.form import Draft
from xtrain.tasks.data_report import DataReport


def _plain(markup: str) -> str:
    from rich.text import Text

    return Text.from_markup(markup).plain


def train_command(draft: Draft, shell: str) -> str:
    """``xtrain train`` on the YAMLs where the studio saves them, quoted for ``shell``."""
    words = ["xtrain", "train", *(str(s.config) for s in draft.stages), *draft.flags]
    return " ".join(quote(shell, a) for a in words)


def _options(draft: Draft) -> Any:
    from xtrain.commands.launching import LaunchOptions

    return LaunchOptions(draft.processes, draft.gpus, None, None, False, None, True, False)


def _data(report: DataReport | str | None) -> str | None:
    if report is None:
        return None
    if isinstance(report, str):
        return str(tag("p", report, class_="dim"))
    return str(join(data_report(report)))


def _stage(ready: Any, config: Path, draft_text: str) -> dict[str, Any]:
    """One stage's check as the page shows it."""
    from xtrain.commands.launching import equivalent_commands

    plan = ready.run.plan
    notes = [
        {"label": n.label, "text": n.text, "level": n.level} for n in ready.notes if n.data is None and n.text
    ]
    fitted = [_plain(line) for line in ready.lines if line.startswith("[bold]Fitted")]
    data = next((_data(n.data) for n in ready.notes if n.data is not None), None)
    shell = "PowerShell" if plan.shell == "powershell" else "bash"
    commands = [
        {"title": f"{title} ({shell})", "lines": lines}
        for title, lines in equivalent_commands(plan, ["--config", str(config)], ready.shard_flags)
    ]
    line = plan.summary(ready.run.settings.batch_line)  # the dry run's: the batch in numbers
    return {
        "yaml": draft_text, "plan": line, "notes": notes, "fitted": fitted,
        "data": data, "commands": commands, "gpus": plan.gpu_ids, "device": plan.device,
        "processes": plan.world_size, "backend": plan.backend, "precision": plan.mixed_precision,
    }  # fmt: skip


def _loaded(draft: Draft, tmp: str) -> list[Any]:
    """The draft's stages read and checked as ``xtrain train`` reads them (``load_stages``), from
    copies in ``tmp``."""
    from xtrain.train.stages import load_stages

    paths = []
    for stage in draft.stages:
        path = Path(tmp) / stage.config.name
        path.write_text(stage.text, encoding="utf-8")
        paths.append(path)
    return load_stages(paths, [])


def configs_valid(draft: Draft) -> None:
    """Every stage's config read and checked (its keys and values, ``previous``, the output
    folders): what a launch checks before it saves anything, in a moment (nothing loads)."""
    with tempfile.TemporaryDirectory(prefix="xtrain-studio-check-") as tmp:
        _loaded(draft, tmp)


def check(draft: Draft) -> dict[str, Any]:
    """Every stage checked as ``xtrain train --dry-run`` checks it; one ``XtrainError`` line for
    the first thing wrong."""
    from xtrain.commands.launching import prepare
    from xtrain.train.stages import check_states, planned_config, stage_state

    with tempfile.TemporaryDirectory(prefix="xtrain-studio-check-") as tmp:
        stages = _loaded(draft, tmp)
        states = [stage_state(s) for s in stages]
        check_states(stages, states)
        done = {s.number for s, state in zip(stages, states, strict=True) if state.finished}
        options, shown, shell = _options(draft), [], "bash"
        for stage, saved in zip(stages, draft.stages, strict=True):
            start = stage.cfg.model.name_or_path
            if builtin.is_stage(start) and not builtin.stage_built(start):
                shown.append(_not_built(saved, start))
                continue
            ready = prepare(planned_config(stages, stage, done), options)
            options = dataclasses.replace(options, facts=ready.run.facts)  # probed once
            shell = ready.run.plan.shell
            shown.append({**_stage(ready, saved.config, saved.text), "task": saved.task})
    return {"stages": shown, "command": train_command(draft, shell), "folder": str(draft.folder)}


def _not_built(saved: Any, start: str) -> dict[str, Any]:
    """A stage that starts from a trained built-in not trained yet: trained at launch, first."""
    line = f"{start} is trained on this machine when the run starts (once, a few seconds): checked then"
    return {"yaml": saved.text, "plan": "-", "notes": [{"label": "Start", "text": line, "level": "info"}],
            "fitted": [], "data": None, "commands": [], "task": saved.task}  # fmt: skip


def refuse_existing(draft: Draft) -> None:
    """A new run never goes into a folder that holds one (nothing of the user's overwritten)."""
    if draft.folder.exists() and any(draft.folder.iterdir()):
        raise XtrainError(
            f"{draft.folder} exists and is not empty",
            "choose another name for the run (or open that run to resume it)",
        )
