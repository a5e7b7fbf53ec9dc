"""The Machine view: what ``xtrain doctor`` finds (the same full probe, rules and checks:
``planning.resolve``), as plain data for the page: the facts' rows, the findings with their fixes
written for this machine's shell, the plan with the reason of each choice; and the smoke test
(``doctor --smoke``: the planned processes started for real, an all-reduce checked and timed)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any


def diagnosis() -> dict[str, Any]:
    """``xtrain doctor`` as data: facts, findings (severity, message, fix), plan, verdict."""
    from xtrain.commands.render import facts_rows
    from xtrain.planning.resolve import resolve

    found = resolve(full_probe=True)
    plan = found.plan
    values = {
        "device": plan.device, "num_processes": str(plan.num_processes), "backend": plan.backend or "none",
        "launcher": plan.launcher, "mixed_precision": plan.mixed_precision,
        "tf32": "on" if plan.tf32 else "off",
        "cpu_staged_allreduce": "on" if plan.cpu_staged_allreduce else "off",
        "dataloader_workers": str(plan.dataloader_workers), "media_workers": str(plan.media_workers),
        "pin_memory": "on" if plan.pin_memory else "off",
    }  # fmt: skip
    return {
        "facts": [list(row) for row in facts_rows(found.facts)],
        "findings": [asdict(f) for f in found.findings],
        "plan": {
            "summary": plan.summary(),
            "choices": [[key, values.get(key, ""), why] for key, why in plan.reasons.items()],
            "env": sorted(plan.env.items()),
        },
        "shell": "PowerShell" if plan.shell == "powershell" else "bash",
        "worst": found.worst,
    }


def smoke() -> dict[str, Any]:
    """``xtrain doctor --smoke``: the planned processes, an all-reduce checked on every rank."""
    from xtrain.commands.render import smoke_line
    from xtrain.launch.smoke import run_smoke
    from xtrain.planning.resolve import resolve

    result = run_smoke(resolve().plan)
    ranks = [
        {
            "rank": r.rank,
            "device": r.device,
            "ok": r.ok,
            "error": r.error,
            "value": r.value,
            "expected": r.expected,
        }
        for r in result.ranks
    ]
    return {"ok": result.ok, "line": smoke_line(result), "ranks": ranks}
