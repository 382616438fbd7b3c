"""The jinja2 templates ``dlmspec compile`` renders (package data: this folder installs as
``dlmspec.templates``, in a wheel and in an editable install alike)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: The folder that holds the ``*.j2`` files.
TEMPLATE_DIR = Path(__file__).resolve().parent


def environment(**options: Any) -> Any:
    """A jinja2 environment over :data:`TEMPLATE_DIR` with the settings every template is written
    for (undefined names raise, the trailing newline kept, block lines trimmed, no HTML escaping:
    values are escaped for their language by ``dlmspec.escape``), plus ``options`` (jinja2's own
    keywords, e.g. other comment delimiters). A new one each call: a renderer keeps its own, so
    its compiled templates are reused for the rest of the process."""
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False,
                              **options)
