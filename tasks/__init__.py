"""bertkit's built-in task plugins.

Each task is a package: `task.py` holds the task class (re-exported by the
package, which is what the `bertkit.tasks` entry point names, exactly as a
third-party plugin would be declared), next to the libraries only that task
uses. What several tasks share lives in the `bertkit` core.
"""
