"""The studio's work that loads a model, each in a process of its own (the server itself never
loads torch's models: a crash, an out-of-memory or a GPU held stays out of it), writing its
answer as one JSON object into a file the studio reads:

    python -m xtrain.studio.jobs try RUN START RESULT.json [--prompt T] [--system T] [--image F]
        [--audio F] [--tools F.json] [--max-new-tokens N]
    python -m xtrain.studio.jobs export RUN OUTPUT RESULT.json --type q8_0 [--type ...] [--ollama]

``try``: the run's start (the model it trained from) and its result answer the same input, each
through ``xtrain.predict.predict``, the function ``xtrain predict`` calls. ``export``: the export
pipeline ``xtrain export`` runs (``xtrain.export.pipeline.export``), its checks, costs, files and
the eval prompts answered by the merged model and by llama.cpp. A mistake is one line in the
answer (``{"ok": false, "error": ...}``), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from xtrain import atomic
from xtrain.errors import XtrainError


def _write(path: Path, answer: dict[str, Any]) -> None:
    atomic.write_text(path, json.dumps(answer, ensure_ascii=False, default=str))


def start_folder(start: str) -> str:
    """Where the run's start is on this machine: a built-in (built), a folder, or a hub model
    from the local cache (never downloaded here)."""
    from xtrain.model.load import resolve_model

    found = resolve_model(start)
    if Path(found).is_dir():
        return found
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(found, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached (or not a hub id): one line
        raise XtrainError(
            f"the start {start} is not on this machine", "the base answers once its files are here"
        ) from None


def answer_both(run: Path, start: str, args: argparse.Namespace) -> dict[str, Any]:
    from xtrain.predict import predict
    from xtrain.runtime.quiet import quiet_libraries
    from xtrain.tasks.contract import PredictRequest

    quiet_libraries()
    inputs = [str(Path(f)) for f in (args.image, args.audio) if f]
    request = PredictRequest(inputs, [args.prompt] if args.prompt else [], args.system or None,
                             max_new_tokens=args.max_new_tokens, batch_size=1)  # fmt: skip
    if args.tools:
        from xtrain.data.rows import tools as agent_rows

        request.tools = agent_rows.read_tools_file(args.tools, "tools")
    began = time.monotonic()
    trained = predict(run, request)
    base = predict(start_folder(start), request)
    return {"ok": True, "start": start, "base": base, "trained": trained, "seconds": time.monotonic() - began}


class _Progress:
    """The export's stages as lines in the job's log."""

    def stage(self, text: str) -> None:
        print(f"export: {text}", flush=True)

    def advance(self, done: int, total: int) -> None:
        pass


def export(run: Path, output: Path, args: argparse.Namespace) -> dict[str, Any]:
    from xtrain.export.answers import table
    from xtrain.export.pipeline import ExportRequest
    from xtrain.export.pipeline import export as run_export
    from xtrain.runtime.quiet import quiet_libraries

    quiet_libraries()
    to = ["ollama"] if args.ollama else ["gguf"]
    request = ExportRequest(str(run), to, output, None, args.type or ["q8_0"])
    result = run_export(request, _Progress())
    prompts = result.prompts
    runtime = result.costs[0].runtime.split(" ")[0] if result.costs else "gguf"
    answers = None
    if prompts is not None and prompts.files:
        head = ["prompt", "xtrain (merged)", *(f"{runtime} {k}" for k in prompts.files), "reference"]
        answers = {"head": head, "rows": table(prompts, 8)}
    return {
        "ok": True,
        "output": str(result.output),
        "checks": [{"name": c.name, "detail": c.detail} for c in result.checks],
        "costs": [c.line() for c in result.costs],
        "warnings": result.warnings,
        "notes": result.notes,
        "files": {name: size for name, size in result.files.items()},
        "ollama": result.ollama,
        "answers": answers,
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m xtrain.studio.jobs")
    sub = p.add_subparsers(dest="job", required=True)
    t = sub.add_parser("try")
    t.add_argument("run")
    t.add_argument("start")
    t.add_argument("result")
    t.add_argument("--prompt")
    t.add_argument("--system")
    t.add_argument("--image")
    t.add_argument("--audio")
    t.add_argument("--tools")
    t.add_argument("--max-new-tokens", type=int, default=64)
    e = sub.add_parser("export")
    e.add_argument("run")
    e.add_argument("output")
    e.add_argument("result")
    e.add_argument("--type", action="append")
    e.add_argument("--ollama", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    result = Path(args.result)
    try:
        if args.job == "try":
            answer = answer_both(Path(args.run), args.start, args)
        else:
            answer = export(Path(args.run), Path(args.output), args)
    except XtrainError as e:
        print(f"error: {e.one_line()}", file=sys.stderr, flush=True)
        _write(result, {"ok": False, "error": e.one_line()})
        return e.exit_code or 2
    except Exception as e:  # noqa: BLE001 - a bug or a library's failure: its last line, the log has the rest
        import traceback

        traceback.print_exc()
        last = (str(e).strip().splitlines() or [""])[-1]
        _write(result, {"ok": False, "error": f"{type(e).__name__}: {last}"})
        return 1
    _write(result, answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
