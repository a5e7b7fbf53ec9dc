"""The studio's routes: the page (static), and a JSON API whose every handler calls what the CLI
calls (``machine``, ``form``/``check``, ``launching``, ``runs``, ``live``, ``compare``,
``trying``, ``exporting``, the report). A run is named by its folder relative to the runs folder
(``?path=``), checked to stay inside it (``security.inside``). A user's mistake is one line
(``{"error": ...}``, 400), anything else one line too (500; the details go to the server's log).
The app holds the runs folder and nothing else: no run state."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from anyio import to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from xtrain.errors import XtrainError
from xtrain.studio import check, compare, exporting, form, launching, live, machine, runs, trying
from xtrain.studio.security import Guard, inside

STATIC = Path(__file__).resolve().parent / "static"
MAX_BODY = 100 << 20  # a request's JSON (an image or audio file for Try, base64)
log = logging.getLogger("xtrain.studio")
Handler = Callable[[Request], Awaitable[Any]]


def _api(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A handler's answer as JSON; a user's mistake as one line (400), anything else too (500)."""

    async def endpoint(request: Request) -> Response:
        try:
            found = await handler(request)
        except XtrainError as e:
            return JSONResponse({"error": e.one_line()}, status_code=400)
        except Exception as e:  # noqa: BLE001 - the page gets one line, the log the traceback
            log.exception("studio request %s failed", request.url.path)
            return JSONResponse({"error": f"the studio failed: {type(e).__name__}: {e}"}, status_code=500)
        return found if isinstance(found, Response) else JSONResponse(found)

    return endpoint


async def _body(request: Request) -> dict[str, Any]:
    size = int(request.headers.get("content-length") or 0)
    if size > MAX_BODY:
        raise XtrainError(f"the request is over {MAX_BODY >> 20} MiB", "send a smaller file")
    try:
        data = await request.json()
    except ValueError:
        raise XtrainError("the request is not JSON", "reload the page") from None
    if not isinstance(data, dict):
        raise XtrainError("the request is not a JSON object", "reload the page")
    return data


class Studio:
    """The handlers, over one runs folder (``root``) and the folder the studio was started in."""

    def __init__(self, root: Path, cwd: Path) -> None:
        self.root, self.cwd = root, cwd

    def run(self, request: Request) -> Path:
        found = inside(self.root, request.query_params.get("path") or "")
        if found == self.root.resolve() or not (found.is_dir() or runs.launch_of(found)):  # (a stage to come)
            raise XtrainError(
                f"no run {request.query_params.get('path')!r} in {self.root}", "reload the runs"
            )
        return found

    async def catalog(self, request: Request) -> Any:
        return await to_thread.run_sync(form.catalog, self.root)

    async def machine(self, request: Request) -> Any:
        return await to_thread.run_sync(machine.diagnosis)

    async def smoke(self, request: Request) -> Any:
        return await to_thread.run_sync(machine.smoke)

    async def check(self, request: Request) -> Any:
        draft = form.compose(await _body(request), self.root, self.cwd)
        return await to_thread.run_sync(check.check, draft)

    async def launch(self, request: Request) -> Any:
        draft = form.compose(await _body(request), self.root, self.cwd)
        check.refuse_existing(draft)
        await to_thread.run_sync(check.configs_valid, draft)  # a mistake in the form: one line, nothing saved
        draft.folder.mkdir(parents=True, exist_ok=True)
        for stage in draft.stages:  # the YAML it runs, saved in the run's folder first
            stage.config.write_text(stage.text, encoding="utf-8")
        launching.start(draft.folder, [s.config for s in draft.stages], draft.stage_names, draft.flags)
        first = draft.stages[0].output_dir
        return {"path": runs.relative(self.root, first), "folder": str(draft.folder)}

    async def list_runs(self, request: Request) -> Any:
        found = await to_thread.run_sync(runs.list_runs, self.root)
        return {"runs": [e.to_dict() for e in found], "root": str(self.root)}

    async def details(self, request: Request) -> Any:
        folder = self.run(request)
        entry = runs.entry(self.root, folder)
        config = next(
            (p for p in (folder / runs.CONFIG, folder.parent / f"{folder.name}.yaml") if p.is_file()), None
        )
        return {
            **entry.to_dict(),
            "folder": str(folder),
            "config": config.read_text(encoding="utf-8", errors="replace") if config else None,
            "exports": exporting.exports(folder),
            "report": (folder / "report.html").is_file(),
        }

    async def events(self, request: Request) -> Response:
        stream = live.run_stream(self.run(request), lambda: False)
        return StreamingResponse(stream, media_type="text/event-stream", headers={"x-accel-buffering": "no"})

    async def stop(self, request: Request) -> Any:
        return {"said": launching.stop(self.run(request))}

    async def resume(self, request: Request) -> Any:
        launching.resume(self.run(request))
        return {"said": "resumed: it goes on from its newest checkpoint"}

    async def try_run(self, request: Request) -> Any:
        folder, body = self.run(request), await _body(request)
        return await to_thread.run_sync(trying.try_run, folder, body)

    async def export(self, request: Request) -> Any:
        folder, body = self.run(request), await _body(request)
        types = body.get("types") or []
        if not isinstance(types, list):
            raise XtrainError("the GGUF types are not a list", "tick the types to write")
        return {"name": exporting.start(folder, [str(t) for t in types], bool(body.get("ollama")))}

    async def report(self, request: Request) -> Any:
        from xtrain.report import page
        from xtrain.report.runs import read_runs

        folder = self.run(request)
        found, chained = await to_thread.run_sync(read_runs, [folder])
        path = page.write(page.output_path(found, None), page.render(found, chained), False)
        return {"file": path.name}

    async def file(self, request: Request) -> Response:
        folder = self.run(request)
        path = inside(folder, request.query_params.get("name") or "")
        if not path.is_file():
            raise XtrainError(f"{path.name} is not in {folder.name}", "reload the run")
        return FileResponse(path)

    async def compare(self, request: Request) -> Any:
        folders = compare.folders(self.root, request.query_params.getlist("paths"))
        return {"html": await to_thread.run_sync(compare.compare_html, folders)}

    async def compare_events(self, request: Request) -> Response:
        folders = compare.folders(self.root, request.query_params.getlist("paths"))
        stream = live.many_stream(folders, lambda: compare.compare_html(folders), lambda: False)
        return StreamingResponse(stream, media_type="text/event-stream", headers={"x-accel-buffering": "no"})

    async def chain(self, request: Request) -> Any:
        return {"paths": compare.chain_of(self.root, request.query_params.get("path") or "")}


async def index(request: Request) -> Response:
    return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")


async def favicon(request: Request) -> Response:
    return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")


def build(root: Path, cwd: Path, token: str | None, port: int, local: bool) -> Guard:
    """The app behind its guard."""
    s = Studio(root, cwd)
    get = [("/api/catalog", s.catalog), ("/api/machine", s.machine), ("/api/runs", s.list_runs),
           ("/api/run", s.details), ("/api/run/file", s.file), ("/api/run/events", s.events),
           ("/api/compare", s.compare), ("/api/compare/events", s.compare_events),
           ("/api/chain", s.chain)]  # fmt: skip
    post = [("/api/machine/smoke", s.smoke), ("/api/check", s.check), ("/api/launch", s.launch),
            ("/api/run/stop", s.stop), ("/api/run/resume", s.resume), ("/api/run/try", s.try_run),
            ("/api/run/export", s.export), ("/api/run/report", s.report)]  # fmt: skip
    routes = [
        Route("/", index),
        Route("/favicon.ico", favicon),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
        *(Route(path, _api(h), methods=["GET"]) for path, h in get),
        *(Route(path, _api(h), methods=["POST"]) for path, h in post),
    ]
    return Guard(Starlette(routes=routes), token, port, local)
