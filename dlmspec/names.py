"""Names both sides use: the compiler (``dlmspec``) and the runtime (``dlmspec.backends``).

One spelling each of the file names the compiler writes and the runtime reads, the kinds a spec
names (objective, attention), the tokenizer types and the keys each reads, and the defaults
both sides fill. Pure constants: no pydantic, no torch, so either side imports it.
"""

from __future__ import annotations

# --------------------------------------------------------------------------------------------
# Files

#: A training checkpoint's record of its run (the spec record, the objective, the tokenizer),
#: written by the runtime beside each ``iter_NNNNNNN`` folder (``backends/megatron/checkpointing.py``)
#: and read by resume, ``generate``, ``eval`` and ``convert``.
CHECKPOINT_RECORD = "dlmspec.json"
#: A save folder's tracker: the text file naming the latest iteration (Megatron-LM's
#: ``latest_checkpointed_iteration.txt`` role; ``"release"`` for a converted checkpoint).
CHECKPOINT_TRACKER = "latest"
#: A dataset record's name after the dataset prefix (``PREFIX.dlmspec.json``, :mod:`dlmspec.data.record`).
DATASET_RECORD_SUFFIX = "." + CHECKPOINT_RECORD

# --------------------------------------------------------------------------------------------
# Kinds a spec names

#: ``[objective] kind = "mdm"``: masked diffusion (bidirectional attention, a [MASK] token).
MDM = "mdm"
#: ``[objective] kind = "ar"``: autoregressive next-token prediction (causal attention).
AR = "ar"
#: The ``[objective] kind`` values a spec may name are :func:`dlmspec.objectives.kinds` (the
#: registry: the built-ins ``MDM`` and ``AR`` and what a plugin registers, each with its attention).

#: ``[objective] attention_mask`` values: every query sees every key; key ``j`` only for ``j <= i``;
#: blocks of ``objective.block_size`` see themselves and every earlier block.
BIDIRECTIONAL = "bidirectional"
CAUSAL = "causal"
BLOCK_CAUSAL = "block_causal"
ATTENTION_KINDS: tuple[str, ...] = (BIDIRECTIONAL, CAUSAL, BLOCK_CAUSAL)

# --------------------------------------------------------------------------------------------
# Defaults

#: ``objective.cart_p`` unset: the geometric parameter of DreamLM's trainers' configs
#: (DreamLM/Dream-Coder@87409da ``instruct/src/trainer/config/sft_trainer.yaml:57``, DreamLM/DreamOn@8a0a549
#: ``src/trainer/config/sft_trainer.yaml:63``: ``cart_p: 0.1``).
CART_P_DEFAULT = 0.1

# --------------------------------------------------------------------------------------------
# Tokenizers

#: Megatron-LM ``--tokenizer-type`` names (``[data.tokenizer] type``), in the order the spec's
#: schema lists them after the first.
TOKENIZER_TYPES: tuple[str, ...] = (
    "GPT2BPETokenizer",
    "HuggingFaceTokenizer",
    "SentencePieceTokenizer",
    "TikTokenizer",
    "NullTokenizer",
    "BertWordPieceLowerCase",
    "BertWordPieceCase",
    "GPTSentencePieceTokenizer",
    "Llama2Tokenizer",
    "MultimodalTokenizer",
    "NullMultimodalTokenizer",
)

#: The ``data.tokenizer`` keys each tokenizer type reads (Megatron-LM build_tokenizer, as
#: :func:`dlmspec.tokenizers.build_tokenizer` documents its arguments): its files, NullTokenizer's
#: and TikTokenizer's size, Hugging Face's optional vocab/merges overrides. ``eod_id`` is read by all.
TOKENIZER_READS: dict[str, tuple[str, ...]] = {
    "HuggingFaceTokenizer": ("model", "vocab_file", "merge_file"),
    "SentencePieceTokenizer": ("model",),
    "TikTokenizer": ("model", "vocab_size"),
    "GPT2BPETokenizer": ("vocab_file", "merge_file"),
    "NullTokenizer": ("vocab_size",),
    "BertWordPieceLowerCase": ("vocab_file",),
    "BertWordPieceCase": ("vocab_file",),
    "GPTSentencePieceTokenizer": ("model",),
    "Llama2Tokenizer": ("model",),
    "MultimodalTokenizer": ("model",),
    "NullMultimodalTokenizer": ("vocab_size",),
}

#: The keys each tokenizer type needs set (its files, or NullTokenizer's size): the
#: ``tokenizer-files`` rule of :mod:`dlmspec.check.tokenizer`.
TOKENIZER_NEEDS: dict[str, tuple[str, ...]] = {
    "HuggingFaceTokenizer": ("model",),
    "SentencePieceTokenizer": ("model",),
    "TikTokenizer": ("model",),
    "GPT2BPETokenizer": ("vocab_file", "merge_file"),
    "NullTokenizer": ("vocab_size",),
    "BertWordPieceLowerCase": ("vocab_file",),
    "BertWordPieceCase": ("vocab_file",),
    "GPTSentencePieceTokenizer": ("model",),
    "Llama2Tokenizer": ("model",),
    "MultimodalTokenizer": ("model",),
    "NullMultimodalTokenizer": ("vocab_size",),
}

#: Tokenizer types whose size and EOD :func:`dlmspec.tokenizers.tokenizer_facts` reads from their
#: files (GPT-2 BPE, NullTokenizer and Hugging Face folders have their own branches in
#: :func:`dlmspec.resolve.eod_choice`).
FILE_FACT_TYPES: tuple[str, ...] = ("BertWordPieceLowerCase", "BertWordPieceCase", "SentencePieceTokenizer",
                                    "GPTSentencePieceTokenizer", "Llama2Tokenizer", "TikTokenizer",
                                    "NullMultimodalTokenizer")
