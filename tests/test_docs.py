"""The docs site's pages: every fenced ```python and ```bash block under docs/ runs, unless
the line directly before it marks it `<!-- not run: REASON -->`; mkdocs.yml's nav and the
pages agree. (`mkdocs build --strict` itself runs in .ci/run.)

Each block runs from the repository root (`python -c`, `bash -euo pipefail -c`, no stdin),
with TF_CPP_MIN_LOG_LEVEL=3 and the interpreter's folder first on PATH (for `bertkit`), within
120 s. A failure names the page and the line of the block's fence.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RUN = {"python": [sys.executable, "-c"], "bash": ["bash", "-euo", "pipefail", "-c"]}
TIMEOUT_SECONDS = 120
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\s`]*)")
_MARK = re.compile(r"^\s*<!--\s*not run\s*:?(?P<reason>.*?)-->\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block of a page: where it is, its language, its code, its mark."""

    page: str  # path under the repository root
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    not_run: str | None = None  # the mark's reason ("" for a mark without one)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def fenced_blocks(text: str, page: str) -> list[Block]:
    """The fenced blocks of a Markdown page, each with the mark on the line before it.

    >>> page = "Intro\\n<!-- not run: needs a GPU -->\\n```bash\\nbertkit finetune r.yaml\\n```\\n"
    >>> [(b.line, b.language, b.code, b.not_run) for b in fenced_blocks(page, "p.md")]
    [(3, 'bash', 'bertkit finetune r.yaml\\n', 'needs a GPU')]
    """
    lines, blocks, index = text.splitlines(), [], 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        body = [
            line[len(indent) :] if line.startswith(indent) else line
            for line in lines[index + 1 : end]
        ]
        mark = _MARK.match(lines[index - 1]) if index else None
        blocks.append(
            Block(
                page,
                index + 1,
                opening["info"].lower(),
                "\n".join(body) + "\n",
                mark["reason"].strip() if mark else None,
            )
        )
        index = end + 1
    return blocks


def doc_blocks(docs: Path = DOCS, root: Path = ROOT) -> list[Block]:
    """Every fenced block of every page under `docs`."""
    return [
        block
        for path in sorted(docs.rglob("*.md"))
        for block in fenced_blocks(path.read_text(encoding="utf-8"), str(path.relative_to(root)))
    ]


def run_block(block: Block, cwd: Path = ROOT) -> str | None:
    """Runs a block; None when it succeeds, else the failure, naming page and line."""
    environment = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    process = subprocess.Popen(
        [*RUN[block.language], block.code],
        cwd=cwd,
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a timeout ends the commands the block started, too
    )
    try:
        output, _ = process.communicate(timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return f"{block.where}: the {block.language} block ran over {TIMEOUT_SECONDS} s"
    if process.returncode == 0:
        return None
    tail = output.strip().splitlines()[-15:]
    return (
        f"{block.where}: the {block.language} block failed with exit status "
        f"{process.returncode}:\n  " + "\n  ".join(tail)
    )


BLOCKS = doc_blocks()
RUNNABLE = [b for b in BLOCKS if b.language in RUN and b.not_run is None]


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.where for b in RUNNABLE])
def test_example_runs(block):
    failure = run_block(block)
    assert failure is None, failure


def test_every_not_run_mark_gives_a_reason():
    bare = [b.where for b in BLOCKS if b.not_run == ""]
    assert not bare, "marks without a reason (<!-- not run: REASON -->): " + ", ".join(bare)


def nav_pages(nav) -> list[str]:
    """The page files of mkdocs.yml's nav, in order.

    >>> nav_pages([{"Home": "index.md"}, {"Tasks": [{"Tagging": "tasks/tagging.md"}]}])
    ['index.md', 'tasks/tagging.md']
    """
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return [page for item in nav or () for page in nav_pages(item)]


class _ConfigLoader(yaml.SafeLoader):
    """mkdocs.yml may name Python objects (`!!python/name:...`, as Material's emoji options
    do); the nav needs none of them."""


_ConfigLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)
_ConfigLoader.add_multi_constructor("!", lambda *_: None)  # !ENV and other mkdocs tags
NAV = nav_pages(yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), _ConfigLoader)["nav"])


def test_every_page_of_the_nav_exists():
    missing = [page for page in NAV if not (DOCS / page).is_file()]
    assert not missing, f"pages in mkdocs.yml's nav that docs/ lacks: {missing}"


def test_every_page_is_in_the_nav():
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert not pages - set(NAV), f"pages missing from mkdocs.yml's nav: {sorted(pages - set(NAV))}"


def test_the_reference_pages_are_generated():
    for page, placeholder in (
        ("recipe.md", "<!-- generated: recipe reference -->"),
        ("cli.md", "<!-- generated: cli reference -->"),
        ("api.md", "::: bertkit"),
    ):
        text = (DOCS / "reference" / page).read_text(encoding="utf-8")
        assert placeholder in text and len(text.splitlines()) < 20, page


# ---------------------------------------------------------------- the checks can fail
def test_a_failing_block_is_named_by_page_and_line(tmp_path):
    page = "# Page\n\n```bash\necho made it\n```\n\n```python\nimport sys\nsys.exit('no: ' + str(1 + 1))\n```\n"
    ok, failing = fenced_blocks(page, "docs/page.md")
    assert run_block(ok, tmp_path) is None
    failure = run_block(failing, tmp_path)
    assert failure.startswith("docs/page.md:7: the python block failed with exit status 1:")
    assert "no: 2" in failure


def test_bash_blocks_stop_at_the_first_failing_command(tmp_path):
    (block,) = fenced_blocks("```bash\nfalse | cat\necho not reached\n```\n", "docs/p.md")
    failure = run_block(block, tmp_path)
    assert failure is not None and "not reached" not in failure


def test_marks_indented_fences_and_other_languages_are_read():
    page = (
        "1. Step\n"
        "    <!-- not run:   -->\n"
        "    ```python\n"
        "    print(1)\n"
        "    ```\n"
        "<!-- not run: writes runs/ -->\n"
        "~~~bash\n"
        "bertkit finetune r.yaml\n"
        "~~~\n"
        "```text\n"
        "output\n"
        "```\n"
        "<!--not run: no model-->\n"
        "\n"
        "```python\n"
        "x = 1\n"
        "```\n"
    )
    found = [(b.line, b.language, b.code, b.not_run) for b in fenced_blocks(page, "p.md")]
    assert found == [
        (3, "python", "print(1)\n", ""),
        (7, "bash", "bertkit finetune r.yaml\n", "writes runs/"),
        (10, "text", "output\n", None),
        (15, "python", "x = 1\n", None),  # a mark must be on the line directly before
    ]
