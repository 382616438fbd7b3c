"""Verifiable tasks: prompts with answers that a checker scores (:mod:`dlmspec.tasks.check`),
and their generators (:mod:`dlmspec.tasks.make`). Plain Python: no torch import."""
