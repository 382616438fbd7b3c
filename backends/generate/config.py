"""The sampler's settings, :class:`GenerateConfig`: defined in :mod:`dlmspec.generate_settings`
(plain Python, so that ``validate`` checks a spec's ``[generate]`` table with the sampler's own
rules without importing the runtime) and re-exported here for the sampler and its users."""

from dlmspec.generate_settings import KINDS, REMASKING, GenerateConfig, GenerateConfigError  # noqa: F401

__all__ = ["KINDS", "REMASKING", "GenerateConfig", "GenerateConfigError"]
