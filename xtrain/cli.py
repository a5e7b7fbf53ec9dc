"""The `xtrain` command line. Imports stay light: torch & co. load only inside commands."""

from __future__ import annotations

import sys

import typer

from xtrain.errors import XtrainError

app = typer.Typer(
    name="xtrain",
    help="Multi-GPU LoRA training that just works: doctor -> configure -> train.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _register() -> None:
    # Each command lives in its own module under xtrain/commands; none imports torch at import time.
    from xtrain.commands import bench, chat, configure, doctor, export, predict, quickstart, report, train
    from xtrain.commands import eval as evaluate
    from xtrain.studio import command as studio_command

    app.command("doctor")(doctor.doctor)
    app.command("configure")(configure.configure)
    app.command("train")(train.train)
    app.command("quickstart")(quickstart.quickstart)
    app.command("bench")(bench.bench)
    app.command("predict")(predict.predict)
    app.command("chat")(chat.chat)
    app.command("export")(export.export)
    app.command("report")(report.report)
    app.command("eval")(evaluate.eval_command)
    app.command("studio")(studio_command.studio)


_register()


def main(argv: list[str] | None = None) -> int:
    """Console-script entry: user mistakes become one line on stderr and a non-zero exit."""
    from xtrain.runtime.quiet import quiet_progress_bars

    quiet_progress_bars()  # third-party tqdm bars, here and in the workers: xtrain's progress is rich's
    try:
        app(args=argv, standalone_mode=True)
    except XtrainError as e:
        from rich.markup import escape

        from xtrain.console import make_console

        make_console(stderr=True).print(f"[bold red]error:[/] {escape(e.one_line())}", soft_wrap=True)
        return e.exit_code
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())


def run() -> None:
    """setuptools console-script target (its return value becomes the exit code)."""
    sys.exit(main())
