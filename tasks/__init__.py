"""bertkit's built-in task plugins (installed as `bertkit_tasks`).

Each module holds one task class, registered in the `bertkit.tasks` entry-point
group by pyproject.toml, exactly as a third-party plugin would be.
"""
