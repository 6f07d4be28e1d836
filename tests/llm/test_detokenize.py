"""Incremental detokenization: streamed pieces join to the full decode and never end inside a
multi-byte character."""

from __future__ import annotations

import pathlib
import random

from tokenizers import Tokenizer

from shoal.llm.tiny_checkpoint import write_tokenizer
from shoal.workers.backends.llm.detokenize import IncrementalDetokenizer


def _byte_level(tmp_path: pathlib.Path) -> Tokenizer:
    write_tokenizer(tmp_path, "byte_level", 400)
    return Tokenizer.from_file(str(tmp_path / "tokenizer.json"))


def test_pieces_join_to_the_text_and_never_split_a_character(tmp_path: pathlib.Path) -> None:
    tokenizer = _byte_level(tmp_path)
    text = "Hello café 日本語 🙂 naïve → ∞!"
    ids = tokenizer.encode(text).ids
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)  # some character spans tokens
    detokenizer = IncrementalDetokenizer(tokenizer)
    pieces = [detokenizer.push([token]) for token in ids] + [detokenizer.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)


def test_random_token_streams_match_the_full_decode(tmp_path: pathlib.Path) -> None:
    tokenizer = _byte_level(tmp_path)
    rng = random.Random(7)
    for _ in range(100):
        stream = [rng.randrange(tokenizer.get_vocab_size()) for _ in range(40)]
        detokenizer = IncrementalDetokenizer(tokenizer)
        pieces = []
        position = 0
        while position < len(stream):  # uneven chunks, as an iteration may yield several
            size = rng.randint(1, 3)
            pieces.append(detokenizer.push(stream[position:position + size]))
            position += size
        pieces.append(detokenizer.flush())
        assert "".join(pieces) == tokenizer.decode(stream, skip_special_tokens=True)


def test_a_prompt_gives_context_but_is_not_emitted(tmp_path: pathlib.Path) -> None:
    tokenizer = _byte_level(tmp_path)
    prompt, answer = tokenizer.encode("Hello").ids, tokenizer.encode(" world 🙂").ids
    detokenizer = IncrementalDetokenizer(tokenizer, prompt)
    pieces = [detokenizer.push([token]) for token in answer] + [detokenizer.flush()]
    assert "".join(pieces) == " world 🙂"
