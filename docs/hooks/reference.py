"""MkDocs hook: the generated reference pages are filled in from the code at build time.

A page holds a placeholder comment (`<!-- generated: recipe reference -->`) where the
reference goes; `bertkit.cli.reference` writes it from the JSON Schema of recipes and from
the argument parsers, so the page cannot drift from the code. Neither imports TensorFlow.
"""

from __future__ import annotations

from bertkit.cli import reference

PLACEHOLDERS = {
    "<!-- generated: recipe reference -->": reference.recipe_reference,
    "<!-- generated: cli reference -->": reference.cli_reference,
}


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    for placeholder, generate in PLACEHOLDERS.items():
        if placeholder in markdown:
            markdown = markdown.replace(placeholder, generate())
    return markdown
