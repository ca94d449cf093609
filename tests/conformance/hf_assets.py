"""A small causal LM saved as a Hugging Face hub checkpoint is laid out, for programs that load one by name.

transformers' own distributed Trainer script (`tests/trainer/distributed/scripts/train.py`) loads
`trl-internal-testing/tiny-Qwen2ForCausalLM-2.5` from the hub by default and takes `--model_name` for another
one. This machine has no hub access, so `make_tiny_qwen2(dir)` writes a local stand-in with the same
architecture (Qwen2ForCausalLM, grouped-query attention): a byte-level BPE tokenizer trained on the script's
own sentences (every byte in its alphabet, an end-of-text token the script pads with), and a 2-layer Qwen2 with
random weights from a fixed seed, written with `save_pretrained` (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json). `AutoTokenizer.from_pretrained(dir)` and
`AutoModelForCausalLM.from_pretrained(dir)` load it as they load a hub checkpoint.
"""

from __future__ import annotations

from pathlib import Path

# the sentences of train.py's synthetic data set (the tokenizer is trained on them)
SENTENCES = (
    "The quick brown fox jumps over the lazy dog. ",
    "A journey of a thousand miles begins with a single step. ",
    "To be or not to be, that is the question. ",
    "All that glitters is not gold, all that wanders is not lost. ",
)
EOS = "<|endoftext|>"


def make_tiny_qwen2(out: Path, vocab_size: int = 384, hidden: int = 128, layers: int = 2) -> Path:
    """Write a tiny Qwen2ForCausalLM checkpoint and its tokenizer to `out`; return `out`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([s * 5 for s in SENTENCES], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, model_max_length=512)
    config = Qwen2Config(
        vocab_size=tok.get_vocab_size(),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=tok.token_to_id(EOS),
        bos_token_id=tok.token_to_id(EOS),
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    Qwen2ForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="write a tiny Qwen2 checkpoint and tokenizer to DIR")
    parser.add_argument("dir", type=Path)
    print(f"wrote {make_tiny_qwen2(parser.parse_args().dir)}")
