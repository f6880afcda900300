"""`python -m bertkit.cli ...`: the `bertkit` command."""

from bertkit.cli import run

run()
