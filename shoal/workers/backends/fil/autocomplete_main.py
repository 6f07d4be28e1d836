"""The throw-away interpreter of fil auto-complete (see ``autocomplete``):
``python -m shoal.workers.backends.fil.autocomplete_main <model_type> <model file>`` loads the
model with its own library (``forest.load_forest``) and writes
``{"num_features": N, "num_class": C}`` on stdout. On failure it writes one line naming the
problem on stderr and exits with status 1.
"""

from __future__ import annotations

import json
import sys

from shoal.errors import ShoalError
from shoal.workers.backends.fil.forest import load_forest
from shoal.workers.backends.fil.params import DEFAULT_FILENAMES


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in DEFAULT_FILENAMES:
        sys.stderr.write("usage: python -m shoal.workers.backends.fil.autocomplete_main "
                         f"<{'|'.join(DEFAULT_FILENAMES)}> <model file>\n")
        return 1
    try:
        forest = load_forest(args[0], args[1], threads=1)
    except ShoalError as exc:
        sys.stderr.write(exc.message.replace("\n", " ") + "\n")
        return 1
    except Exception as exc:  # a library's own failure: one line, never a traceback
        sys.stderr.write(f"{type(exc).__name__}: {exc}".replace("\n", " ") + "\n")
        return 1
    sys.stdout.write(json.dumps({"num_features": forest.num_features,
                                 "num_class": forest.num_class}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
