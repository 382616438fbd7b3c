"""The jinja2 templates ``dlmspec compile`` renders (package data: this folder installs as
``dlmspec.templates``, in a wheel and in an editable install alike)."""

from pathlib import Path

#: The folder that holds the ``*.j2`` files.
TEMPLATE_DIR = Path(__file__).resolve().parent
