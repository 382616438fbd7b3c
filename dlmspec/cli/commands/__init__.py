"""The commands of ``dlmspec``, one module each, registered on :data:`dlmspec.cli.app.app` when
this package is imported: :mod:`~dlmspec.cli.commands.validate` (``validate``, its hidden alias
``check``), :mod:`~dlmspec.cli.commands.show`, :mod:`~dlmspec.cli.commands.new`,
:mod:`~dlmspec.cli.commands.schema`, :mod:`~dlmspec.cli.commands.compile`,
:mod:`~dlmspec.cli.commands.submit`, :mod:`~dlmspec.cli.commands.plan`, :mod:`dlmspec.cli.plot`
(``plot``) and :mod:`~dlmspec.cli.commands.fit` (``fit``); what several share is :mod:`~dlmspec.cli.commands.common`. ``generate``, ``eval``,
``data`` and ``convert`` are sub-apps :data:`~dlmspec.cli.app.app` imports on first use.

:func:`dlmspec.cli.main` runs the plain forms of ``validate`` and ``plan`` without importing this
package (typer and the app take about 80 ms to build) and hands everything else here. The rules,
the loader, the resolver and the pydantic models are imported where a command body needs them:
``dlmspec --help`` and ``dlmspec CMD --help`` import these modules for the declarations only
(tests/integration/cli/test_help_imports.py holds them to it).
"""

from __future__ import annotations

# Registration order is the order `dlmspec --help` lists the commands in.
from dlmspec.cli.app import app
from dlmspec.cli.commands import validate as _validate  # noqa: F401
from dlmspec.cli.commands import show as _show  # noqa: F401
from dlmspec.cli.commands import new as _new  # noqa: F401
from dlmspec.cli.commands import schema as _schema  # noqa: F401
from dlmspec.cli.commands import compile as _compile  # noqa: F401
from dlmspec.cli.commands import submit as _submit  # noqa: F401
from dlmspec.cli.commands import plan as _plan  # noqa: F401
from dlmspec.cli.commands import task as _task  # noqa: F401
from dlmspec.cli import plot as _plot  # noqa: E402,F401  (registers `dlmspec plot` on the app)
from dlmspec.cli.commands import fit as _fit  # noqa: E402,F401

__all__ = ["app"]
