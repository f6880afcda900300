"""`bertkit tasks`: the installed task plugins, one line each, with the flags each task adds
to `bertkit predict`."""

from __future__ import annotations

from bertkit.cli.arguments import add_command


def add_to(commands) -> None:
    add_command(commands, "tasks", run, "list the installed task plugins")


def run(args) -> None:
    from bertkit.registry import describe_tasks

    for info in describe_tasks():
        if info.error:
            print(
                f"{info.name:16} FAILED TO LOAD ({info.entry_point}, from {info.distribution}): "
                f"{info.error}"
            )
            continue
        flags = ", ".join(f"{option.flag} {option.metavar}" for option in info.predict_options)
        predict = f"  predict: {flags}" if flags else ""
        print(f"{info.name:16} {info.description}  [{info.distribution}]{predict}")
