"""Rendering a resolved, checked spec into the directory that runs it (the last step of
spec -> resolve -> check -> plan -> render): :mod:`dlmspec.render.compile` (train.py, launch.sh,
spec.lock.toml, plan.json), :mod:`dlmspec.render.sbatch` (launch.sbatch, and ``dlmspec submit``)
and :mod:`dlmspec.escape` (spec strings into Python, shell, TOML and sbatch text)."""
