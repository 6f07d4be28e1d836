"""Build examples/pt2_repository/affine_pt2/1/model.pt2: a PyTorch 2 exported program
(``torch.export.save``) of a 4 -> 3 linear layer plus a bias input, exported with a dynamic
batch dim so the server can batch it (``max_batch_size: 8`` in its config). The file is
committed; this script reproduces it (fixed seed)."""

from __future__ import annotations

import argparse
import pathlib

import torch

DEFAULT_PATH = pathlib.Path(__file__).parent / "pt2_repository" / "affine_pt2" / "1" / "model.pt2"


class Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.linear(x) + bias, x.sum(dim=1, keepdim=True)


def build(path: pathlib.Path) -> None:
    batch = torch.export.Dim("batch", max=64)
    program = torch.export.export(Affine().eval(), (torch.randn(2, 4), torch.randn(2, 3)),
                                  dynamic_shapes={"x": {0: batch}, "bias": {0: batch}})
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_PATH)
    build(parser.parse_args().out)


if __name__ == "__main__":
    main()
