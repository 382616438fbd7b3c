"""dlmspec: a declarative config-compiler for training diffusion (and autoregressive) language
models on megatron-core.

Data flows one way: a spec file is loaded (:mod:`dlmspec.spec.load`) into a
:class:`~dlmspec.spec.models.Spec`, resolved (:mod:`dlmspec.resolve`), checked
(:mod:`dlmspec.check`), planned (:mod:`dlmspec.plan`) and rendered (:mod:`dlmspec.render.compile`).
Nothing in this package imports torch or megatron at import time.
"""

__version__ = "0.2.0"
