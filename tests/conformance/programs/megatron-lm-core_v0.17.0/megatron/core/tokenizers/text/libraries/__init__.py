# Copyright (c) 2025, NVIDIA CORPORATION. All rights reserved.

from megatron.core.tokenizers.text.libraries.bytelevel_tokenizer import ByteLevelTokenizer
from megatron.core.tokenizers.text.libraries.huggingface_tokenizer import HuggingFaceTokenizer
from megatron.core.tokenizers.text.libraries.megatron_hf_tokenizer import MegatronHFTokenizer
from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer
from megatron.core.tokenizers.text.libraries.sentencepiece_tokenizer import SentencePieceTokenizer
from megatron.core.tokenizers.text.libraries.sft_tokenizer import SFTTokenizer
from megatron.core.tokenizers.text.libraries.tiktoken_tokenizer import TikTokenTokenizer
