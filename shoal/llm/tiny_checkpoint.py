"""Tiny random Llama checkpoints with a tokenizer, built offline (nothing is downloaded): for
tests, examples and benchmarks. Needs ``transformers`` (a development dependency) to write the
checkpoint exactly as Hugging Face does.

Two tokenizers: ``word_level`` (``<pad>``-like specials, then ``w3`` .. ``w<vocab-1>``: one token
per whitespace-separated word, for tests that work on token ids) and ``byte_level`` (a byte-level
BPE trained here on a small built-in text that includes multi-byte characters, so any UTF-8 text
round-trips and one character can span several tokens). Both put ``<unk>``/``<pad>`` at 0,
``<s>`` at 1 and ``</s>`` at 2, the checkpoint's pad, bos and eos ids.

``tokenizer_config.json`` names those special tokens and, unless ``chat_template`` is False, a
small chat template (``CHAT_TEMPLATE``: bos, then ``<|role|>`` headers, each message ended by
eos; unknown roles raise), so Hugging Face's ``AutoTokenizer`` and ``apply_chat_template`` work
on the directory.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass
from typing import Literal

TokenizerKind = Literal["word_level", "byte_level"]

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Unknown role: ' + message['role']) }}{% endif %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")

# Training text of the byte-level tokenizer: plain English plus accented, CJK and emoji text, so
# merges exist for common words and multi-byte characters are split over several tokens.
_CORPUS = """\
Hello world. Hello there, how are you today? I am fine, thank you, and you?
The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.
Machine learning models turn numbers into other numbers; servers move them around.
A small model can still say many things: one, two, three, four, five, six, seven.
Café au lait, naïve façade, jalapeño, crème brûlée, Zürich, São Paulo, Kraków.
日本語のテキストも少し含めます。東京は大きな都市です。
Emoji too: 🙂 🚀 🎉 and symbols like € £ ¥ © ™ → ∞.
"""


@dataclass(frozen=True)
class TinyLlamaSpec:
    """Sizes of the random model. ``vocab_size`` is the word-level vocabulary, or the most the
    byte-level BPE may learn (the model gets the size the tokenizer actually has)."""

    vocab_size: int = 128
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 256
    seed: int = 1234
    init_range: float = 0.5  # wide enough that greedy outputs vary (0.02 repeats one token)
    tokenizer: TokenizerKind = "word_level"
    chat_template: bool = True  # write CHAT_TEMPLATE into tokenizer_config.json


def build_tiny_llama(path: str | pathlib.Path, spec: TinyLlamaSpec = TinyLlamaSpec()) -> int:
    """Write ``config.json``, ``model.safetensors`` and ``tokenizer.json`` into ``path``
    (created); returns the model's vocabulary size. Deterministic for a given ``spec``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory = pathlib.Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    vocab_size = write_tokenizer(directory, spec.tokenizer, spec.vocab_size)
    write_tokenizer_config(directory, spec.tokenizer, spec.chat_template)
    torch.manual_seed(spec.seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.init_range, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
        pad_token_id=PAD_ID)
    LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    return vocab_size


def write_tokenizer_config(directory: pathlib.Path, kind: TokenizerKind,
                           chat_template: bool) -> None:
    """Write ``directory/tokenizer_config.json`` (special tokens, maybe the chat template)."""
    unk = "<unk>" if kind == "word_level" else "<pad>"
    config: dict[str, object] = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": unk, "pad_token": unk, "model_max_length": 1 << 30}
    if chat_template:
        config["chat_template"] = CHAT_TEMPLATE
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def write_tokenizer(directory: pathlib.Path, kind: TokenizerKind, vocab_size: int) -> int:
    """Write ``directory/tokenizer.json``; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE, WordLevel
    from tokenizers.trainers import BpeTrainer

    if kind == "word_level":
        vocab = {"<unk>": PAD_ID, "<s>": BOS_ID, "</s>": EOS_ID} | {
            f"w{i}": i for i in range(3, vocab_size)}
        tokenizer = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    else:
        tokenizer = Tokenizer(BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             show_progress=False)
        tokenizer.train_from_iterator(_CORPUS.splitlines(), trainer=trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    size: int = tokenizer.get_vocab_size()
    return size
