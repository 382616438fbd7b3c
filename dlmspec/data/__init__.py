"""Training data tools: ``dlmspec data prepare`` (:mod:`dlmspec.data.prepare`)."""
