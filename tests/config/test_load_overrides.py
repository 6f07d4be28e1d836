"""Load overrides: the hostile matrix (names, ``file:`` keys, config fields, files without a
config) is refused with INVALID_ARG naming the field; accepted overrides come back checked.
The matrix is shared with tests/broker/lifecycle/test_materialize.py, which checks that the
same requests leave nothing on disk."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from shoal.config.load_overrides import (
    MAX_OVERRIDE_FILES,
    LoadOverrides,
    check_load_parameters,
    check_model_directory,
    check_model_name,
    parse_config_override,
)
from shoal.errors import ErrorCode, ShoalError

NAME = "m"
MODEL = b"# model\n"


def config_json(**fields: Any) -> str:
    doc: dict[str, Any] = {"name": NAME, "backend": "python", "max_batch_size": 4,
                           "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}],
                           "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}]}
    doc.update(fields)
    return json.dumps(doc)


def refusal(call: Any, *args: Any) -> str:
    with pytest.raises(ShoalError) as info:
        call(*args)
    assert info.value.code == ErrorCode.INVALID_ARG
    return info.value.message


# ------------------------------------------------------------------ the hostile matrix

BAD_NAMES = [
    "", " ", "\t", "\n", ".", "..", "../etc", "a/../b", "../../etc/passwd", "model/..",
    "/etc/passwd", "model/subdir", "model/", "a\\b", "..\\x", "a\x00b", "a\nb", "a\rb", "\x7f",
    "a\x85b", ".hidden", "..my_model", "...", " ..", ".. ", " m", "m ", "a" * 256, "é" * 128,
    "\ud800", "$(reboot)/x",
]

_LONG_COMPONENT = "a" * 256
_LONG_PATH = "/".join(["a" * 200] * 21)  # 4220 bytes

# file: key -> a word the refusal must contain (besides the key itself)
BAD_FILE_KEYS = {
    "file:": "empty",
    "file:/etc/passwd": "absolute",
    "file://etc/passwd": "absolute",
    "file:../x": "'..'",
    "file:../../root/.bashrc": "'..'",
    "file:1/../../x": "'..'",
    "file:1/a/../b": "'..'",
    "file:1/..": "'..'",
    "file:./1/model.py": "'.'",
    "file:1/./model.py": "'.'",
    "file:1//model.py": "empty component",
    "file:1/model.py/": "empty component",
    "file:1\\model.py": "backslash",
    "file:1/..\\..\\x": "backslash",
    "file:1/mo\x00del.py": "control",
    "file:1/a\nb": "control",
    f"file:1/{_LONG_COMPONENT}": "255",
    f"file:1/{_LONG_PATH}": "4096",
    "file:1/" + "/".join(["d"] * 64): "components",
    "file:1/\ud800": "Unicode",
    "file:model.py": "version",
    "file:config.pbtxt": "version",
    "file:configs/m.pbtxt": "version",
    "file:01/model.py": "version",
    "file:v1/model.py": "version",
    "file:-1/model.py": "version",
    "file:99999999999999999999/model.py": "version",
    "file:\u0661/model.py": "version",  # an Arabic-Indic digit: not a version directory
    "file:1": "inside",
    "file:warmup": "inside",
}

# config fields -> the field path the refusal must name
BAD_CONFIGS: dict[str, tuple[str, str]] = {
    "not json": ("{not json", "config"),
    "not an object": ("[]", "config"),
    "unknown field": (config_json(unknown_field=1), "config"),
    "deep nesting": ("[" * 100_000, "config"),
    "null": ("null", "config"),
    "duplicate key": ('{"name": "m", "name": "m"}', "config"),
    "wrong type": (config_json(max_batch_size="many"), "config"),
    "other name": (config_json(name="other"), "config: name"),
    "backend traversal": (config_json(backend="../../tmp/evil"), "config: backend"),
    "backend slash": (config_json(backend="a/b"), "config: backend"),
    "backend shell": (config_json(backend="py;reboot"), "config: backend"),
    "backend dot": (config_json(backend=".."), "config: backend"),
    "platform traversal": (config_json(platform="../x"), "config: platform"),
    "runtime absolute": (config_json(runtime="/usr/lib/libevil.so"), "config: runtime"),
    "runtime traversal": (config_json(runtime="../libevil.so"), "config: runtime"),
    "default_model_filename traversal": (config_json(default_model_filename="../model.py"),
                                         "config: default_model_filename"),
    "default_model_filename path": (config_json(default_model_filename="a/model.py"),
                                    "config: default_model_filename"),
    "default_model_filename dot": (config_json(default_model_filename="."),
                                   "config: default_model_filename"),
    "default_model_filename dotdot": (config_json(default_model_filename=".."),
                                      "config: default_model_filename"),
    "default_model_filename absolute": (config_json(default_model_filename="/etc/passwd"),
                                        "config: default_model_filename"),
    "default_model_filename NUL": (config_json(default_model_filename="a\x00b"),
                                   "config: default_model_filename"),
    "cc_model_filenames": (config_json(cc_model_filenames={"sm_80": "../x.plan"}),
                           "config: cc_model_filenames['sm_80']"),
    "label_filename": (config_json(output=[{"name": "OUT", "data_type": "TYPE_FP32",
                                            "dims": [4], "label_filename": "../../etc/passwd"}]),
                       "config: output[0].label_filename"),
    "warmup traversal": (config_json(model_warmup=[{
        "name": "w", "batch_size": 1, "inputs": {"IN": {
            "data_type": "TYPE_FP32", "dims": [4], "input_data_file": "../../etc/shadow"}}}]),
        "config: model_warmup[0].inputs['IN'].input_data_file"),
    "warmup absolute": (config_json(model_warmup=[{
        "name": "w", "batch_size": 1, "inputs": {"IN": {
            "data_type": "TYPE_FP32", "dims": [4], "input_data_file": "/etc/shadow"}}}]),
        "config: model_warmup[0].inputs['IN'].input_data_file"),
    "initial_state traversal": (config_json(sequence_batching={"state": [{
        "input_name": "S_IN", "output_name": "S_OUT", "data_type": "TYPE_FP32", "dims": [4],
        "initial_state": [{"name": "init", "data_type": "TYPE_FP32", "dims": [4],
                           "data_file": "../secret"}]}]}),
        "config: sequence_batching.state[0].initial_state[0].data_file"),
    "repository agents": (config_json(model_repository_agents={"agents": [{"name": "checksum"}]}),
                          "config: model_repository_agents"),
    "op libraries": (config_json(model_operations={"op_library_filename": ["/tmp/evil.so"]}),
                     "config: model_operations.op_library_filename"),
    "ensemble step traversal": (json.dumps({
        "name": NAME, "platform": "ensemble",
        "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}],
        "ensemble_scheduling": {"step": [{"model_name": "../outside", "model_version": -1,
                                          "input_map": {"X": "IN"},
                                          "output_map": {"Y": "OUT"}}]}}),
        "config: ensemble_scheduling.step[0].model_name"),
    "execution env absolute": (config_json(parameters={"EXECUTION_ENV_PATH": {
        "string_value": "/tmp/env.tar.gz"}}), "config: parameters['EXECUTION_ENV_PATH']"),
    "execution env traversal": (config_json(parameters={"EXECUTION_ENV_PATH": {
        "string_value": "$$TRITON_MODEL_DIRECTORY/../../env.tar.gz"}}),
        "config: parameters['EXECUTION_ENV_PATH']"),
}


def hostile_requests() -> list[Any]:
    """(model name, load parameters, text the refusal must contain) for every refusal; shared
    with the materialisation tests."""
    good_files: dict[str, str | bytes] = {"file:1/model.py": MODEL}
    cases: list[Any] = []
    for name in BAD_NAMES:
        cases.append(pytest.param(name, {"config": config_json(), **good_files}, "model name",
                                  id=f"name-{name!r}"))
    for key, word in BAD_FILE_KEYS.items():
        params: dict[str, str | bytes] = {"config": config_json(), key: MODEL}
        shown_key = key if len(key) < 60 and key.isprintable() else "file:"
        cases.append(pytest.param(NAME, params, f"parameter '{shown_key}", id=f"key-{key!r}"))
        cases.append(pytest.param(NAME, params, word, id=f"key-{key!r}-why"))
    for case, (text, field) in BAD_CONFIGS.items():
        cases.append(pytest.param(NAME, {"config": text, **good_files}, f"{field}",
                                  id=f"config-{case}"))
    cases += [
        pytest.param(NAME, {"file:1/model.py": MODEL}, "parameter 'config' must be provided",
                     id="files-without-config"),
        pytest.param(NAME, {"config": "", "file:1/model.py": MODEL},
                     "parameter 'config' must be provided", id="files-with-empty-config"),
        pytest.param(NAME, {"config": config_json(), "file:1/model.py": "text, not bytes"},
                     "parameter 'file:1/model.py': must be bytes", id="value-not-bytes"),
        pytest.param(NAME, {"config": b"{}"}, "parameter 'config': must be a string",
                     id="config-not-string"),
        pytest.param(NAME, {"config": config_json(), "file:1/a": MODEL, "file:1/a/b": MODEL},
                     "parameter 'file:1/a': is a file and also the directory", id="file-and-dir"),
        pytest.param(NAME, {"config": config_json(),
                            **{f"file:1/f{i}": MODEL for i in range(MAX_OVERRIDE_FILES + 1)}},
                     f"at most {MAX_OVERRIDE_FILES}", id="too-many-files"),
    ]
    return cases


@pytest.mark.parametrize(("name", "parameters", "expected"), hostile_requests())
def test_hostile_load_parameters_are_refused(name: str, parameters: dict[str, str | bytes],
                                             expected: str) -> None:
    message = refusal(check_load_parameters, name, parameters)
    assert expected in message
    for line in (message,):  # no forged log lines, no raw NUL in what clients see
        assert "\n" not in line and "\x00" not in line


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_model_names(name: str) -> None:
    assert refusal(check_model_name, name).startswith("model name")


@pytest.mark.parametrize(("text", "field"), BAD_CONFIGS.values(), ids=list(BAD_CONFIGS))
def test_bad_config_fields_name_the_field(text: str, field: str) -> None:
    message = refusal(parse_config_override, NAME, text)
    assert message.startswith(f"failed to load '{NAME}': {field}")
    assert message == refusal(check_load_parameters, NAME, {"config": text})


# ------------------------------------------------------------------ accepted


@pytest.mark.parametrize("name", ["add_sub", "model.version1", "model..1", "my model", "a-b_c",
                                  "ünïcode", "model(1)", "a" * 255, "é" * 127])
def test_good_model_names(name: str) -> None:
    check_model_name(name)


def test_accepted_overrides_come_back_checked() -> None:
    warmup = [{"name": "w", "batch_size": 1, "inputs": {"IN": {
        "data_type": "TYPE_FP32", "dims": [4], "input_data_file": "raw/in0"}}}]
    config = config_json(
        model_warmup=warmup, default_model_filename="model.py", runtime="model.py",
        model_repository_agents={},  # an empty section (as a fetched config has) is fine
        parameters={"EXECUTION_ENV_PATH": {"string_value": "$$TRITON_MODEL_DIRECTORY/env.tgz"}})
    parameters: dict[str, Any] = {
        "config": config, "file:1/model.py": MODEL, "file:1/sub/weights.bin": b"\x00\x01",
        "file:0/model.py": b"", "file:warmup/raw/in0": b"\x00" * 16,
        "unload_dependents": True, "FILE:1/x": "ignored", "files:../x": "ignored",
    }
    overrides = check_load_parameters(NAME, parameters)
    assert overrides == LoadOverrides(config, {
        "1/model.py": MODEL, "1/sub/weights.bin": b"\x00\x01", "0/model.py": b"",
        "warmup/raw/in0": b"\x00" * 16})


def test_no_overrides() -> None:
    assert check_load_parameters(NAME, {}) == LoadOverrides("", {})
    assert check_load_parameters(NAME, {"config": "", "other": "x"}) == LoadOverrides("", {})


def test_config_only_override() -> None:
    overrides = check_load_parameters(NAME, {"config": config_json()})
    assert overrides.files == {}
    assert parse_config_override(NAME, overrides.config_json).backend == "python"


def test_config_override_name_is_filled() -> None:
    config = parse_config_override(NAME, json.dumps({"backend": "python"}))
    assert config.name == NAME


def test_file_paths_at_the_limits_are_accepted() -> None:
    longest = "1/" + "/".join(["b" * 255] * 16)[: 4096 - 2]
    longest = longest.rstrip("/")
    params: dict[str, str | bytes] = {"config": config_json(), f"file:{longest}": MODEL,
                                      "file:1/" + "/".join(["d"] * 62) + "/f": MODEL}
    assert len(check_load_parameters(NAME, params).files) == 2
    many = {f"file:1/f{i}": MODEL for i in range(MAX_OVERRIDE_FILES)}
    assert len(check_load_parameters(NAME, {"config": config_json(), **many}).files) == 1000


# ------------------------------------------------------------------ repository model directories


def test_model_directory_plain_and_missing(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    assert check_model_directory(str(tmp_path), "m") == os.path.join(tmp_path, "m")
    assert check_model_directory(str(tmp_path), "absent") == os.path.join(tmp_path, "absent")


def test_model_directory_symlink_inside_is_fine(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "store" / "real").mkdir(parents=True)
    (repo / "m").symlink_to(repo / "store" / "real")
    (repo / "rel").symlink_to("store/real")
    assert check_model_directory(str(repo), "m") == os.path.join(repo, "m")
    assert check_model_directory(str(repo), "rel") == os.path.join(repo, "rel")


@pytest.mark.parametrize("target", ["outside", "repo-root", "dangling-outside", "chain"])
def test_model_directory_symlink_outside_is_refused(tmp_path: Path, target: str) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (tmp_path / "outside").mkdir()
    if target == "outside":
        (repo / "m").symlink_to(tmp_path / "outside")
    elif target == "repo-root":
        (repo / "m").symlink_to(".")
    elif target == "dangling-outside":
        (repo / "m").symlink_to(tmp_path / "nowhere")
    else:  # an inside link that leads to an outside link
        (repo / "hop").symlink_to(tmp_path / "outside")
        (repo / "m").symlink_to("hop")
    message = refusal(check_model_directory, str(repo), "m")
    assert message == ("model 'm': its directory is a symbolic link that leads outside the "
                       "model repository")


def test_model_directory_checks_the_name(tmp_path: Path) -> None:
    assert refusal(check_model_directory, str(tmp_path), "../etc").startswith("model name")


@pytest.mark.parametrize("config", [
    '{"\\ud800": null}',  # a key
    '{"name": "m", "backend": "a\\udfff"}',  # a string value
    '{"name": "m", "parameters": {"k": {"string_value": "\\udc00\\ud800"}}}',
])
def test_config_with_a_lone_surrogate_escape_is_refused(config: str) -> None:
    """Found by fuzzing: json.loads turns the escape into a lone surrogate, on which protobuf's
    ParseDict failed with SystemError for a key (a 500 over HTTP)."""
    message = refusal(check_load_parameters, NAME, {"config": config})
    assert message.startswith(f"failed to load '{NAME}': config: not a valid JSON model "
                              "configuration: a string holds a lone UTF-16 surrogate escape")
