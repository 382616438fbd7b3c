"""Generation and likelihood for trained models, against any logits function.

:mod:`.sampler`: masked-diffusion sampling (LLaDA's low-confidence and random remasking,
Fast-dLLM's threshold, semi-autoregressive blocks, guidance, EOS) and left-to-right AR decoding;
:mod:`.config`: their settings, :class:`GenerateConfig`; :mod:`.likelihood`: Monte-Carlo ELBO
bounds on the NLL of masked-diffusion LMs, AR log-likelihood, multiple-choice scoring;
:mod:`.models`: a megatron-core ``GPTModel`` as a logits function. Plain torch,
no megatron-core: the model arrives as ``logits_fn(tokens[, attention_mask]) -> logits``.
docs/generate.md is the long form.
"""
