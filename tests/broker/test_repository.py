from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as pb

from shoal.broker.repository import (
    ModelSource,
    SourceError,
    available_versions,
    discover_models,
    load_model_source,
    select_versions,
)
from shoal.errors import ErrorCode, ShoalError

ADD_SUB = """
name: "add_sub"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def make_model(repo: Path, name: str, versions: tuple[str, ...] = ("1",),
               config: str | None = None, model_file: str = "model.py") -> Path:
    model_dir = repo / name
    model_dir.mkdir(parents=True)
    for version in versions:
        (model_dir / version).mkdir()
        if model_file:
            (model_dir / version / model_file).write_text("# model\n")
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    return model_dir


def load(model_dir: Path, **kwargs: object) -> ModelSource:
    options: dict[str, object] = {"default_max_batch_size": 4, "gpu_count": 0,
                                  "auto_complete": None}
    options.update(kwargs)
    return load_model_source(model_dir.name, str(model_dir), str(model_dir.parent),
                             **options)  # type: ignore[arg-type]


def load_error(model_dir: Path, **kwargs: object) -> str:
    with pytest.raises(ShoalError) as info:
        load(model_dir, **kwargs)
    assert info.value.code == ErrorCode.INVALID_ARG
    return info.value.message


def latest(n: int) -> pb.ModelVersionPolicy:
    policy = pb.ModelVersionPolicy()
    policy.latest.num_versions = n
    return policy


# ------------------------------------------------------------------ discovery


def test_discover_models_across_repositories(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    make_model(first, "zeta")
    make_model(first, ".hidden")
    make_model(second, "alpha")
    (first / "README.md").write_text("not a model")
    found = discover_models([str(first), str(second)])
    assert found == {"alpha": str(second / "alpha"), "zeta": str(first / "zeta")}
    assert list(found) == ["alpha", "zeta"]


def test_discover_models_rejects_duplicates(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    make_model(first, "same")
    make_model(second, "same")
    with pytest.raises(ShoalError) as info:
        discover_models([str(first), str(second)])
    message = info.value.message
    assert "'same' is not unique" in message
    assert str(first) in message and str(second) in message


def test_discover_models_missing_repository(tmp_path: Path) -> None:
    with pytest.raises(ShoalError) as info:
        discover_models([str(tmp_path / "nope")])
    assert "cannot be read" in info.value.message


# ------------------------------------------------------------------ versions


def test_available_versions_follow_triton_rules(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "m", versions=("1", "2", "10", "01", "007", "abc", "0", "3x",
                                                     ".5", "warmup"))
    (model_dir / "4").write_text("a file, not a version directory")
    assert available_versions(str(model_dir)) == [0, 1, 2, 10]


@pytest.mark.parametrize(("policy_text", "expected"), [
    ("latest { num_versions: 1 }", [10]),
    ("latest { num_versions: 2 }", [3, 10]),
    ("latest { num_versions: 9 }", [1, 3, 10]),
    ("latest { }", []),
    ("all { }", [1, 3, 10]),
    ("specific { versions: [ 3, 1 ] }", [1, 3]),
    ("", [1, 3, 10]),  # a policy with no choice set means all (Triton's VersionsToLoad)
])
def test_select_versions(policy_text: str, expected: list[int]) -> None:
    from google.protobuf import text_format

    policy = text_format.Parse(policy_text, pb.ModelVersionPolicy())
    assert select_versions([10, 1, 3], policy) == expected


def test_select_missing_specific_version_is_an_error() -> None:
    policy = pb.ModelVersionPolicy()
    policy.specific.versions.extend([1, 7])
    with pytest.raises(ShoalError) as info:
        select_versions([1, 2], policy)
    assert "version_policy.specific.versions: version 7" in info.value.message


# ------------------------------------------------------------------ load_model_source


def test_load_with_config(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "add_sub", versions=("1", "2"), config=ADD_SUB)
    source = load(model_dir)
    assert source.name == "add_sub"
    assert source.repository == str(tmp_path)
    assert source.model_dir == str(model_dir)
    assert source.config_source == "add_sub/config.pbtxt"
    assert source.versions == [2]
    assert source.config.instance_group[0].name == "add_sub"
    assert source.config.version_policy.latest.num_versions == 1


def test_load_with_version_policy_all(tmp_path: Path) -> None:
    config = ADD_SUB + "version_policy { all { } }"
    source = load(make_model(tmp_path, "add_sub", versions=("1", "3"), config=config))
    assert source.versions == [1, 3]


def test_load_without_config_uses_auto_complete_before_normalizing(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "auto")
    seen: list[pb.ModelConfig] = []

    def auto_complete(path: str, partial: pb.ModelConfig) -> pb.ModelConfig:
        assert path == str(model_dir)
        seen.append(partial)
        completed = pb.ModelConfig()
        completed.CopyFrom(partial)
        completed.max_batch_size = 8
        completed.dynamic_batching.SetInParent()
        completed.input.add(name="x", data_type=pb.TYPE_FP32, dims=[3])
        completed.output.add(name="y", data_type=pb.TYPE_FP32, dims=[3])
        return completed

    source = load(model_dir, auto_complete=auto_complete)
    [partial] = seen
    assert (partial.name, partial.backend) == ("auto", "python")
    assert len(partial.instance_group) == 0  # not yet normalized
    assert not partial.HasField("version_policy")
    assert list(source.config.dynamic_batching.preferred_batch_size) == [8]
    assert [i.name for i in source.config.input] == ["x"]
    assert source.config_source == "auto/config.pbtxt"


def test_disabled_auto_complete_is_not_called(tmp_path: Path) -> None:
    def auto_complete(path: str, partial: pb.ModelConfig) -> pb.ModelConfig:
        raise AssertionError("must not be called")

    source = load(make_model(tmp_path, "plain", config=ADD_SUB.replace("add_sub", "plain")),
                  auto_complete=auto_complete, disable_auto_complete=True)
    assert source.config.instance_group[0].kind == pb.ModelInstanceGroup.KIND_CPU


def test_auto_complete_failure_is_reported(tmp_path: Path) -> None:
    def auto_complete(path: str, partial: pb.ModelConfig) -> pb.ModelConfig:
        raise ValueError("bad shape")

    message = load_error(make_model(tmp_path, "bad"), auto_complete=auto_complete)
    assert "model 'bad': auto-complete" in message and "bad shape" in message


def test_backend_inferred_from_model_pt(tmp_path: Path) -> None:
    source = load(make_model(tmp_path, "torchy", model_file="model.pt"), gpu_count=1)
    assert source.config.backend == "pytorch"
    assert source.config.platform == "pytorch_libtorch"
    assert source.config.instance_group[0].kind == pb.ModelInstanceGroup.KIND_GPU


def test_backend_from_model_name_suffix(tmp_path: Path) -> None:
    source = load(make_model(tmp_path, "thing.identity", model_file=""))
    assert source.config.backend == "identity"


def test_backend_cannot_be_inferred(tmp_path: Path) -> None:
    message = load_error(make_model(tmp_path, "mystery", model_file="weights.bin"))
    assert message.startswith("mystery/config.pbtxt: backend: cannot determine the backend")
    assert str(tmp_path) not in message


def test_no_version_directory(tmp_path: Path) -> None:
    message = load_error(make_model(tmp_path, "empty", versions=(), config=ADD_SUB))
    assert "model 'empty': no version directory" in message


def test_missing_specific_version_names_config(tmp_path: Path) -> None:
    config = ADD_SUB + "version_policy { specific { versions: [ 4 ] } }"
    message = load_error(make_model(tmp_path, "add_sub", config=config))
    assert message.startswith("add_sub/config.pbtxt: version_policy.specific.versions: version 4")


def test_errors_name_config_file_and_field(tmp_path: Path) -> None:
    broken = ADD_SUB.replace("dims: [ 4 ] } ]\noutput", "dims: [ 4, 0 ] } ]\noutput")
    message = load_error(make_model(tmp_path, "add_sub", config=broken))
    assert message.startswith("add_sub/config.pbtxt: input[0].dims[1]: 0 is not allowed")
    assert "directory name must equal the model name" in load_error(
        make_model(tmp_path, "renamed", config=ADD_SUB))


def test_syntax_error_names_config_file(tmp_path: Path) -> None:
    message = load_error(make_model(tmp_path, "add_sub", config='name: "add_sub"\nbackend: '))
    assert message.startswith("add_sub/config.pbtxt: line ")


def test_custom_config_name(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "add_sub", config=ADD_SUB)
    (model_dir / "configs").mkdir()
    (model_dir / "configs" / "big.pbtxt").write_text(ADD_SUB + "max_batch_size: 32")
    source = load(model_dir, config_name="big")
    assert source.config.max_batch_size == 32
    assert source.config_source == "add_sub/configs/big.pbtxt"
    assert load(model_dir, config_name="absent").config.max_batch_size == 0


# ------------------------------------------------------------------ failures and versions


@pytest.mark.parametrize(("policy", "versions"), [
    ("", [3]),  # Triton's default policy: the latest version
    ("version_policy: { all: {} }\n", [1, 2, 3]),
    ("version_policy: { specific: { versions: [ 2 ] } }\n", [2]),
])
def test_an_invalid_config_fails_with_the_versions_its_load_would_have_tried(
        tmp_path: Path, policy: str, versions: list[int]) -> None:
    """Triton 2.51 shows such a failure on those versions, UNAVAILABLE with the reason."""
    config = 'name: "m"\nbackend: "python"\ninput [{ name: "X" data_type: TYPE_FP32 }]\n' + policy
    model_dir = make_model(tmp_path, "m", ("1", "2", "3"), config)
    with pytest.raises(SourceError) as info:
        load(model_dir)
    assert "dims" in info.value.message and info.value.versions == versions


@pytest.mark.parametrize(("versions", "config"), [
    (("1",), 'name: "m" this is not a config'),  # does not parse
    ((), ADD_SUB),  # no version directory
])
def test_a_load_that_fails_before_any_version_exists_names_none(
        tmp_path: Path, versions: tuple[str, ...], config: str) -> None:
    """Triton 2.51 fails these at its repository poll: the index shows the name only."""
    with pytest.raises(ShoalError) as info:
        load(make_model(tmp_path, "m", versions, config))
    assert not isinstance(info.value, SourceError)
