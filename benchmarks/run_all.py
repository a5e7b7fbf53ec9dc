"""Run every CPU benchmark and write docs/performance.md (one command reproduces it).

    python benchmarks/run_all.py --out docs/performance.md            # ~25 min on 2 cores
    python benchmarks/run_all.py --quick --out /tmp/performance.md    # 2 repeats, ~10 min
    python benchmarks/run_all.py --smoke                              # every section once, ~2 min
    python benchmarks/run_all.py --quick --only startup --merge-into RESULT.json --out docs/performance.md
                                      # measure one section again into a saved result, re-render

``--smoke`` checks that the benchmarks still run (CI runs it: tests/test_benchmarks_smoke.py):
it resolves every ``from X import name`` in benchmarks/*.py (function-level imports included)
and runs every section once with the smallest settings (one repeat, a few steps), in two lanes
(child processes, one per core of a 2-core CI machine: each benchmark runs its variants one
after another, so it uses one core), renders the page, and writes the page and the JSON to a
temporary folder, never into docs/. Its figures measure nothing.

Sections: loops (xtrain vs hand-written vs HF Trainer), per-step overhead (micro model), 1 vs 2
processes (and a hand-written DDP taken apart: ddp_parts), start-up, resume cost, packing, each
task's job against a hand-written loop, 4-bit vs 16-bit, export (merge + GGUF, a ~300M model).
GPU rows are not run here: the page gives
the commands (benchmarks/gpu.py) for a CUDA machine. The raw results are saved as JSON
(``--json-out``, default: a file in the temp folder, named in the log); ``--from-json`` renders a
saved result again.
"""

from __future__ import annotations

import argparse
import ast
import datetime as _dt
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, machine, model_size, table  # noqa: E402

from xtrain.bench.flops import PEAKS  # noqa: E402


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


Section = Callable[[], dict[str, Any]]


def bench(name: str) -> Any:
    """A benchmark module, imported when its section runs: a smoke run's parent and lanes pay
    only for the libraries of what they run."""
    return importlib.import_module(name)


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (a load-independent cost)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def sections(repeats: int) -> dict[str, Section]:
    """The page's sections, each a measurement with ``repeats`` interleaved repeats."""
    return {
        "loops": lambda: bench("loops").measure(repeats=repeats + 4, log=log),
        "overhead": lambda: bench("loops").measure(
            repeats=repeats, steps=500, warmup=20, size="micro", per_device=2, accum=2, log=log
        ),
        # 120 steps: a 40-step run trains ~7 s, less than its start-up; the ceiling of two copies
        # still moves between runs on this VM (1.18x, 1.45x, 1.97x seen on 2026-11-25)
        "scaling": lambda: bench("scaling").measure(processes=2, repeats=repeats, steps=120, log=log),
        "ddp_parts": lambda: bench("ddp_parts").measure(repeats=repeats, log=log),
        # whole-process times that move by seconds with the machine's load: more repeats
        "startup": lambda: bench("startup").measure(repeats=repeats + 3, log=log),
        "resume": lambda: bench("resume").measure(repeats=repeats, log=log),
        "packing": lambda: bench("packing").measure(repeats=repeats, log=log),
        "fingerprint": lambda: bench("fingerprint").measure(repeats=2 * repeats, log=log),
        "image_to_text": lambda: bench("image_to_text").measure(repeats=repeats, log=log),
        "speech_to_text": lambda: bench("speech_to_text").measure(repeats=repeats, log=log),
        "image_classification": lambda: bench("image_classification").measure(repeats=repeats, log=log),
        "seq_cls": lambda: bench("seq_cls").measure(repeats=repeats, log=log),
        "vision_language": lambda: bench("vision_language").measure(repeats=repeats, log=log),
        "quantization": lambda: bench("quantization").measure(repeats=repeats, log=log),
        # exact byte counts, nothing timed: one run
        "memory_estimate": lambda: bench("memory_estimate").measure(log=log),
        # a ~300M Llama merged and written as GGUF: minutes a run, one run
        "export": lambda: bench("export").measure(size="base", log=log),
        # peaks are exact byte counts; the step times interleave the variants
        "chunked_loss": lambda: bench("chunked_loss").measure(repeats=repeats, log=log),
        # exact peaks (the profiler's allocator count), 1 vs 2 processes holding half of each sequence
        "sequence_parallel": lambda: bench("sequence_parallel").measure(log=log),
        # TRL in its own environment (.venv-trl or $XTRAIN_TRL_PYTHON); without it, one line
        "preference": lambda: bench("preference_vs_trl").measure(repeats=repeats, log=log),
        # the same TRL environment; GRPO on the quickstart's job, no vLLM on either side
        "grpo": lambda: bench("grpo_vs_trl").measure(repeats=repeats, log=log),
        # the same TRL environment; a reward model, and the loss on TRL's own batch
        "reward": lambda: bench("reward_vs_trl").measure(repeats=repeats, log=log),
    }


def smoke_sections() -> dict[str, Section]:
    """The same sections once each, with the smallest settings their code accepts (one repeat,
    a few steps, the micro model where a benchmark takes a size): seconds each, figures that
    mean nothing. They run every benchmark's code path (its worker processes, the launcher,
    the task builders) so that an import or API change that breaks one fails CI."""
    return {
        "imports": check_imports,
        # the overhead section is this same run (loops.py, micro model, 2 x 2): see SMOKE_REUSED
        "loops": lambda: bench("loops").measure(
            repeats=1, steps=4, warmup=1, size="micro", per_device=2, accum=2, log=log
        ),
        "scaling": lambda: bench("scaling").measure(processes=2, repeats=1, steps=4, log=log),
        "ddp_parts": lambda: bench("ddp_parts").measure(repeats=1, steps=7, size="micro", log=log),
        "startup": lambda: bench("startup").measure(repeats=1, log=log, warm=False),
        "resume": lambda: bench("resume").measure(repeats=1, starts=(2,), log=log),
        "packing": lambda: bench("packing").measure(repeats=1, steps=4, log=log),
        "fingerprint": lambda: bench("fingerprint").measure(repeats=1, log=log, sizes=(2000,)),
        "image_to_text": lambda: bench("image_to_text").measure(repeats=1, steps=3, warmup=1, log=log),
        "speech_to_text": lambda: bench("speech_to_text").measure(repeats=1, steps=3, warmup=1, log=log),
        "image_classification": lambda: bench("image_classification").measure(
            repeats=1, steps=3, warmup=1, log=log
        ),
        "seq_cls": lambda: bench("seq_cls").measure(repeats=1, steps=3, warmup=1, log=log),
        "vision_language": lambda: bench("vision_language").measure(
            repeats=1, steps=4, per_device=4, accum=1, log_every=2, log=log
        ),
        "quantization": lambda: bench("quantization").measure(
            repeats=1, steps=3, warmup=1, size="micro", log=log
        ),
        "memory_estimate": lambda: bench("memory_estimate").measure(log=log, smoke=True),
        "export": lambda: bench("export").measure(size="micro", log=log),
        "chunked_loss": lambda: bench("chunked_loss").measure(log=log, smoke=True),
        "sequence_parallel": lambda: bench("sequence_parallel").measure(log=log, smoke=True),
        "preference": lambda: bench("preference_vs_trl").measure(repeats=1, steps=4, skip=0, log=log),
        "grpo": lambda: bench("grpo_vs_trl").measure(repeats=1, steps=4, skip=0, log=log),
        "reward": lambda: bench("reward_vs_trl").measure(repeats=1, steps=4, skip=0, log=log),
    }


# In the smoke run the overhead section (loops.py on the micro model, batch 2 x 2) is rendered
# from the loops section's run, which has exactly that setup: the same code, three fewer
# processes.
SMOKE_REUSED = {"overhead": "loops"}
# The smoke run's two lanes (about the same time each on 2 cores).
SMOKE_LANES = (
    (
        "imports",
        "startup",
        "scaling",
        "fingerprint",
        "image_to_text",
        "speech_to_text",
        "seq_cls",
        "memory_estimate",
        "export",
        "preference",
        "grpo",
        "sequence_parallel",
    ),
    (
        "loops",
        "packing",
        "vision_language",
        "resume",
        "image_classification",
        "quantization",
        "ddp_parts",
        "chunked_loss",
    ),
)


def check_imports() -> dict[str, Any]:
    """Import every benchmark module and resolve every ``from X import name`` in it, including
    the imports inside functions (which importing the module does not run): the check that
    would have caught ``from xtrain.bench import Window`` after the bench package was split."""
    here = Path(__file__).resolve().parent
    names = 0
    files = sorted(here.glob("*.py"))
    for path in files:
        importlib.import_module(path.stem)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, ast.ImportFrom) or node.level or node.module in (None, "__future__"):
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                names += 1
                if not hasattr(module, alias.name):
                    try:
                        importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        where = f"{path.name}:{node.lineno}"
                        raise ImportError(
                            f"{where}: cannot import name {alias.name!r} from {node.module!r}"
                        ) from None
    log(f"imports: {len(files)} benchmark modules, {names} imported names resolve")
    return {"modules": len(files), "names": names}


def run_lanes(lanes: tuple[tuple[str, ...], ...], folder: Path) -> dict[str, Any]:
    """The smoke sections in ``len(lanes)`` child processes at once (``--lane``), each running
    its sections in order; their logs are printed whole, one lane after the other, so every
    section's lines stay under its ``== name`` header. Returns the sections' results."""
    started = []
    for i, names in enumerate(lanes):
        log(f"smoke: lane {i + 1}: {', '.join(names)}")
        out = folder / f"lane{i + 1}.json"
        logfile = (folder / f"lane{i + 1}.log").open("wb")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--smoke", "--lane", "--only", ",".join(names),
               "--json-out", str(out)]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=logfile, stderr=subprocess.STDOUT, cwd=REPO)
        started.append((proc, logfile, out))
    results: dict[str, Any] = {}
    failed = []
    for i, (proc, logfile, out) in enumerate(started):
        code = proc.wait()
        logfile.close()
        sys.stderr.write(Path(logfile.name).read_text(encoding="utf-8", errors="replace"))
        sys.stderr.flush()
        if code != 0:
            failed.append(f"lane {i + 1} ({', '.join(lanes[i])}) exited {code}")
            continue
        lane = json.loads(out.read_text(encoding="utf-8"))
        results.update({name: lane[name] for name in lanes[i] if name in lane})
    if failed:
        raise SystemExit("smoke: " + "; ".join(failed) + " (its log is above)")
    return results


def run(to_run: dict[str, Section], only: set[str] | None, smoke: bool = False) -> dict[str, Any]:
    results: dict[str, Any] = {
        "machine": machine(),
        "started": _dt.datetime.now().isoformat(timespec="seconds"),
        "smoke": smoke,
    }
    results["load_before"] = os.getloadavg()
    for name, fn in to_run.items():
        if only and name not in only:
            continue
        log(f"== {name}")
        t0, cpu0 = time.perf_counter(), cpu_seconds()
        measured = _dt.datetime.now().isoformat(timespec="seconds")
        results[name] = fn()
        results[name]["measured"] = measured
        results[name]["elapsed_s"] = time.perf_counter() - t0
        results[name]["cpu_s"] = cpu_seconds() - cpu0
        results[name]["load_after"] = os.getloadavg()
    results["finished"] = _dt.datetime.now().isoformat(timespec="seconds")
    return results


def loop_verdict(r: dict[str, Any]) -> str:
    """What the loop comparison says, from its numbers (and the micro model's overhead)."""
    cpu = r["loops"]["cpu"]
    vs_plain, vs_trainer = cpu["xtrain_vs_plain"], cpu["xtrain_vs_trainer"]
    paired = cpu["paired_xtrain_vs_plain"]
    text = (
        f"By CPU time xtrain ran at **{vs_plain:.3f}x** the hand-written loop (target >= 0.98: "
        f"{'met' if vs_plain >= 0.98 else 'not met'} by the medians) and **{vs_trainer:.3f}x** Trainer "
        f"({'faster' if vs_trainer > 1 else 'not faster'}). *Paired* ratios divide runs that ran next "
        f"to each other; they span {paired['min']:.3f}-{paired['max']:.3f} here"
    )
    if paired["min"] <= 1.0 <= paired["max"]:
        text += ", so on this machine the loops differ by less than the run-to-run noise"
    text += "."
    if "overhead" in r:
        ov = r["overhead"]["cpu"]["steps_per_s"]
        extra_ms = 1000 / ov["xtrain"]["median"] - 1000 / ov["plain"]["median"]
        step_ms = 1000 / cpu["steps_per_s"]["plain"]["median"]
        text += (
            f" The sharper figure is the [per-step overhead](#per-step-overhead-micro-model): "
            f"{extra_ms:+.2f} ms per optimizer step, which on this model's {step_ms:.0f} ms step implies "
            f"about {step_ms / (step_ms + max(extra_ms, 0.0)):.3f}x the hand-written loop."
        )
    return text + "\n"


# -- the page ------------------------------------------------------------
def _s(d: dict[str, float], fmt: str = "{:.2f}") -> str:
    """median (min-max)"""
    return f"{fmt.format(d['median'])} ({fmt.format(d['min'])}-{fmt.format(d['max'])})"


def _remeasured(r: dict[str, Any]) -> str:
    """The sections measured again later (``--merge-into``), with when and on which commit."""
    again = r.get("remeasured") or {}
    parts = [f"{name} at {v.get('measured')} (`{v.get('commit')}`)" for name, v in sorted(again.items())]
    return ("; measured again with `--only`: " + ", ".join(parts)) if parts else ""


def _load(section: dict[str, Any]) -> str:
    return "{:.1f}".format(section["load_after"][1]) if "load_after" in section else "?"


MEDIA_LOOPS = {"hand-written": "plain", "xtrain": "xtrain", "xtrain, 1 DataLoader worker": "xtrain_worker"}
DATA_SHARE = (
    "Data share: the time spent reading and decoding the rows and collating them, in the training "
    "process (the plan on this 2-core CPU gives no DataLoader workers), over the training time; with "
    "one DataLoader worker (what the plan gives image and audio tasks on GPU machines), the time the "
    "training process waited for its next batch (the loop's own count)."
)


def media_rows(section: dict[str, Any], rate_key: str) -> list[list[str]]:
    """[loop, rate, data share] of a media benchmark's loops (hand-written, xtrain, xtrain + worker)."""
    return [
        [label, _s(section[rate_key][key], "{:.1f}"), _s(section["data_share"][key], "{:.0%}")]
        for label, key in MEDIA_LOOPS.items()
        if key in section[rate_key]
    ]


def worker_effect(section: dict[str, Any], rate_key: str) -> str:
    """One sentence: what one DataLoader worker changed (rate and wait)."""
    rates, shares = section[rate_key], section["data_share"]
    if "xtrain_worker" not in rates:
        return ""
    gain = rates["xtrain_worker"]["median"] / rates["xtrain"]["median"]
    return (
        f"With one DataLoader worker decoding on the second core, xtrain trains **{gain:.2f}x** as fast "
        f"and waits for data {shares['xtrain_worker']['median']:.0%} of the time instead of "
        f"{shares['xtrain']['median']:.0%}: on a GPU machine the plan gives these tasks such workers "
        "(`media_workers`), on Windows too."
    )


DDP_VARIANTS = {
    "one": "one process (accumulates 2 micro-batches)",
    "copies": "2 processes, no process group (the ceiling)",
    "ddp": "2 ranks, DDP over gloo (one 25 MB bucket)",
    "ddp_noop": "2 ranks, DDP with a comm hook that sends nothing",
    "ddp_buckets": "2 ranks, DDP with 0.05 MB buckets (overlap with backward)",
}


def render_ddp_parts(d: dict[str, Any], xtrain: dict[str, Any] | None = None) -> str:
    """The hand-written DDP breakdown under the 1-vs-2 section: what each part of data parallelism
    costs on this machine, in words that follow the figures."""
    s, sp = d["setup"], d["speedup"]
    rows = [
        [label, _s(d["samples_per_s"][v], "{:.1f}"), f"{sp[v]:.2f}x", _s(d["step_ms"][v], "{:.0f}"),
         _s(d["cpu_ms"][v], "{:.0f}")]
        for v, label in DDP_VARIANTS.items()
    ]  # fmt: skip
    comm = sp["ddp"] / sp["ddp_noop"]
    machinery = sp["ddp_noop"] / sp["copies"]
    buckets = sp["ddp_buckets"] / sp["ddp"]
    return (
        "\n### Where the time of two processes goes (hand-written DDP)\n\n"
        f"`benchmarks/ddp_parts.py`: the same {s['size']} model with LoRA as a hand-written loop "
        f"(`hand_written_loop`, AdamW, clipping) under `torch.nn.parallel.DistributedDataParallel` "
        f"over gloo, global batch {s['global_batch']}, {s['steps']} steps (the first {s['warmup']} "
        f"left out), one compute thread a process, {s['repeats']} interleaved repeats. *Step* is the "
        "slower rank's median wall time per optimizer step; *CPU* its CPU time per step (time it "
        f"computed rather than waited). Load average after: {_load(d)}.\n\n"
        + table(["variant", "samples/s", "vs one", "step (ms)", "CPU per step (ms)"], rows)
        + f"\n\nThe gradient all-reduce and the wait for the other rank (DDP vs DDP sending nothing): "
        f"**{comm:.2f}x**; DDP's own machinery without communication (vs two independent processes): "
        f"**{machinery:.2f}x**; smaller buckets that start reducing during the backward pass: "
        f"**{buckets:.2f}x** of one bucket. "
        + (
            "Small buckets do not help here (gloo reduces on the same 2 cores that compute). "
            if buckets < 1.03
            else "Small buckets help: the reduce of the first buckets overlaps the rest of the backward. "
        )
        + (
            f"xtrain's own 2-process run above: {xtrain['speedup']:.2f}x one process, the hand-written "
            f"DDP here {sp['ddp']:.2f}x (different runs: compare within each table). "
            if xtrain is not None
            else ""
        )
        + "xtrain's loop uses DDP's default buckets (accelerate's `DistributedDataParallelKwargs` "
        "defaults, `gradient_as_bucket_view=True`, `find_unused_parameters=False` for LoRA).\n"
    )


def render(r: dict[str, Any], command: str) -> str:
    m = r["machine"]
    out: list[str] = []
    w = out.append
    w("# Performance\n")
    if r.get("smoke"):
        w(
            "**Smoke run (`run_all.py --smoke`): every section ran once with the smallest settings to "
            "check that the benchmarks run. The figures below measure nothing.**\n"
        )
    w(
        "What xtrain's training costs next to a hand-written PyTorch loop and Hugging Face Trainer, how "
        "it scales from one process to two, how fast it starts and resumes, and what packing buys. "
        "Every figure on this page comes from one command:\n"
    )
    w(f"```bash\n{command}\n```\n")
    w(
        "`benchmarks/README.md` describes each benchmark; each one also runs alone "
        "(`python benchmarks/loops.py`, `scaling.py`, `startup.py`, `resume.py`, `packing.py`).\n"
    )
    w("## Machine\n")
    w(
        table(
            ["", ""],
            [
                ["measured", f"{r['started']} to {r['finished']}" + _remeasured(r)],
                ["OS / CPU", f"{m['os']}, {m['cpu']}, {m['cores']} cores, {m.get('memory_gib', '?')} GiB"],
                ["GPU", ", ".join(m["gpus"]) or "none in this session (see [GPU rows](#gpu-rows))"],
                ["Python / torch", f"{m['python']} / {m['torch']}"],
                [
                    "accelerate / transformers / peft / datasets",
                    f"{m['accelerate']} / {m['transformers']} / {m['peft']} / {m['datasets']}",
                ],
                ["xtrain commit", f"`{m['commit']}` (plus the working tree at the time)"],
                ["load average (1 min) before", f"{r['load_before'][0]:.1f}"],
            ],
        )
    )
    w(
        "\nThis is a shared 2-core machine: other jobs ran during the measurements (the load average "
        "after each section is in its caption). Every benchmark therefore interleaves its variants, "
        "repeats them, and reports the **median (min-max)** of the repeats; every process gets **one "
        "compute thread** (`OMP_NUM_THREADS=1`), because two OpenMP threads per process on a busy "
        "2-core machine made steps 3-60x slower at random (measured while building this harness), "
        "which would hide every effect below. On a quiet machine with more cores, absolute figures "
        "are higher; the ratios are what this page is for.\n"
    )

    if "loops" in r:
        lp = r["loops"]
        s = lp["setup"]
        size = model_size(s["size"])
        w("## xtrain's loop vs a hand-written loop vs HF Trainer\n")
        w(
            f"Same model ({s['size']}: {size.layers} layers x {size.hidden}, LoRA r=16 on q/k/v/o, no "
            f"dropout), same data (rows of {size.seq_len} token ids), per-device batch {s['per_device']} "
            f"x accumulation {s['accum']}, AdamW, cosine schedule with warm-up, clipping at 1.0, a "
            f"logging sync every 10 steps, fp32, one process. A run's speed is 1 / its median "
            f"optimizer-step time after {s['warmup']} warm-up steps ({s['steps']} steps per run); "
            f"{s['repeats']} runs of each, interleaved, each in a fresh process. "
            "*Wall* is elapsed time per step; *CPU* is the process's CPU time per step, which other "
            "jobs on the machine disturb less (one compute thread), so it is the sharper "
            "comparison of what each loop costs. Load average after: " + _load(lp) + ".\n"
        )
        rows = []
        for k, label in (
            ("plain", "hand-written PyTorch loop"),
            ("xtrain", "xtrain"),
            ("trainer", "HF Trainer"),
        ):
            rows.append(
                [
                    label,
                    _s(lp["wall"]["steps_per_s"][k]) + " steps/s",
                    _s(lp["cpu"]["steps_per_s"][k]) + " steps/s",
                ]
            )
        w(table(["loop", "wall", "CPU time"], rows))
        w("")
        ratio_rows = []
        for clock in ("wall", "cpu"):
            c = lp[clock]
            ratio_rows.append(
                [
                    "wall" if clock == "wall" else "CPU time",
                    f"{c['xtrain_vs_plain']:.3f} (paired {_s(c['paired_xtrain_vs_plain'], '{:.3f}')})",
                    f"{c['xtrain_vs_trainer']:.3f} (paired {_s(c['paired_xtrain_vs_trainer'], '{:.3f}')})",
                ]
            )
        heads = [
            "ratio of medians",
            "xtrain / hand-written (target >= 0.98)",
            "xtrain / Trainer (target > 1)",
        ]
        w(table(heads, ratio_rows))
        w("\n" + loop_verdict(r))
    if "overhead" in r:
        ov = r["overhead"]
        s = ov["setup"]
        w("### Per-step overhead (micro model)\n")
        w(
            "The same comparison with a 1-layer x 32 model on 16-token rows (per-device batch 2 x "
            f"accumulation 2, {s['steps']} steps, {s['repeats']} runs each), where a step costs a few "
            "milliseconds, so what a loop adds around the model shows. Load average after: "
            + _load(ov)
            + ".\n"
        )
        rows = []
        cpu = ov["cpu"]["steps_per_s"]
        for k, label in (
            ("plain", "hand-written PyTorch loop"),
            ("xtrain", "xtrain"),
            ("trainer", "HF Trainer"),
        ):
            ms = 1000 / cpu[k]["median"]
            extra = ms - 1000 / cpu["plain"]["median"]
            rows.append([label, f"{ms:.2f} ms", "-" if k == "plain" else f"{extra:+.2f} ms"])
        w(table(["loop", "CPU time per optimizer step (median)", "vs hand-written"], rows))
        step_ms = 1000 / r["loops"]["cpu"]["steps_per_s"]["plain"]["median"] if "loops" in r else None
        tiny = f"On the tiny model above a step takes {step_ms:.0f} ms; " if step_ms else ""
        w(
            "\nWhat xtrain adds per optimizer step is accelerate's wrappers (accumulate, backward, "
            "clipping, optimizer and scheduler), the dropout reseeding per micro-batch and the "
            f"device-side loss/token sums. {tiny}on a GPU with a real model the host runs ahead of "
            "the device, so the added host time hides behind the device's work.\n"
        )
    if "scaling" in r:
        sc = r["scaling"]
        s = sc["setup"]
        ar = sc["allreduce"]
        w("## 1 vs 2 processes\n")
        w(
            f"`xtrain bench`'s path: `python -m xtrain.run` launched by "
            f"`xtrain.launch.launcher` ({s['launcher']} "
            f"launcher, {s['backend']} on {s['device']}), the {s['size']} model, global batch "
            f"{s['global_batch']} in both runs (the 1-process run accumulates 2 micro-batches), "
            f"{s['steps']} steps, rates from the loop's logging windows after the first, one thread per "
            f"process, {s['repeats']} interleaved repeats. Load average after: {_load(sc)}.\n"
        )
        n = s["processes"]
        rows = [
            ["1", _s(sc["samples_per_s"]["1"], "{:.1f}"), _s(sc["tokens_per_s"]["1"], "{:,.0f}")],
            [str(n), _s(sc["samples_per_s"][str(n)], "{:.1f}"), _s(sc["tokens_per_s"][str(n)], "{:,.0f}")],
            [f"{n} one-process runs at once (no process group)", _s(sc["ceiling_samples_per_s"], "{:.1f}"),
             ""],
        ]  # fmt: skip
        w(table(["processes", "samples/s", "tokens/s"], rows))
        pe = sc["paired_efficiency"]
        bw = f"{ar['busbw_gbps']:.2f} GB/s" if ar.get("busbw_gbps") is not None else "n/a"
        w(
            f"\nSpeedup **{sc['speedup']:.2f}x**, scaling efficiency **{sc['efficiency']:.0%}** "
            f"(paired runs: {pe['min']:.0%}-{pe['max']:.0%}); gloo all-reduce bus bandwidth {bw} "
            f"({ar['size_mib']:g} MiB, from `xtrain doctor --smoke`'s code).\n\n"
            f"Where the rest goes: {n} copies of the one-process run started together, with no "
            f"process group and no communication at all, reach {sc['ceiling_speedup']:.2f}x of one "
            f"run: that is this machine's own ceiling for {n} processes (its cores share caches and "
            f"memory bandwidth, and the VM's neighbours take their share). The {n}-process run "
            f"reaches **{sc['of_ceiling']:.0%} of that ceiling**; the rest is what data parallelism "
            "itself costs here, taken apart on a hand-written DDP loop below. See "
            "[reading `xtrain bench`](#reading-xtrain-bench-on-your-machine) for what to expect on GPUs.\n"
        )
    if "ddp_parts" in r:
        w(render_ddp_parts(r["ddp_parts"], r.get("scaling")))
    if "startup" in r:
        st = r["startup"]
        w("## Start-up\n")
        w(
            "Wall time of each command (warm file cache), and the time from starting a training to the "
            "end of its first optimizer step: the bench's tiny model loaded from a folder, ~250 "
            "stories tokenized and packed into 128-token blocks (datasets cache warm: one untimed run "
            f"first), LoRA, one process. {st['setup']['repeats']} interleaved repeats. Load average "
            f"after: {_load(st)}.\n"
        )
        rows = [[f"`{k}`", _s(v) + " s"] for k, v in st["commands_s"].items()]
        for k, v in st["first_step_s"].items():
            rows.append(
                [
                    f"first optimizer step: `{k}`" if "xtrain" in k else f"first optimizer step: {k}",
                    _s(v) + " s",
                ]
            )
        w(table(["what", "seconds"], rows))
        heavy = ", ".join(st["cli_heavy_imports"]) or "none"
        w(
            f"\n`import xtrain.cli` loads {st['cli_modules']} modules and none of torch, transformers, "
            f"peft, datasets or accelerate (heavy imports found: {heavy}). `xtrain train` probes the "
            "machine (importing torch, which the run then reuses) and trains one process in its "
            "own process (`xtrain.launch.launcher.runs_here`): no second interpreter. Until "
            "2026-11-25 it started `python -m xtrain.run` as a child and reached its first step "
            "2-3 s after `python -m xtrain.run`. Most of the rest is importing torch, transformers "
            "and accelerate, which Trainer pays too.\n"
        )
    if "resume" in r:
        rs = r["resume"]
        f = rs["first_step_s"]
        keys = sorted(f, key=int)
        w("## Resume cost\n")
        w(
            "Time from start to the first optimizer step when resuming a real checkpoint written at "
            f"step 10 and one written at step 10,000 (a 1-layer x 32 model trained for 10,000 steps = "
            f"{rs['epochs_at_last']} epochs of {rs['num_samples']} samples, global batch 2: nothing "
            "fabricated). Each timed run copies the "
            "checkpoint into a fresh folder and resumes it with `run.resume=auto`; "
            f"{rs['setup']['repeats']} alternating repeats. Load average after: {_load(rs)}.\n"
        )
        w(table(["resumed at step", "first step after"], [[f"{int(k):,}", _s(f[k]) + " s"] for k in keys]))
        w(
            f"\nRatio 10,000 / 10: **{rs['ratio']:.2f}**. The sampler computes the samples of any step "
            "from (seed, epoch, position) directly (`xtrain/data/sampler.py`), so resuming does not "
            "iterate over the skipped batches; a loader that skipped by iterating would read "
            "10,000 x global-batch samples before its first step.\n"
        )
    if "packing" in r:
        pk = r["packing"]
        s = pk["setup"]
        t = pk["tokens_per_s"]
        w("## Packing (causal LM, variable-length data)\n")
        w(
            f"{s['rows']} rows of {s['stories_per_row']} tiny stories each (about 60-250 tokens), "
            f"`data.max_length` {s['max_length']}, the bench's tiny model with LoRA, per-device batch "
            f"{s['per_device']}, one process, {s['steps']} steps, through `python -m xtrain.run`. "
            "tokens/s counts real tokens only (the attention mask), so padding is work that earns "
            f"nothing; unpacked micro-batches here are {pk['padding_share_unpacked']:.0%} padding. "
            f"{s['repeats']} interleaved repeats. Load average after: {_load(pk)}.\n"
        )
        w(table(["data.packing", "tokens/s (real tokens)"],
                [["off (pad to the longest row)", _s(t["padded"], "{:,.0f}")],
                 ["concatenate (256-token blocks)", _s(t["packed"], "{:,.0f}")]]))  # fmt: skip
        bound = 1 / (1 - pk["padding_share_unpacked"])
        w(
            f"\nPacking: **{pk['speedup']:.2f}x** the real tokens per second; removing "
            f"{pk['padding_share_unpacked']:.0%} padding alone would give {bound:.2f}x if a step's cost "
            "were proportional to its positions (a packed block always attends over all 256 positions, "
            "padded batches only over their longest row). This is `data.packing=concatenate`: attention "
            "crosses document boundaries inside a block (no per-document mask), the usual trade for "
            "pre-training-style data; `data.packing=true` (examples kept apart) is not measured here.\n"
        )
    if "image_to_text" in r:
        it = r["image_to_text"]
        s = it["setup"]
        w("## Image to text (VisionEncoderDecoder, images read from PNG files)\n")
        w(
            "`xtrain quickstart --task image-to-text`'s job (`builtin:tiny-trocr` on `builtin:ocr-lines`: "
            "lazy PNG rows, the ViT image processor, full fine-tune), global batch "
            f"{s['per_device']} x {s['accum']}, {s['steps']} steps, one process, through xtrain's loop "
            "and through a hand-written PyTorch loop over the same workload "
            f"(`benchmarks/image_to_text.py`). {s['repeats']} interleaved repeats. {DATA_SHARE} "
            f"Load average after: {_load(it)}.\n"
        )
        w(table(["loop", "images/s", "data share of step time"], media_rows(it, "images_per_s")))
        w(f"\nxtrain / hand-written: **{it['ratio']:.2f}x**. {worker_effect(it, 'images_per_s')}\n")
    if "seq_cls" in r:
        sc_ = r["seq_cls"]
        s = sc_["setup"]
        w("## Text classification (seq-cls)\n")
        w(
            "`xtrain quickstart`'s job (`builtin:tiny-bert` on `builtin:sentiment`: tokenised "
            f"sentences, LoRA, the head trained whole), global batch {s['per_device']} x {s['accum']}, "
            f"{s['steps']} steps, one process, through xtrain's loop and through a hand-written "
            "PyTorch loop over the same workload (`benchmarks/seq_cls.py`). "
            f"{s['repeats']} interleaved repeats. Load average after: {_load(sc_)}.\n"
        )
        rows = [[label, _s(sc_["samples_per_s"][key], "{:.1f}")] for label, key in MEDIA_LOOPS.items()
                if key in sc_["samples_per_s"]]  # fmt: skip
        w(table(["loop", "sentences/s"], rows))
        w(f"\nxtrain / hand-written: **{sc_['ratio']:.2f}x**.\n")
    if "image_classification" in r:
        ic = r["image_classification"]
        s = ic["setup"]
        w("## Image classification (ViT, images read from PNG files)\n")
        w(
            "`xtrain quickstart --task image-classification`'s job (`builtin:tiny-vit` on "
            "`builtin:color-shapes`: lazy PNG rows, the ViT image processor, LoRA on the attention "
            f"and the head trained whole), global batch {s['per_device']} x {s['accum']}, "
            f"{s['steps']} steps, one process, through xtrain's loop and through a hand-written "
            "PyTorch loop over the same workload (`benchmarks/image_classification.py`). "
            f"{s['repeats']} interleaved repeats. {DATA_SHARE} Load average after: {_load(ic)}.\n"
        )
        w(table(["loop", "images/s", "data share of step time"], media_rows(ic, "images_per_s")))
        w(f"\nxtrain / hand-written: **{ic['ratio']:.2f}x**. {worker_effect(ic, 'images_per_s')}\n")
    if "speech_to_text" in r:
        st = r["speech_to_text"]
        s = st["setup"]
        w("## Speech to text (Whisper, audio read from WAV files)\n")
        w(
            "`xtrain quickstart --task speech-to-text`'s job (`builtin:tiny-whisper` on "
            "`builtin:spoken-words`: lazy 8 kHz WAV rows read with soundfile, resampled to 16 kHz, "
            f"Whisper log-mel features, full fine-tune; clips of {st['mean_clip_s']:.2f} s on average), "
            f"global batch {s['per_device']} x {s['accum']}, {s['steps']} steps, one process, through "
            "xtrain's loop and through a hand-written PyTorch loop over the same workload "
            f"(`benchmarks/speech_to_text.py`). {s['repeats']} interleaved repeats. {DATA_SHARE} "
            f"Load average after: {_load(st)}.\n"
        )
        rows = [
            [label, _s(st["audio_s_per_s"][key], "{:.1f}"), _s(st["clips_per_s"][key], "{:.1f}"),
             _s(st["data_share"][key], "{:.0%}")]
            for label, key in MEDIA_LOOPS.items()
            if key in st["clips_per_s"]
        ]  # fmt: skip
        w(table(["loop", "audio seconds/s", "clips/s", "data share of step time"], rows))
        w(
            f"\nxtrain / hand-written: **{st['ratio']:.2f}x**. A real Whisper pads every clip to 30 s, "
            f"so its step costs far more than decoding a clip. {worker_effect(st, 'clips_per_s')}\n"
        )
    if "vision_language" in r:
        w(vision_language_section(r["vision_language"]))
    if "quantization" in r:
        w(quantization_section(r["quantization"]))
    if "export" in r:
        w(bench("export").render(r["export"]))
    if "preference" in r:
        w(bench("preference_vs_trl").render(r["preference"]))
    if "grpo" in r:
        w(bench("grpo_vs_trl").render(r["grpo"]))
    if "reward" in r:
        w(bench("reward_vs_trl").render(r["reward"]))
    if "memory_estimate" in r:
        w(memory_estimate_section(r["memory_estimate"]))
    if "chunked_loss" in r:
        w(chunked_loss_section(r["chunked_loss"]))
    if "sequence_parallel" in r:
        w(bench("sequence_parallel").render(r["sequence_parallel"]))
    if "fingerprint" in r:
        fp = r["fingerprint"]
        w("## Optimisations\n")
        w(
            "**Tokenizer fingerprint at start-up.** Every start and every resume hashes the "
            "tokenizer to find its tokenized data in the `datasets` cache. It used `datasets`' "
            "`Hasher` over the parsed tokenizer JSON, which grows to seconds with real vocabularies; "
            "it is now sha256 of the canonical JSON (`xtrain/data/sources.py`), the same inputs and "
            "the same stability across processes. Byte-level BPE tokenizers built in-process "
            f"(`benchmarks/fingerprint.py`, best of {fp['repeats']} interleaved calls each):\n"
        )
        rows = [
            [name, f"{v['vocab']:,}", f"{v['hasher_s']:.3f} s", f"{v['current_s']:.3f} s",
             f"{v['hasher_s'] / v['current_s']:.1f}x"]
            for name, v in fp["rows"].items()
        ]  # fmt: skip
        w(table(["tokenizer", "vocabulary", "before (Hasher)", "after (sha256)", "faster"], rows))
        w(
            "\n**Steady-state rates in `xtrain bench`.** The loop's whole-run figure in "
            "`train_result.json` includes the first steps, which pay for lazy initialisation (the "
            "first forward/backward took over a second even for the 1M-parameter model, in the "
            "hand-written loop as well). `xtrain bench` reads the loop's per-window rates from "
            "`train_result.json` (`windows`) and leaves the first window out; both figures are in "
            "its `--json` "
            "(`samples_per_s` and `session_samples_per_s`).\n\n"
            "**Looked at, nothing to gain here.** Per step, xtrain's loop adds only what the "
            "[micro model](#per-step-overhead-micro-model) shows (accelerate's wrappers and "
            "the loop's bookkeeping), nothing that grows with the model. DDP for LoRA already runs with "
            "`find_unused_parameters=False` and "
            "`gradient_as_bucket_view=True`; fused AdamW is on for CUDA; data loading uses no "
            "worker processes on CPU (the plan's choice: workers would take cores from compute). "
            "Bucket sizes, `static_graph` for LoRA and the CPU-staged hook's copies (Windows, CUDA) "
            "need GPUs to measure and are left for a GPU run.\n"
        )
    if RECORDED_THREADS.is_file():  # measured by hand on a busy machine: kept verbatim
        w(RECORDED_THREADS.read_text(encoding="utf-8").rstrip() + "\n")
    w(gpu_section())
    w(reading_section())
    return "\n".join(out)


RECORDED_GPU = REPO / "benchmarks" / "recorded" / "gpu-rows.md"
# a one-process CPU run's compute threads on a busy CPU (docs/performance.md#cpu-threads): it needs
# a machine other work keeps busy, so this page's command keeps it as it was measured
RECORDED_THREADS = REPO / "benchmarks" / "recorded" / "cpu-threads.md"
NO_GPU_SECTION = """## GPU rows

**No GPU was available when this page was produced, so it has no GPU figures.** On a CUDA
machine this command measures tokens/s and MFU for LoRA and full fine-tuning of the ~110M-parameter
llama-style `base` model (12 layers x 768, vocabulary 16,000, 1024-token sequences, per-device
batch 8) in bf16 and fp16; xtrain through its real launch path next to the hand-written loop with
and without `torch.compile` (xtrain's loop with `run.compile`, the hand-written one with
`torch.compile`):

```bash
python benchmarks/gpu.py --json > gpu.json      # 12 short training runs on one GPU
xtrain bench --processes 2                      # on a 2-GPU machine: NCCL (or gloo) scaling
```
"""
GPU_NEXT = """
**Still to measure on a GPU** (no GPU was lent to the sessions since; no figure here is invented):

```bash
python -m pytest -q tests/gpu                                           # the CUDA paths
python benchmarks/gpu.py --steps 30 --json > gpu.json                   # LoRA/full x fp16/bf16 x compile
python benchmarks/loops.py --size base --precision fp16 --repeats 5     # fp16 LoRA vs hand-written, repeated
python benchmarks/loops.py --size base --precision bf16 --repeats 5     # the same in bf16, for comparison
python benchmarks/chunked_loss.py --device cuda --json > levers.json     # the memory levers' peaks
python benchmarks/chunked_loss.py --device cuda --size 7b                # Qwen2.5-7B-shaped peak vs estimate
```

fp16 LoRA at 0.63-0.70x of the hand-written loop is the open question: the repeated `loops.py` runs
say whether it is noise (the hand-written row itself moved by 20 % between two runs) or a cost of
xtrain's fp16 step (the GradScaler's unscale over the adapter parameters, the skip detector, fused
AdamW, autocast's cache), and the peak memory of each row against the plan's estimate calibrates
`xtrain/model/memory.py`.
"""


def gpu_section() -> str:
    """The GPU rows measured on a lent machine (``benchmarks/recorded/gpu-rows.md``: figures with
    their machine, commands and date, kept verbatim, because this CPU command cannot re-measure
    them), else what to run; then what is still to measure."""
    if RECORDED_GPU.is_file():
        recorded = RECORDED_GPU.read_text(encoding="utf-8").rstrip() + "\n"
        note = (
            "\n_These GPU figures are not re-measured by this page's command: they are kept verbatim "
            "from `benchmarks/recorded/gpu-rows.md`, with the machine, date and commands they came "
            "from._\n"
        )
        return recorded + note + GPU_NEXT
    return NO_GPU_SECTION + GPU_NEXT


def reading_section() -> str:
    peaks = [[p.name, _tf(p.bf16), _tf(p.fp16), _tf(p.tf32), _tf(p.fp32)] for _, p in PEAKS]
    return (
        """## Reading `xtrain bench` on your machine

```bash
xtrain bench                    # one process, then every planned process (one per GPU)
xtrain bench --processes 2      # force the 1-vs-2 comparison (also on CPU, gloo)
xtrain bench --json             # the same as one JSON object
```

It builds a llama-style model from a config, sized for the device (`tiny`, ~1M parameters, without
CUDA; `small`, ~42M, on a GPU under 12 GiB; `base`, ~110M, above; `--model-size` overrides),
writes packed tiny-story data, and trains it for a few dozen steps with LoRA (`--full` for full
fine-tuning) through the same launch path as `xtrain train`: first with one process, then with
every planned process, keeping the global batch fixed (the one-process run accumulates). It prints:

- **samples/s and tokens/s** per run: the loop's own rates over its logging windows after the
  first (start-up, the first CUDA kernels and DDP's first pass excluded). Tokens are real tokens.
- **speedup** = rate with N processes / rate with one; **scaling efficiency** = speedup / N.
- **all-reduce bus bandwidth** of the planned backend, measured as `xtrain doctor --smoke` does
  (nccl-tests' busbw: comparable with the link's speed).
- **MFU** on CUDA: tokens/s per GPU x FLOPs per token / the GPU's dense peak for the precision.
  FLOPs per token = `4 N + 2 N_trainable`, N = every parameter but the input embedding: 2N forward,
  2N backward through the activations, 2 per trainable parameter for its weight gradient. Full
  fine-tuning gives the usual `6 N`; LoRA about `4 N`. Attention's sequence-length term is left out,
  so MFU is slightly understated for long sequences.

What to expect from two GPUs with DDP (reference figures from the guides this project started
from, as recorded in FIELD_NOTES, not measured here): **1.7-1.8x** on A100s with NCCL, **1.6-1.8x**
on Windows with gloo, **1.9-2.0x** on WSL2 with NCCL (efficiency 80-100%). Markedly less means the
link or the backend is the bottleneck: compare the all-reduce bandwidth with `xtrain doctor --smoke`
and the findings `xtrain doctor` prints (P2P on RTX 40 cards, gloo on Windows). LoRA moves little
gradient data per step, so it scales better than full fine-tuning on the same link. On CPU,
processes share the cores: little speedup is normal there.

### Peak table used for MFU (dense TFLOP/s)

"""
        + table(["GPU", "bf16", "fp16", "tf32", "fp32"], peaks)
        + """

Data-center entries are NVIDIA's datasheet figures without sparsity. GeForce entries follow the
throughput table of Lightning that FIELD_NOTES cites (RTX 4090: 82.6), which gives the card's FP32
rate for every dtype; NVIDIA's Ada and Ampere whitepapers list twice that for BF16/FP16 tensor
operations with FP32 accumulation (165.2 for the RTX 4090, 71 for the RTX 3090), so an MFU measured
against the whitepaper figure would be half of what `xtrain bench` prints. A GPU that is not in the
table shows MFU "unknown".
"""
    )


# Not measurements run_all repeats: a profile (cProfile, 40 steps of each loop, one thread,
# 2026-11-23) and the before/after of the batched collator (2026-11-24/25).
PROFILE_VLM = """
Where a step went (cProfile of 40 steps of each loop, which inflates Python-heavy code, before the
collator change below): the two loops took the same time (4.60 s each, data included; backward
0.63-0.65 s, AdamW 0.10-0.12 s); what xtrain adds per step (accelerate's optimizer and clipping
wrappers, the window's device-side sums, the dropout reseed) came to under 1 ms. Almost half of
each step (2.1 of 4.6 s) was the DataLoader building the batch in the training process (the CPU
plan has no workers): the collator ran Qwen2-VL's processor once per conversation (640 calls,
2.8 ms each: resizing and patchifying the image 1.2 ms, merging the processor's keyword arguments
0.5 ms, tokenising 0.4 ms). On GPU machines the plan now gives vision-language jobs DataLoader
workers (`media_workers`, Windows included), which take this off the training process.

**One processor call per batch** (issue 24, measured 2026-11-24/25 UTC on a shared 2-core AMD EPYC
machine, Linux, torch 2.13.0+cpu, transformers 5.24.0, load average 4-6 from other people's test
runs). The collator now calls the processor once per batch and cuts each row's tokens back out of
the result: the same tensors (`tests/test_vision_chat_batched.py`). With
`python benchmarks/vision_language.py --repeats 3 --steps 40` before (commit `ea3fa00`) and after
(`2c23101`), hand-written / xtrain loop, medians of 3: data wait (time blocked on the train
loader's next batch) 38% / 36% of step time before, 26% / 24% after (58 / 66 ms per optimizer step
before, 34 / 36 ms after); samples per CPU second 178 / 174 before, 197 / 201 after; samples/s
100 / 88 before, 121 / 108 after (load 6.0 vs 4.9: the wall figures move with the machine). The
same command run twice more, before and after alternating (`--repeats 2`): data wait 37% / 37%
before, 25% / 25% after. The collator alone (40 batches of 8 built-in rows, images already decoded,
one thread): 13.8 ms CPU per batch before, 7.8 ms after.
"""


def _mib(gib: float) -> str:
    return f"{gib * 1024:,.0f} MiB" if gib < 1 else f"{gib:.2f} GiB"


def quantization_section(q: dict[str, Any]) -> str:
    """16-bit vs 4-bit LoRA: tokens/s, xtrain's estimate, the weights as loaded (and the peak GPU
    memory when the run had a GPU)."""
    s = q["setup"]
    on = "a CUDA GPU" if s["device"] == "cuda" else "the CPU, one compute thread a process"
    head = (
        "## 4-bit vs 16-bit LoRA (bitsandbytes)\n\n"
        f"The same llama-shaped model ({s['layers']} layers x {s['hidden']}, MLP {s['intermediate']}, "
        f"vocabulary {s['vocab']:,}; random weights and xtrain's tokenizer saved once), loaded "
        "unquantized (float32 on the CPU, bfloat16 on a GPU) and in 4 bits (NF4, double quantization, "
        "compute in float32 on the "
        "CPU and bfloat16 on a GPU, then peft's `prepare_model_for_kbit_training`), LoRA r="
        f"{s['lora_r']} on q/k/v/o, AdamW, {s['per_device']} x {s['seq']} tokens a step, on {on}, with "
        "plain transformers + peft + bitsandbytes and the hand-written loop "
        f"(`benchmarks/quantization.py`). {s['steps']} steps a run, the first {s['warmup']} left out, "
        f"{s['repeats']} interleaved runs each in a fresh process. *Estimate*: xtrain's memory estimate "
        "without gradient checkpointing, from the config before loading (the plan, `xtrain train "
        "--dry-run`) and from the loaded model (what the training loop checks on a GPU); *weights*: the "
        "loaded model's parameters and buffers (`get_memory_footprint`) next to the estimate's weights "
        f"term. Load average after: {_load(q)}.\n"
    )
    rows = []
    unquantized = "16-bit" if s["device"] == "cuda" else "unquantized (float32 on the CPU)"
    labels = {"16-bit": unquantized, "4-bit": "4-bit"}
    for v in ("16-bit", "4-bit"):
        est = q["estimate_gib"][v]
        row = [labels[v], _s(q["tokens_per_s"][v], "{:,.0f}"), _s(q["tokens_per_cpu_s"][v], "{:,.0f}"),
               _mib(est["plan"]), _mib(est["loaded"]),
               f"{q['weights_mib'][v]:,.1f} MiB / {est['weights_mib']:,.1f} MiB"]  # fmt: skip
        if "peak_gib" in q:
            row.append(_mib(q["peak_gib"][v]["median"]))
        rows.append(row)
    headers = ["weights", "tokens/s (wall)", "tokens/s (CPU time)", "estimate (plan)", "estimate (loaded)",
               "weights: loaded / estimated"]  # fmt: skip
    if "peak_gib" in q:
        headers.append("peak GPU memory (`max_memory_allocated`)")
    xtrain = ""
    if "ratio_xtrain" in q:
        xrows = []
        for v in ("xtrain 16-bit", "xtrain 4-bit"):
            row = [labels[v.removeprefix("xtrain ")], _s(q["tokens_per_s"][v], "{:,.0f}")]
            if "peak_gib" in q:
                loop = q.get("loop_estimate_gib", {}).get(v)
                row += ["-" if loop is None else _mib(loop), _mib(q["peak_gib"][v]["median"])]
            xrows.append(row)
        xheaders = ["weights", "tokens/s (wall)"]
        if "peak_gib" in q:
            xheaders += ["the loop's estimate", "peak GPU memory (the loop's `peak_mem_mib`)"]
        xtrain = (
            "\nThe same model trained by xtrain (`xtrain.run` through the launcher `xtrain train` uses; "
            "a one-process CPU plan trains in the calling process, with one compute thread; "
            "`model.quantization: null` / `4bit`, packed tiny stories of the same length, LoRA r=16 on "
            "q/k/v/o; tokens/s from the loop's logging windows after the first):\n\n"
            + table(xheaders, xrows)
            + f"\n\nThrough xtrain, 4-bit / 16-bit tokens/s: **{q['ratio_xtrain']:.2f}x**.\n"
        )
    tail = (
        f"\n4-bit / 16-bit tokens/s: **{q['ratio']:.2f}x** by wall time, **{q['ratio_cpu']:.2f}x** by CPU "
        "time (the process's own, which other jobs disturb less). On the CPU, bitsandbytes dequantizes each "
        "4-bit weight for every matmul, extra work a step; what 4-bit buys is memory (on a GPU: "
        "`python benchmarks/quantization.py --device cuda --size gpu`, which adds the peak memory).\n"
    )
    return head + "\n" + table(headers, rows) + "\n" + tail + xtrain


def memory_estimate_section(m: dict[str, Any]) -> str:
    """The memory estimate's activation term against the bytes autograd saved for the backward
    pass, for every built-in job and way of training it (``benchmarks/memory_estimate.py``)."""
    mib = 2**20
    rows = [
        [r["task"], r["training"], f"{r['per_device']} x {r['positions']}",
         f"{r['measured']['layers'] / mib:.2f}", f"{r['estimate']['layers'] / mib:.2f}", f"{r['ratio']:.3f}",
         f"{r['measured']['loss'] / mib:.2f} / {r['estimate']['loss'] / mib:.2f}"]
        for r in m["rows"]
    ]  # fmt: skip
    worst = ", ".join(f"{task} {100 * v:.1f} %" for task, v in m["worst"].items())
    held = "holds" if m["must_hold"] else "does NOT hold"
    return (
        "## The memory estimate against what autograd keeps\n\n"
        "`benchmarks/memory_estimate.py`: each built-in job, built by its task as xtrain trains it "
        "(LoRA with the defaults, `lora.r=8`, `lora.dropout=0.05`; LoRA on the decoder only; a full "
        "fine-tune; the vision-language quickstart's LoRA + merger without dropout), runs one training "
        "forward pass under `torch.autograd.graph.saved_tensors_hooks`; every tensor autograd saves is "
        "counted once by its storage, parameters and buffers left out. *Measured*: saved inside the "
        "model's modules; *estimate*: xtrain's activation term for the same batch (`memory.saved_bytes` "
        "on the stacks the task's `stacks` hook reads, `xtrain/model/activations.py`); *loss*: the "
        "float32 log-softmax saved at the top level, measured / estimated. The encoder-decoders' batch "
        "is the built-in clips or images with random label tokens of the length shown; the "
        "vision-language batch is the built-in conversations (one 56 x 56 or 112 x 112 image each, "
        "`data.min_pixels` = `data.max_pixels` = its area), at their collated length. Float32 on the "
        f"{m['device'].upper()} (torch {m['torch']}, measured {m.get('measured', '?')}): byte counts, "
        "exact, not timed. A method "
        "description is in [Fitting big models](fitting-big-models.md#how-the-activations-are-counted)."
        "\n\n"
        + table(
            [
                "task",
                "training",
                "batch x tokens",
                "measured (MiB)",
                "estimate (MiB)",
                "estimate / measured",
                "loss (MiB)",
            ],
            rows,
        )  # fmt: skip
        + f"\n\nLargest deviation by task: {worst}. The must-hold (within 25 % for speech-to-text, "
        f"image-to-text and vision-language) **{held}**. The tiny models' shapes differ from 7B ones "
        "(2 layers, widths of 64-128, vocabularies of a few hundred), so the rule is structural: per "
        "layer, per position, per width, head and adapter, as autograd saves it; what it leaves out "
        "(RoPE's cos/sin, the attention mask, norm statistics) or counts twice (o_proj's input, which "
        "shares sdpa's output storage in Llama/Qwen2) is the few percent seen here. On a GPU "
        "`python benchmarks/memory_estimate.py --device cuda` runs each case as a bf16-autocast step "
        "and adds `torch.cuda.max_memory_allocated` against the whole estimate (not run: no GPU was "
        "lent to this session).\n"
    )


LEVER_LABELS = {
    "plain": "plain (the model's own loss)",
    "chunked": "chunked loss",
    "chunked-checkpoint": "chunked loss, checkpoint per chunk",
    "chunked+offload": "chunked loss + activation offloading",
}


def chunked_loss_section(c: dict[str, Any]) -> str:
    """The memory levers without Triton (``benchmarks/chunked_loss.py``): saved-for-backward bytes,
    the step's and the loss's peaks, step time; the plan's estimate for a Qwen2.5-7B-shaped LoRA."""
    mib = 2**20
    v = c["variants"]
    rows = [
        [LEVER_LABELS.get(name, name), f"{r['saved']['device'] / mib:,.1f}",
         f"{r['saved']['host'] / mib:,.1f}", f"{r['peak'] / mib:,.0f}", f"{r['peak_vs_plain']:.2f}x",
         f"{r['step_s']:.2f}", f"{r['time_vs_plain']:.2f}x"]
        for name, r in v.items()
    ]  # fmt: skip
    lp = c["loss_peak"]
    saved = 1 - v["chunked"]["peak_vs_plain"]
    slower = v["chunked"]["time_vs_plain"] - 1
    met = saved >= 0.5 and slower <= 0.05
    shape = c["shape"]
    out = (
        "## Memory levers without Triton: the chunked loss and activation offloading\n\n"
        f"`benchmarks/chunked_loss.py`: a Qwen2-shaped causal LM with Qwen2's {shape['vocab_size']:,}-entry "
        f"vocabulary and a small body ({shape['num_hidden_layers']} layers of width {shape['hidden_size']}, "
        "untied head), LoRA r=16 on q/k/v/o (the head frozen), one sequence of "
        f"{c['seq']} tokens whose first half is a masked prompt ({c['trained']} trained tokens), float32 "
        f"on the {c['device'].upper()}, one compute thread (torch {c['torch']}, measured "
        f"{c.get('measured', '?')}, load average after {_load(c)}). Each variant is put into the "
        "model's forward as a run does (`model.chunked_loss`, `model.activation_offload`). *Saved*: "
        "what autograd keeps for the backward at the end of the forward (`saved_tensors_hooks`, each "
        "storage once, weights left out), on the device and, offloaded, in host memory. *Step peak*: "
        "the allocator's peak of allocated bytes over one training step (forward, backward, AdamW) "
        "above its start: on the CPU PyTorch's profiler records the CPU allocator's total at every "
        "allocation (`profile_memory=True`), an exact count where the process's RSS is not (glibc "
        "keeps freed memory) and tracemalloc sees none of PyTorch's allocations. *Step*: median wall "
        f"time of {c['repeats']} unprofiled steps a variant, interleaved. The chunked loss runs "
        f"{c['rows_per_chunk']} positions a chunk (128 MiB of float32 logits).\n\n"
        + table(
            [
                "variant",
                "saved on the device (MiB)",
                "in host memory (MiB)",
                "step peak (MiB)",
                "peak vs plain",
                "step (s)",
                "step vs plain",
            ],
            rows,
        )  # fmt: skip
        + f"\n\nThe loss alone (head and cross-entropy over the body's output, forward and backward): "
        f"peak **{lp['plain'] / mib:,.0f} MiB** plain, **{lp['chunked'] / mib:,.0f} MiB** chunked "
        f"({lp['chunked'] / lp['plain']:.2f}x), {lp['chunked-checkpoint'] / mib:,.0f} MiB with a "
        f"checkpoint per chunk. Goal (at least 50 % less peak step memory for the chunked loss at no "
        f"more than 5 % more step time on the CPU): **{saved:.0%} less peak, "
        f"{v['chunked']['time_vs_plain']:.2f}x the plain step's time: {'met' if met else 'not met'}**. "
        "The chunked step is faster, not slower: the head runs on "
        "the trained half of the positions only. On the CPU offloading copies within host memory, so "
        "its peak there is no saving (the copies add to it); what it takes off a GPU is the *saved "
        "on the device* column. On a GPU: `python benchmarks/chunked_loss.py --device cuda` (bf16 "
        "autocast, `torch.cuda.max_memory_allocated`), and `--size 7b` a Qwen2.5-7B-shaped model's "
        "peak against the estimate" + (" (not run on a GPU yet).\n" if c["device"] == "cpu" else ".\n")
    )
    est = c.get("estimate")
    if est:
        erows = [[label, f"`{e['line']}`", "-" if e["longest"] is None else f"{e['longest']:,}"]
                 for label, e in est.items()]  # fmt: skip
        out += (
            "\nThe plan's estimate (`xtrain train --dry-run`'s Memory line) for a Qwen2.5-7B-shaped "
            "LoRA (the config.json only) at `data.max_length=2048`, `batch.per_device=1`, on the "
            "windows-2x4090 snapshot (fp16, 24 GiB cards, 64 GiB of RAM for two processes), with the "
            "levers added in the order of their cost; *longest*: the longest `data.max_length` (a "
            "multiple of 256, at most the config's 32,768) the plan takes without a memory warning "
            "(under 90 % of the card):\n\n"
            + table(["levers", "estimate at 2048 tokens", "longest sequence without a warning"], erows)
            + "\n"
        )
    return out


def vision_language_section(vl: dict[str, Any]) -> str:
    """The vision-language section: samples/s and tokens/s, xtrain vs the hand-written loop."""
    s = vl["setup"]
    load = vl["load"]
    head = (
        "## Vision-language (Qwen2-VL-shaped, images read from PNG files)\n\n"
        "`xtrain quickstart --task vision-language`'s job (`builtin:tiny-qwen2-vl` on `builtin:shapes-vqa`: "
        "56x56 PNGs read per row, Qwen2-VL's processor and chat template, LoRA r=16 on the language "
        "model with the merger trained whole, the vision tower frozen), global batch "
        f"{s['per_device']} x {s['accum']}, {s['steps']} steps, one process on the {s['device'].upper()}, "
        "through xtrain's loop and through a hand-written PyTorch loop (`hand_written_loop` in "
        "`benchmarks/common.py`) over the same model, LoRA and collated batches, in the same order "
        "(`benchmarks/vision_language.py`). "
        "xtrain's rates are its own logging windows from `train_result.json` (as `xtrain bench` reads "
        f"them), the hand-written loop's are windows of the same {s['log_every']} steps; the first "
        f"window is left out ({s['measured_steps']} steps measured). **Tokens are non-padding input "
        "tokens (the attention mask's sum), image tokens included**: "
        f"{vl['tokens_per_sample']:.1f} per sample, 4 of them image tokens; both loops counted the same "
        f"tokens in every run: {'yes' if vl['same_tokens'] else 'NO'}. {s['repeats']} interleaved "
        "repeats, each run a fresh process with one compute thread. *Per CPU second* divides the same "
        "samples by the process's CPU time, which other jobs disturb less. *Data wait*: the time the "
        "training process spent blocked on the train loader's next batch over the same steps' wall time "
        "(reading PNGs, the processor and the collator; on CPU the plan has no DataLoader workers, so "
        "the training process does that work itself). Load average (1 min) "
        f"during: {load['median']:.1f} ({load['min']:.1f}-{load['max']:.1f}).\n"
    )
    rows = [
        [
            label,
            _s(vl["samples_per_s"][key], "{:.1f}"),
            _s(vl["tokens_per_s"][key], "{:,.0f}"),
            _s(vl["cpu_samples_per_s"][key], "{:.1f}"),
            _s(vl["data_wait_share"][key], "{:.0%}") if "data_wait_share" in vl else "-",
        ]
        for label, key in (("hand-written", "plain"), ("xtrain", "xtrain"))
    ]
    pc, pw = vl["paired_cpu_ratio"], vl["paired_ratio"]
    verdict = (
        "the loops differ by less than the run-to-run noise"
        if pc["min"] <= 1.0 <= pc["max"]
        else ("xtrain is faster" if pc["min"] > 1.0 else "xtrain is slower by more than the noise")
    )
    tail = (
        f"\nxtrain / hand-written: **{vl['cpu_ratio']:.2f}x** by CPU time (paired "
        f"{_s(pc, '{:.3f}')}), {vl['ratio']:.2f}x by wall time (paired {_s(pw, '{:.3f}')}); {verdict}. "
        "By wall time on this shared machine a run gets well under a core at random, so the wall "
        "ratio moves from run to run; read the CPU-time ratio."
    )
    if s["device"] == "cpu":
        tail += " Not measured on a GPU: `python benchmarks/vision_language.py --device cuda` there."
    tail += "\n"
    heads = ["loop", "samples/s", "tokens/s", "samples per CPU second", "data wait (share of step time)"]
    flags = f" --repeats {s['repeats']} --steps {s['steps']}"
    flags += " --device cuda" if s["device"] == "cuda" else ""
    command = f"\n```bash\npython benchmarks/vision_language.py{flags}\n```\n"
    return head + command + "\n" + table(heads, rows) + "\n" + tail + PROFILE_VLM


def _tf(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None, help="the page (default: docs/performance.md)")
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--quick", action="store_true", help="2 repeats instead of 5")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="every section once with the smallest settings (checks the benchmarks run; figures "
        "mean nothing); the page and the JSON go to a temporary folder, never docs/",
    )
    p.add_argument("--only", default="", help="comma-separated sections (loops,overhead,scaling,...)")
    p.add_argument("--lane", action="store_true", help=argparse.SUPPRESS)  # a smoke run's child
    p.add_argument("--from-json", type=Path, default=None, help="render a saved result instead of measuring")
    p.add_argument(
        "--merge-into",
        type=Path,
        default=None,
        help="with --only: measure those sections, replace them in this saved result (the page says "
        "which sections were measured again, when), save it and render the page from it",
    )
    a = p.parse_args()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if a.smoke:
        docs = (REPO / "docs").resolve()
        for given in (a.out, a.json_out):
            if given is not None and given.resolve().is_relative_to(docs):
                p.error(f"--smoke writes nothing into docs/ (got {given})")
        a.out = a.out or Path(tempfile.gettempdir()) / f"xtrain-performance-smoke-{stamp}.md"
    a.out = a.out or REPO / "docs" / "performance.md"
    command = "python benchmarks/run_all.py" + (" --quick" if a.quick else "") + f" --out {a.out.as_posix()}"
    only = set(filter(None, a.only.split(","))) or None
    if a.merge_into is not None and (not only or a.smoke or a.from_json):
        p.error("--merge-into needs --only (the sections to measure again), without --smoke or --from-json")
    if a.from_json:
        results = json.loads(a.from_json.read_text(encoding="utf-8"))
    else:
        t0 = time.perf_counter()
        to_run = smoke_sections() if a.smoke else sections(2 if a.quick else 5)
        known = set(to_run) | (set(SMOKE_REUSED) if a.smoke else set())
        if only and only - known:
            p.error(
                f"--only: no section {', '.join(sorted(only - known))} (sections: {', '.join(sorted(known))})"
            )
        if a.smoke and only:
            only |= {SMOKE_REUSED[name] for name in only if name in SMOKE_REUSED}
        if a.lane and a.json_out:  # one lane of a smoke run: its sections' results, nothing rendered
            lane = json.loads(json.dumps(run(to_run, only, smoke=True)))
            a.json_out.write_text(json.dumps(lane, indent=1) + "\n", encoding="utf-8")
            return
        if a.smoke and not only:
            results = run({}, None, smoke=True)
            with tempfile.TemporaryDirectory(prefix="xtrain-smoke-") as folder:
                results.update(run_lanes(SMOKE_LANES, Path(folder)))
            results["finished"] = _dt.datetime.now().isoformat(timespec="seconds")
        else:
            results = run(to_run, only, smoke=a.smoke)
        results = json.loads(json.dumps(results))  # the same keys as a saved result (strings)
        if a.merge_into is not None:
            results = merge(json.loads(a.merge_into.read_text(encoding="utf-8")), results, sorted(only or ()))
            a.json_out = a.json_out or a.merge_into
        if a.smoke:
            smoke_summary(results, [*to_run, *SMOKE_REUSED], time.perf_counter() - t0)
        json_out = a.json_out or Path(tempfile.gettempdir()) / (
            f"xtrain-performance{'-smoke' if a.smoke else ''}-{stamp}.json"
        )
        json_out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
        log(f"raw results: {json_out}")
    a.out.write_text(render(results, command), encoding="utf-8")
    log(f"wrote {a.out}")


def merge(saved: dict[str, Any], fresh: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """A saved result with the sections ``names`` replaced by ``fresh`` ones; ``remeasured`` says
    which, when, and on which commit (the page shows it next to the first run's dates)."""
    merged = {**saved, **{name: fresh[name] for name in names}}
    again = dict(saved.get("remeasured", {}))
    for name in names:
        again[name] = {"measured": fresh[name].get("measured"), "commit": fresh["machine"].get("commit")}
    merged["remeasured"] = again
    return merged


def smoke_summary(results: dict[str, Any], names: list[str], seconds: float) -> None:
    """Fill the reused sections in and log one line a section: which task and job it ran."""
    for name, source in SMOKE_REUSED.items():
        if source in results:
            results[name] = {**results[source], "smoke_reused": source, "elapsed_s": 0.0, "cpu_s": 0.0}
    ran = [name for name in names if name in results]
    for name in ran:
        r = results[name]
        job = f" ({r['task']}: {r['job']})" if "task" in r else ""
        how = (
            f"from the {r['smoke_reused']} run"
            if "smoke_reused" in r
            else f"in {r['elapsed_s']:.1f} s ({r['cpu_s']:.1f} s CPU)"
        )
        log(f"smoke: {name} ran{job} {how}")
    cpu = sum(results[name].get("cpu_s", 0.0) for name in ran)
    log(f"smoke: {len(ran)} sections in {seconds:.0f} s ({cpu:.0f} s CPU in the sections, all processes)")


if __name__ == "__main__":
    main()
