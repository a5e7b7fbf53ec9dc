"""``xtrain studio``: the whole loop in a browser, a thin room above ``commands/``.

A Starlette app (``app.py``) served by uvicorn (``server.py``), one module per concern: the
machine (``machine.py``: doctor's probe, plan and findings), a new run (``form.py``: the tasks,
their jobs and keys, a form made a config; ``check.py``: the dry run's plan, notes and data
check), the runs (``runs.py``: every run under the runs folder and its status, read from its
files; ``launching.py``: a run started as a detached ``xtrain train``, stopped through its stop
request, resumed; ``live.py``: its curves, status and log streamed as server-sent events),
compare (``compare.py``: the report's sections of several runs), try (``trying.py``) and export
(``exporting.py``), both run by ``jobs.py`` in a process of their own, and the guard in front of
it all (``security.py``: the token, the hosts, the origin, the paths). The page is static
(``static/``): hand-written HTML, CSS and JavaScript, nothing fetched from a network.

The server keeps no run state: a run's folder (its lock, checkpoints, history, end record and
log) is the truth, so a run outlives the page and the studio, and a studio started again finds it.
"""
