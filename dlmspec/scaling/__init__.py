"""Scaling laws fitted to a study's runs (``dlmspec fit``; docs/scaling.md, "Fitting").

* :mod:`~dlmspec.scaling.law`: L(N, D) = E + A/N^alpha + B/D^beta, Hoffmann et al. 2022's approach
  3 (Huber on log loss, L-BFGS-B from a grid of starts), the compute-optimal N*(C) and D*(C),
  bootstrap intervals.
* :mod:`~dlmspec.scaling.isoflop`: isoFLOP parabolas and their power laws (approach 2).
* :mod:`~dlmspec.scaling.repetition`: Muennighoff et al. 2023's effective data and parameters
  for repeated tokens (R*_D, R*_N).
* :mod:`~dlmspec.scaling.runs`: the points, read from run folders (N, D, C, U, epochs, loss).
* :mod:`~dlmspec.scaling.study`: all of them on one study.
* :mod:`~dlmspec.scaling.plot`: the figure (matplotlib, Agg).

numpy and scipy do the arithmetic (imported by these modules, never by ``dlmspec --help``);
nothing here imports torch.
"""
