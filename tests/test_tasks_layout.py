"""The built-in plugins' folder `tasks/`, installed as the package `bertkit_tasks`.

pyproject.toml lists every package by hand (setuptools' `find` cannot rename a folder), so a
new package folder that is not listed would be left out of the wheel: these tests read
pyproject.toml and the folders, and fail then.
"""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def package_name(folder: Path) -> str:
    """The import name of a package folder, through pyproject.toml's `package-dir`."""
    parts = folder.relative_to(ROOT).parts
    for name, where in SETUPTOOLS.get("package-dir", {}).items():
        if parts[: len(Path(where).parts)] == Path(where).parts:
            parts = (*name.split("."), *parts[len(Path(where).parts) :])
    return ".".join(parts)


def packages_on_disk() -> set[str]:
    return {
        package_name(init.parent)
        for top in ("bertkit", "tasks")
        for init in (ROOT / top).rglob("__init__.py")
    }


def test_tasks_folder_is_the_bertkit_tasks_package():
    assert SETUPTOOLS["package-dir"] == {"bertkit_tasks": "tasks"}
    assert not (ROOT / "bertkit_tasks").exists(), "the plugins' folder is tasks/"
    assert package_name(ROOT / "tasks" / "span_qa") == "bertkit_tasks.span_qa"


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(SETUPTOOLS["packages"])
    assert not packages_on_disk() - listed, (
        "packages missing from pyproject.toml's [tool.setuptools] packages: "
        f"{sorted(packages_on_disk() - listed)}"
    )
    assert not listed - packages_on_disk(), (
        f"listed, not on disk: {sorted(listed - packages_on_disk())}"
    )


def test_each_built_in_entry_point_names_a_task_folder():
    points = PYPROJECT["project"]["entry-points"]["bertkit.tasks"]
    assert sorted(points) == [
        "classification",
        "embedding",
        "mlm",
        "multi_label",
        "multiple_choice",
        "regression",
        "span_qa",
        "tagging",
    ]
    for name, value in points.items():
        module = value.partition(":")[0]
        assert module == f"bertkit_tasks.{name}"
        assert (ROOT / "tasks" / name / "task.py").is_file(), f"{name}: no tasks/{name}/task.py"


def test_pytest_collects_the_tasks_folder():
    assert "tasks" in PYPROJECT["tool"]["pytest"]["ini_options"]["testpaths"]
