"""Small assets the framework wheels do not ship: a BPE tokenizer and a c4-style text corpus.

torchtitan's debug configs read ``./tests/assets/tokenizer`` (tokenizer.json, tokenizer_config.json)
and the ``c4_test`` dataset (``tests/assets/c4_test``, JSON lines with a "text" field), relative to
the working directory. `make_torchtitan_assets(root)` writes both under `root`, deterministically:
the corpus is generated text and the tokenizer is trained on it with the `tokenizers` library.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = (
    "the network carries gradients between ranks while each accelerator computes its layers and the switch "
    "buffers packets until the pause frame clears the queue so the step time depends on congestion control"
).split()


def corpus(lines: int = 400, seed: int = 0) -> list[str]:
    """Deterministic sentences over a small vocabulary."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 120))) + "." for _ in range(lines)]


def make_torchtitan_assets(root: Path, vocab_size: int = 512) -> Path:
    """Write tests/assets/tokenizer and tests/assets/c4_test under `root`; return `root`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = corpus()
    data = root / "tests" / "assets" / "c4_test"
    data.mkdir(parents=True, exist_ok=True)
    (data / "data.json").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<unk>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(texts, trainer)
    out = root / "tests" / "assets" / "tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {"bos_token": specials[0], "eos_token": specials[1], "tokenizer_class": "PreTrainedTokenizerFast"}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return root


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="write torchtitan's test assets (tokenizer, c4_test) under DIR")
    parser.add_argument("dir", type=Path)
    root = make_torchtitan_assets(parser.parse_args().dir)
    print(f"wrote {root}/tests/assets/tokenizer and {root}/tests/assets/c4_test")
