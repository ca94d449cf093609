# Copyright (c) 2025, NVIDIA CORPORATION. All rights reserved.

from megatron.core.tokenizers.text.models.bert_tokenizer import BertTokenizer
from megatron.core.tokenizers.text.models.default_tokenizer import DefaultTokenizerText
from megatron.core.tokenizers.text.models.gpt_tokenizer import GPTTokenizer
from megatron.core.tokenizers.text.models.mamba_tokenizer import MambaTokenizer
from megatron.core.tokenizers.text.models.t5_tokenizer import T5Tokenizer
