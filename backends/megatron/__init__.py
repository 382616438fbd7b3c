"""dlmspec's training runtime on megatron-core (imported by the compiled ``train.py``).

Modules (each imports torch and megatron-core):

* :mod:`.objective` - masked-diffusion (LLaDA/MDLM) and autoregressive losses
  around megatron's per-token cross entropy.
* :mod:`.rng` - per-microbatch masking RNG keyed by (seed, iteration, DP rank,
  microbatch), so resumed runs redraw the same masks.
* :mod:`.attention` - ``SDPACoreAttention``, megatron ``core_attention`` on
  ``torch.nn.functional.scaled_dot_product_attention``.
* :mod:`.layers` - ``build_layer_spec`` (TE spec or local spec + SDPA),
  ``build_model`` (GPTModel chunks wrapped in megatron DDP).
* :mod:`.data` - megatron GPT datasets, Megatron-LM's pre-training sampler,
  document masks.
* :mod:`.training` - ``RunConfig`` and ``train(...)``.
"""
