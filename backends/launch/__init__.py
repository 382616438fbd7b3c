"""Launch checks: what ``launch.sbatch`` runs instead of ``train.py`` in CPU check mode
(``DLMSPEC_CHECK_MODE``), see :mod:`dlmspec.backends.launch.check`."""
