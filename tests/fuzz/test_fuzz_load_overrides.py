"""Fuzzing load overrides (``load_overrides.py``: model names, ``file:`` keys and values, the
``config`` JSON) and what the broker does with an accepted override short of writing files
(``normalize_config`` and the reads of ``build_runtime``): any load request gives checked
overrides that can cross the wire, or a client error."""

from __future__ import annotations

import json
from typing import Any, Final

from google.protobuf import json_format
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2 as pb

from shoal.config.load_overrides import check_load_parameters, parse_config_override
from shoal.config.model_config import normalize_config, parse_config_text
from shoal.errors import ErrorCode
from shoal.messages import LoadModel, encode
from tests.fuzz.strategies import any_text, json_values, messages, mutated_json, mutated_messages
from tests.fuzz.support import check_client_outcome, examples
from tests.fuzz.test_fuzz_model_config import OVERRIDES, SEEDS, read_normalized

MODEL_NAMES: Final = ("m", "a b", "é", ".hidden", "..", ".", "", " m", "a/b", "a\\b", "a\x00",
                      "x" * 256, "\ud800", "\x85")
PATH_PARTS: Final = ("1", "0", "01", "9223372036854775808", "warmup", "initial_state", "..", ".",
                     "", "model.py", "x" * 256, "a\\b", "\x00", "é", " ")
names = st.one_of(st.sampled_from(MODEL_NAMES), any_text)
paths = st.one_of(st.lists(st.sampled_from(PATH_PARTS), min_size=1, max_size=4).map("/".join),
                  any_text)


def config_texts() -> st.SearchStrategy[str]:
    """The ``config`` parameter: a (mutated) seed config or a random one as JSON, its text
    mutated, or any JSON value."""
    seeds = st.sampled_from(SEEDS).map(lambda text: parse_config_text(text, "seed"))
    configs = st.one_of(seeds.flatmap(lambda c: mutated_messages(c, OVERRIDES)),
                        messages(pb.ModelConfig, OVERRIDES))
    as_json = configs.map(json_format.MessageToJson)
    return st.one_of(as_json, as_json.flatmap(lambda t: mutated_json(t.encode())).map(
        lambda b: b.decode("utf-8", "replace")), json_values.map(json.dumps), any_text)


@st.composite
def load_parameters(draw: st.DrawFn) -> dict[str, Any]:
    parameters: dict[str, Any] = {}
    if draw(st.integers(0, 4)):
        parameters["config"] = draw(st.one_of(config_texts(), st.binary(max_size=8)))
    for path in draw(st.lists(paths, max_size=3)):
        parameters["file:" + path] = draw(st.one_of(st.binary(max_size=8), st.text(max_size=4)))
    if draw(st.booleans()):
        parameters[draw(any_text)] = draw(any_text)
    return parameters


def load(name: str, parameters: dict[str, Any]) -> None:
    """The frontend's check, the message to the broker, the broker's reading of the config."""
    def run() -> None:
        overrides = check_load_parameters(name, parameters)
        encode(LoadModel(1, name, overrides.config_json,
                         {f"file:{path}": data for path, data in overrides.files.items()}))
        if overrides.config_json:
            config = parse_config_override(name, overrides.config_json)
            normalized = normalize_config(config, model_name=name,
                                          source=f"{name} (config override)")
            read_normalized(normalized)

    check_client_outcome(run, also=frozenset({ErrorCode.UNSUPPORTED}))


@examples(300)
@given(name=names, parameters=load_parameters())
def test_any_load_request(name: str, parameters: dict[str, Any]) -> None:
    load(name, parameters)


@examples(300)
@given(config=config_texts())
def test_any_config_override(config: str) -> None:
    load("m", {"config": config})


@examples(200)
@given(config=config_texts(), files=st.dictionaries(paths, st.binary(max_size=4), max_size=4))
def test_valid_names_with_any_files(config: str, files: dict[str, bytes]) -> None:
    load("m", {"config": config, **{f"file:{path}": data for path, data in files.items()}})
