"""A byte-level BPE tokenizer trained on the corpus, saved so ``AutoTokenizer`` (and so SGLang,
without ``--skip-tokenizer-init``) loads it: tokenizer.json + tokenizer_config.json.

Special tokens get the first ids: ``<|endoftext|>`` (eos, the document separator),
``<|MASK|>`` (DFlash's mask token, SGLang's default name) and ``<|pad|>``. No BOS and no
post-processor: the ids of a text are exactly ``encode(text)``, on both sides.
"""

from __future__ import annotations

import json
from pathlib import Path

from .config import EOS_TOKEN, MASK_TOKEN, PAD_TOKEN, SPECIAL_TOKENS


def train_tokenizer(texts: list[str], vocab_size: int, max_chars: int):
    """Train on the first ``max_chars`` characters of ``texts`` (in order): deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    picked, n = [], 0
    for t in texts:
        if n >= max_chars:
            break
        picked.append(t)
        n += len(t)
    tok.train_from_iterator(picked, trainer=trainer)
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return tok


def encode_docs(tok, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def save_tokenizer(tok, out: Path, model_max_length: int) -> None:
    """tokenizer.json plus the config files transformers' AutoTokenizer reads."""
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    added = {
        str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for i, s in enumerate(SPECIAL_TOKENS)
    }
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "mask_token": MASK_TOKEN,
        "bos_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    smap = {"eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN, "mask_token": MASK_TOKEN}
    (out / "special_tokens_map.json").write_text(json.dumps(smap, indent=2) + "\n")
