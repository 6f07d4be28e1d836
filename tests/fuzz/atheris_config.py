"""Coverage-guided fuzzing of config.pbtxt: parse, normalize, and the broker's reads of the
normalized config (``test_fuzz_model_config.read_normalized``).

    .venv/bin/python tests/fuzz/atheris_config.py -max_total_time=600

Input: byte 0 = GPU count (mod 3), the rest = the file's bytes (UTF-8 checked as
``load_config_file`` does). See ``harness.py``.
"""

from __future__ import annotations

import os
import sys

import atheris

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

with atheris.instrument_imports(include=["shoal"]):
    from shoal.config.model_config import normalize_config, parse_config_text
    from shoal.errors import ErrorCode, invalid_arg
    from tests.fuzz.harness import client_outcome, fuzz
    from tests.fuzz.test_fuzz_model_config import read_normalized

SOURCE = "m/config.pbtxt"
TOKENS = ("name:", "backend:", "platform:", "max_batch_size:", "input", "output", "dims:",
          "data_type:", "TYPE_FP32", "TYPE_STRING", "instance_group", "count:", "kind:",
          "KIND_GPU", "gpus:", "dynamic_batching", "preferred_batch_size:", "priority_levels:",
          "sequence_batching", "control_input", "control", "CONTROL_SEQUENCE_CORRID", "state",
          "oldest", "direct", "ensemble_scheduling", "step", "input_map", "output_map",
          "model_warmup", "batch_input", "batch_output", "reshape", "shape:", "parameters",
          "string_value:", "\"python\"", "\"ensemble\"", "\"m\"", "{", "}", "[", "]", "-1",
          "2147483647", "9223372036854775807")


def test_one_input(data: bytes) -> None:
    gpu_count = data[0] % 3 if data else 0

    def run() -> None:
        try:
            text = data[1:].decode("utf-8")
        except UnicodeDecodeError:
            raise invalid_arg("not UTF-8") from None
        config = normalize_config(parse_config_text(text, SOURCE), model_name="m",
                                  source=SOURCE, gpu_count=gpu_count)
        read_normalized(config)

    client_outcome(run, also=frozenset({ErrorCode.UNSUPPORTED}))


if __name__ == "__main__":
    fuzz("config", test_one_input, TOKENS)
