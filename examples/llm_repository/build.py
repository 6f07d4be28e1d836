"""Build the example's checkpoint: a tiny random Llama and a byte-level BPE tokenizer, offline.

    python examples/llm_repository/build.py            # -> examples/llm_repository/llm/checkpoint
    shoal serve --model-repository examples/llm_repository

The weights are random (a fixed seed), so the text is gibberish; the point is the serving path.
Sizes default to the issue's benchmark model (4 layers, hidden 256, 8 / 4 heads); flags shrink it
(the end-to-end tests build a smaller one with this script). Needs ``transformers``.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # run from a checkout without installing

from shoal.llm.tiny_checkpoint import TinyLlamaSpec, build_tiny_llama  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=pathlib.Path, default=HERE / "llm" / "checkpoint",
                        help="checkpoint directory to write (default: %(default)s)")
    parser.add_argument("--vocab-size", type=int, default=2048,
                        help="most tokens the BPE may learn (the model gets what it learns)")
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--intermediate-size", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--max-positions", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    spec = TinyLlamaSpec(
        vocab_size=args.vocab_size, hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size, num_layers=args.layers, num_heads=args.heads,
        num_kv_heads=args.kv_heads, max_position_embeddings=args.max_positions, seed=args.seed,
        tokenizer="byte_level")
    vocab = build_tiny_llama(args.output, spec)
    print(f"wrote a tiny Llama ({args.layers} layers, hidden {args.hidden_size}, vocabulary "
          f"{vocab}) to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
