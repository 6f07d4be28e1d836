"""Guided decoding in the executor (xgrammar): outputs of a random-weight byte-level model held
to a JSON schema, any JSON, a regex and an EBNF grammar, greedy and sampled; guided and free
requests in the same iterations; returned sequences each guided; a bad guide fails its request
at enqueue; combinations guided decoding cannot serve are refused; grammars compiled once per
guide (LRU); a guided output cut by max_tokens ends with LENGTH."""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from shoal.llm import Executor, ExecutorConfig, FinishReason, Request, Result
from shoal.llm import SamplingConfig as Sampling
from shoal.llm.checkpoint import load_tokenizer
from shoal.llm.guided import GuidedDecodingConfig, GuidedDecodingParams, GuideType
from shoal.llm.guided.decoder import GuidedDecoder
from shoal.llm.tiny_checkpoint import EOS_ID, TinyLlamaSpec, build_tiny_llama
from tests.llm.conftest import collect

pytest.importorskip("xgrammar")

SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 999},
    "ok": {"type": "boolean"},
    "color": {"enum": ["red", "green", "blue"]}},
    "required": ["id", "ok", "color"]}
REGEX = r"[a-z]{3}-[0-9]{2}"
# pairs like x=7 or [x=7,y=42]; PAIRS is the same language as a Python regex
EBNF = '''root ::= pair | "[" pair ("," pair)? "]"
pair ::= key "=" value
key ::= "x" | "y"
value ::= [0-9] [0-9]?'''
PAIR = r"[xy]=[0-9]{1,2}"
PAIRS = rf"{PAIR}|\[{PAIR}(?:,{PAIR})?\]"
SEEDS = range(6)


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("tiny-byte-llama")
    build_tiny_llama(path, TinyLlamaSpec(vocab_size=400, tokenizer="byte_level"))
    return path


@pytest.fixture(scope="module")
def tokenizer(byte_model: pathlib.Path) -> Any:
    return load_tokenizer(byte_model)


@pytest.fixture(scope="module")
def executor(byte_model: pathlib.Path, tokenizer: Any) -> Iterator[Executor]:
    config = ExecutorConfig(
        guided_decoding_config=GuidedDecodingConfig.from_tokenizer(tokenizer, [EOS_ID]))
    with Executor(byte_model, config) as made:
        yield made


def guided(guide_type: GuideType, guide: str | None = None) -> GuidedDecodingParams:
    return GuidedDecodingParams(guide_type, guide)


def sampled(seed: int) -> Sampling:
    return Sampling(top_k=0, top_p=1.0, temperature=1.0, seed=seed)


def run(executor: Executor, requests: list[Request]) -> list[Result]:
    """The final result of each request (non-streaming)."""
    ids = executor.enqueue_requests(requests)
    got = collect(executor, ids, timeout=120)
    finals = []
    for request_id in ids:
        responses = got[request_id]
        assert not responses[-1].has_error(), responses[-1].error_msg
        result = responses[-1].result
        assert result is not None and result.is_final
        finals.append(result)
    return finals


def texts(executor: Executor, tokenizer: Any, params: GuidedDecodingParams | None,
          samplings: list[Sampling], max_tokens: int = 120,
          prompt: str = "Hello world") -> list[tuple[str, FinishReason]]:
    ids = tokenizer.encode(prompt).ids
    requests = [Request(ids, max_tokens, end_id=EOS_ID, sampling_config=s,
                        guided_decoding_params=params) for s in samplings]
    return [(tokenizer.decode(r.output_token_ids[0][len(ids):]), r.finish_reasons[0])
            for r in run(executor, requests)]


def all_samplings() -> list[Sampling]:
    return [Sampling(), *(sampled(seed) for seed in SEEDS)]


# ------------------------------------------------------------------ outputs follow the guide


def test_json_schema_outputs_parse_and_validate(executor: Executor, tokenizer: Any) -> None:
    outputs = texts(executor, tokenizer, guided(GuideType.JSON_SCHEMA, json.dumps(SCHEMA)),
                    all_samplings())
    for text, reason in outputs:
        assert reason is FinishReason.END_ID, text
        jsonschema.validate(json.loads(text), SCHEMA)
    assert len({text for text, _ in outputs}) > 1  # sampling varies within the schema


def test_json_outputs_that_end_parse(executor: Executor, tokenizer: Any) -> None:
    """Any JSON: a random model wanders in strings, so not every output closes within
    max_tokens; each that does parses (and is an object or array, xgrammar's JSON root)."""
    samplings = [sampled(seed) for seed in range(12)]
    outputs = texts(executor, tokenizer, guided(GuideType.JSON), samplings, 160)
    ended = [text for text, reason in outputs if reason is FinishReason.END_ID]
    assert ended, outputs
    for text in ended:
        assert isinstance(json.loads(text), dict | list)


def test_regex_outputs_fullmatch(executor: Executor, tokenizer: Any) -> None:
    for text, reason in texts(executor, tokenizer, guided(GuideType.REGEX, REGEX),
                              all_samplings()):
        assert reason is FinishReason.END_ID
        assert re.fullmatch(REGEX, text), text


def test_ebnf_outputs_parse_by_the_grammar(executor: Executor, tokenizer: Any) -> None:
    outputs = texts(executor, tokenizer, guided(GuideType.EBNF_GRAMMAR, EBNF), all_samplings())
    for text, reason in outputs:
        assert reason is FinishReason.END_ID
        assert re.fullmatch(PAIRS, text), text


def test_each_returned_sequence_follows_the_guide(executor: Executor, tokenizer: Any) -> None:
    ids = tokenizer.encode("one, two").ids
    request = Request(ids, 60, end_id=EOS_ID, sampling_config=Sampling(
        top_k=0, top_p=1.0, seed=3, num_return_sequences=4),
        guided_decoding_params=guided(GuideType.REGEX, REGEX))
    request_id = executor.enqueue_request(request)
    finals = {}
    for response in collect(executor, [request_id])[request_id]:
        assert response.result is not None
        if response.result.is_sequence_final:
            finals[response.result.sequence_index] = response.result
    assert sorted(finals) == [0, 1, 2, 3]
    outputs = {tokenizer.decode(r.output_token_ids[0][len(ids):]) for r in finals.values()}
    assert all(re.fullmatch(REGEX, text) for text in outputs), outputs
    assert len(outputs) > 1


def test_streamed_guided_output_is_the_whole_output(executor: Executor,
                                                    tokenizer: Any) -> None:
    ids = tokenizer.encode("Hello world").ids
    params = guided(GuideType.JSON_SCHEMA, json.dumps(SCHEMA))
    whole = run(executor, [Request(ids, 120, end_id=EOS_ID, guided_decoding_params=params)])[0]
    request_id = executor.enqueue_request(Request(ids, 120, end_id=EOS_ID, streaming=True,
                                                  guided_decoding_params=params))
    pieces = [r.result.output_token_ids[0] for r in collect(executor, [request_id])[request_id]
              if r.result is not None]
    assert len(pieces) > 1
    assert [t for piece in pieces for t in piece] == whole.output_token_ids[0][len(ids):]


# ------------------------------------------------------------------ guided and free together


def test_guided_and_free_requests_share_iterations(executor: Executor, tokenizer: Any) -> None:
    ids = tokenizer.encode("The quick brown fox").ids
    alone = run(executor, [Request(ids, 40, end_id=EOS_ID)])[0]
    params = guided(GuideType.JSON_SCHEMA, json.dumps(SCHEMA))
    mixed = run(executor, [
        Request(ids, 40, end_id=EOS_ID, guided_decoding_params=params),
        Request(ids, 40, end_id=EOS_ID),
        Request(ids, 40, end_id=EOS_ID, sampling_config=sampled(1),
                guided_decoding_params=guided(GuideType.REGEX, REGEX))])
    assert mixed[1].output_token_ids == alone.output_token_ids  # no mask leaked onto it
    schema_text = tokenizer.decode(mixed[0].output_token_ids[0][len(ids):])
    jsonschema.validate(json.loads(schema_text), SCHEMA)
    assert re.fullmatch(REGEX, tokenizer.decode(mixed[2].output_token_ids[0][len(ids):]))
    assert alone.output_token_ids != mixed[0].output_token_ids


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(("params", "message"), [
    (guided(GuideType.JSON_SCHEMA, '{"type": 5}'), "invalid JSON schema"),
    (guided(GuideType.JSON_SCHEMA, "not json"), "invalid JSON schema: not JSON"),
    (guided(GuideType.JSON_SCHEMA, "[1]"), "a schema is a JSON object"),
    (guided(GuideType.REGEX, "[a-"), "invalid regular expression"),
    (guided(GuideType.EBNF_GRAMMAR, "root ::= missing"), "invalid EBNF grammar"),
    (guided(GuideType.REGEX), "needs a guide"),
    (guided(GuideType.STRUCTURAL_TAG, '{"structures": 1, "triggers": []}'),
     "invalid structural tag"),
])
def test_a_bad_guide_fails_its_request_at_enqueue(executor: Executor,
                                                  params: GuidedDecodingParams,
                                                  message: str) -> None:
    bad = Request([5, 6, 7], 8, end_id=EOS_ID, guided_decoding_params=params)
    problem = executor.check_request(bad)
    assert problem is not None and problem.startswith("guided_decoding_params.guide: ")
    assert message in problem and ".cc:" not in problem  # no C++ source location
    bad_id, good_id = executor.enqueue_requests([bad, Request([5, 6, 7], 4, end_id=EOS_ID)])
    got = collect(executor, [bad_id, good_id])
    assert [r.error_msg for r in got[bad_id]] == [problem]
    good = got[good_id][-1].result
    assert good is not None and good.is_final


@pytest.mark.parametrize(("changes", "message"), [
    ({"sampling_config": Sampling(2)}, "beam search"),
    ({"end_id": None}, "needs end_id"),
    ({"bad_words": [[9]]}, "bad_words"),
    ({"sampling_config": Sampling(min_tokens=2)}, "min_tokens"),
])
def test_combinations_guided_decoding_cannot_serve_are_refused(
        byte_model: pathlib.Path, tokenizer: Any, changes: dict[str, Any],
        message: str) -> None:
    config = ExecutorConfig(max_beam_width=2, guided_decoding_config=(
        GuidedDecodingConfig.from_tokenizer(tokenizer, [EOS_ID])))
    with Executor(byte_model, config) as beams:
        fields: dict[str, Any] = {"end_id": EOS_ID,
                                  "guided_decoding_params": guided(GuideType.JSON)} | changes
        problem = beams.check_request(Request([5, 6, 7], 8, **fields))
    assert problem is not None and message in problem


def test_guided_requests_are_refused_without_a_guided_config(
        byte_model: pathlib.Path, make_executor: Callable[..., Executor]) -> None:
    plain = make_executor(byte_model)
    problem = plain.check_request(Request([5, 6], 4, end_id=EOS_ID,
                                          guided_decoding_params=guided(GuideType.JSON)))
    assert problem is not None and "guided decoding is off" in problem
    assert plain.check_request(Request([5, 6], 4, end_id=EOS_ID)) is None


# ------------------------------------------------------------------ grammar cache, cut output


def test_grammars_compile_once_per_guide_in_a_bounded_lru(tokenizer: Any) -> None:
    decoder = GuidedDecoder(GuidedDecodingConfig.from_tokenizer(tokenizer, [EOS_ID]), 400,
                            cache_capacity=2)
    cache = decoder.grammars
    a, b, c = (guided(GuideType.REGEX, r) for r in ("a+", "b+", "c+"))
    cache.get(a)
    cache.get(a)
    assert cache.compilations == 1
    cache.get(b)
    cache.get(a)  # a is now the most recently used
    cache.get(c)  # evicts b
    assert (len(cache), cache.compilations) == (2, 3)
    cache.get(a)
    assert cache.compilations == 3
    cache.get(b)
    assert cache.compilations == 4


def test_output_cut_by_max_tokens_ends_with_length(executor: Executor, tokenizer: Any) -> None:
    [(text, reason)] = texts(executor, tokenizer, guided(GuideType.JSON_SCHEMA,
                                                         json.dumps(SCHEMA)), [Sampling()], 4)
    assert reason is FinishReason.LENGTH
    assert text.startswith("{") and len(tokenizer.encode(text).ids) <= 4
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_vocabulary_padding_is_never_allowed(tokenizer: Any) -> None:
    """Logits wider than the tokenizer (padded model vocabularies): the ids past the
    vocabulary, and special tokens, stay at -inf."""
    import torch

    from shoal.llm.sequence import RequestState

    width = 416
    decoder = GuidedDecoder(GuidedDecodingConfig.from_tokenizer(tokenizer, [EOS_ID]), width)
    state = RequestState(1, Request([5], 8, end_id=EOS_ID,
                                    guided_decoding_params=guided(GuideType.JSON)), 0.0)
    masked = decoder.constrain(state, state.active, torch.zeros(1, width))
    allowed = torch.isfinite(masked[0]).nonzero().flatten().tolist()
    assert allowed and max(allowed) < 400
    assert not {0, 1, EOS_ID} & set(allowed)  # specials; the end id only once JSON is whole


def test_bitmask_unpacks_to_token_order() -> None:
    import torch

    generator = torch.Generator().manual_seed(0)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, 4), dtype=torch.int32, generator=generator)
    allowed = GuidedDecoder._allowed(bitmask, 120)  # 4 words = 128 bits, 120 used
    expected = [[bool((int(bitmask[r, t // 32]) >> (t % 32)) & 1) for t in range(120)]
                for r in range(3)]
    assert allowed.tolist() == expected
    assert GuidedDecoder._allowed(bitmask, 130)[:, 128:].tolist() == [[False, False]] * 3


def test_a_tokenizer_larger_than_the_model_is_cut_to_the_model(tokenizer: Any) -> None:
    config = GuidedDecodingConfig.from_tokenizer(tokenizer, [EOS_ID])
    assert config.encoded_vocab is not None and len(config.encoded_vocab) == 400
    decoder = GuidedDecoder(config, 390)  # ten tokenizer ids the model does not have
    decoder.grammars.get(guided(GuideType.REGEX, "[a-z]+"))
