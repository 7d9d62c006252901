"""The configured embedders in a real daemon: an OpenAI-compatible endpoint (up, and down
at start), and sentence-transformers with and without the ``semantic`` extra."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import faiss
import pytest
from conftest import DaemonProcess
from daemon_process import entry_with
from tests_support import LESSONS, search
from unit.test_embedders import HAS_SENTENCE_TRANSFORMERS, NEEDS_SEMANTIC, EmbeddingServer

from ctxclient import Client

KEY_VARIABLE = "EMBEDDINGS_TOKEN"


def wait_index(client: Client, state: str, timeout: float = 60) -> dict[str, Any]:
    """The memory index's status once it is in ``state`` (polled)."""
    deadline = time.monotonic() + timeout
    while True:
        index: dict[str, Any] = client.call("daemon.status")["memory_index"]
        if index["state"] == state:
            return index
        assert time.monotonic() < deadline, f"memory index still {index}"
        time.sleep(0.02)


def record_lessons(client: Client) -> list[dict[str, Any]]:
    return [client.call("memory.record", {"title": title, "content": content})
            for title, content in LESSONS[:3]]



def until(condition: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def http_daemon(root: Path, url: str) -> DaemonProcess:
    return DaemonProcess(root, [
        "--memory-embedder", "http", "--memory-embedding-url", url,
        "--memory-embedding-model", "test-model", "--memory-api-key-env", KEY_VARIABLE],
        env={KEY_VARIABLE: "s3cret"})


def test_http_embedder_records_and_searches(daemon_root: Path) -> None:
    with EmbeddingServer(dim=256) as server:
        daemon = http_daemon(daemon_root, server.url).start()
        try:
            with daemon.client() as client:
                index = wait_index(client, "ready")
                assert (index["embedder"], index["reason"]) == (
                    f"http:{server.url}/embeddings:test-model", None)
                recorded = record_lessons(client)
                assert [(r["memory"]["id"], r["indexed"]) for r in recorded] == [
                    (1, True), (2, True), (3, True)]
                assert wait_index(client, "ready")["vectors"] == 3

                found = search(client, "which migration bumps user_version", k=1)
                assert [(r["id"], r["legs"]) for r in found["results"]] == [
                    (2, ["dense", "lexical"])]
                assert (found["legs_used"], found["note"]) == (["dense", "lexical"], None)
                dense = search(client, "coffee machine floor", mode="dense", k=1)
                assert [(r["id"], r["legs"]) for r in dense["results"]] == [(3, ["dense"])]
                assert (dense["legs_used"], dense["note"]) == (["dense"], None)
        finally:
            daemon.stop()
        # Every request carried the model and the key from the named variable; the
        # daemon sent the probe, each recorded memory and each query.
        assert {(r.path, r.authorization, r.body["model"]) for r in server.requests} == {
            ("/v1/embeddings", "Bearer s3cret", "test-model")}
        inputs = [text for r in server.requests for text in r.body["input"]]
        assert inputs == ["dimension probe",
                          *(f"{title}\n{content}" for title, content in LESSONS[:3]),
                          "which migration bumps user_version", "coffee machine floor"]


@contextlib.contextmanager
def indexed_lessons(daemon_root: Path) -> Iterator[tuple[EmbeddingServer, Client, Client]]:
    """The test server, and two connections to a daemon that embeds with it and has
    indexed three lessons."""
    with EmbeddingServer() as server:
        daemon = http_daemon(daemon_root, server.url).start()
        try:
            with daemon.client() as client, daemon.client() as other:
                wait_index(client, "ready")
                record_lessons(client)
                yield server, client, other
        finally:
            assert daemon.stop() == 0


def test_a_search_during_a_rebuild_answers_lexically_without_waiting_for_it(
        daemon_root: Path) -> None:
    with indexed_lessons(daemon_root) as (server, client, other):
        server.hold()  # the rebuild's embedding request waits
        rebuild = threading.Thread(target=other.call, args=("memory.reindex", {}))
        rebuild.start()
        wait_index(client, "rebuilding")
        found = search(client, "coffee machine")
        # Answered while the rebuild still waits for the endpoint; the old index is let
        # go meanwhile.
        index = client.call("daemon.status")["memory_index"]
        assert (index["state"], index["vectors"], index["memories"]) == ("rebuilding", 0, 3)
        assert ([r["id"] for r in found["results"]], found["legs_used"], found["note"]) == (
            [3], ["lexical"],
            "dense leg unavailable (the dense index is being rebuilt); lexical results only")
        server.release()
        rebuild.join()
        assert wait_index(client, "ready")["vectors"] == 3


def test_a_search_does_not_wait_for_the_index_to_add_a_memory(daemon_root: Path) -> None:
    with indexed_lessons(daemon_root) as (server, client, other):
        server.hold("slow")
        recording = threading.Thread(target=other.call, args=(
            "memory.record", {"title": "slow", "content": "a lesson"}))
        recording.start()
        until(lambda: any("slow" in text for r in server.requests[4:]
                          for text in r.body["input"]))  # the index is adding it: held
        found = search(client, "coffee machine floor", mode="dense", k=1)
        # Answered from the index while the memory is still being added.
        assert recording.is_alive()
        assert ([r["id"] for r in found["results"]], found["legs_used"]) == ([3], ["dense"])
        server.release()
        recording.join()


def test_http_endpoint_down_at_start_leaves_search_lexical(daemon_root: Path) -> None:
    with EmbeddingServer() as stopped:
        url = stopped.url
    daemon = http_daemon(daemon_root, url).start()
    try:
        with daemon.client() as client:
            reason = ("the embedder is unavailable: embedding endpoint "
                      f"{url}/embeddings: <urlopen error [Errno 111] Connection refused>")
            assert wait_index(client, "unavailable")["reason"] == reason
            recorded = record_lessons(client)
            assert [(r["memory"]["id"], r["indexed"]) for r in recorded] == [
                (1, False), (2, False), (3, False)]
            found = search(client, "coffee machine")
            assert [(r["id"], r["legs"]) for r in found["results"]] == [(3, ["lexical"])]
            assert (found["mode"], found["legs_used"], found["note"]) == (
                "hybrid", ["lexical"], f"dense leg unavailable ({reason}); lexical results only")
            dense = search(client, "coffee machine", mode="dense")
            assert ([r["id"] for r in dense["results"]], dense["legs_used"]) == ([3], ["lexical"])
    finally:
        assert daemon.stop() == 0


@pytest.mark.skipif(HAS_SENTENCE_TRANSFORMERS, reason="sentence-transformers is installed")
def test_sentence_transformers_without_the_extra_leaves_search_lexical(
        daemon_root: Path) -> None:
    daemon = DaemonProcess(daemon_root, ["--memory-embedder", "sentence-transformers"]).start()
    try:
        with daemon.client() as client:
            index = wait_index(client, "unavailable")
            reason = ("the embedder is unavailable: sentence-transformers is not installed; "
                      "install ctxd with the `semantic` extra")
            assert (index["embedder"], index["reason"]) == (
                "sentence-transformers:all-MiniLM-L6-v2", reason)
            record_lessons(client)
            found = search(client, "coffee machine")
            assert [r["id"] for r in found["results"]] == [3]
            assert found["note"] == f"dense leg unavailable ({reason}); lexical results only"
    finally:
        assert daemon.stop() == 0


@NEEDS_SEMANTIC
def test_packaged_minilm_is_the_default_model(daemon_root: Path) -> None:
    daemon = DaemonProcess(daemon_root, ["--memory-embedder", "sentence-transformers"]).start()
    try:
        with daemon.client() as client:
            index = wait_index(client, "ready", timeout=120)
            assert (index["embedder"], index["reason"]) == (
                "sentence-transformers:all-MiniLM-L6-v2", None)
            record_lessons(client)
            # No word in common with the memory: only the model's sense of meaning finds it.
            found = search(client, "espresso maker location", mode="dense", k=1)
            assert [(r["id"], r["legs"]) for r in found["results"]] == [(3, ["dense"])]
            # Cosine 0.34 (above dense_min_score, 0.2); the next best memory 0.14.
            found = search(client, "upgrading database tables", mode="dense", k=1)
            assert [(r["id"], r["legs"]) for r in found["results"]] == [(2, ["dense"])]
    finally:
        assert daemon.stop() == 0


def test_an_endpoint_that_recovers_brings_the_dense_leg_back(daemon_root: Path) -> None:
    with EmbeddingServer(dim=256) as server:
        server.failure = "status"
        daemon = http_daemon(daemon_root, server.url).start()
        try:
            with daemon.client() as client:
                index = wait_index(client, "unavailable")
                assert index["reason"].startswith("the embedder is unavailable: embedding "
                                                  "endpoint")
                record_lessons(client)
                server.failure = None
                status = client.call("memory.reindex", {})
                assert (status["state"], status["vectors"], status["memories"]) == (
                    "ready", 3, 3)
                found = search(client, "migration user_version", mode="dense", k=1)
                assert ([r["id"] for r in found["results"]], found["note"]) == ([2], None)

                # The endpoint fails while the index is ready: the query is answered
                # lexically and says why; a memory recorded meanwhile is kept in SQLite.
                server.failure = "status"
                found = search(client, "coffee machine")
                assert found["legs_used"] == ["lexical"]
                assert found["note"].startswith("dense leg unavailable (the query could not "
                                                "be embedded: embedding endpoint")
                made = client.call("memory.record", {"title": "Deploys",
                                                     "content": "Deploy on Tuesdays."})
                assert made["memory"]["id"] == 4
                assert client.call("daemon.status")["memory_index"]["state"] == "unavailable"
                server.failure = None
                status = client.call("memory.reindex", {})
                assert (status["state"], status["vectors"], status["memories"]) == (
                    "ready", 4, 4)
                found = search(client, "deploy tuesdays", mode="dense", k=1)
                assert [r["id"] for r in found["results"]] == [4]
        finally:
            assert daemon.stop() == 0


def test_a_rebuild_that_fails_leaves_search_lexical_and_says_why(daemon_root: Path) -> None:
    with indexed_lessons(daemon_root) as (server, client, _):
        server.failure = "status"  # the embedder loaded; the rebuild's reading fails
        status = client.call("memory.reindex", {})
        assert (status["state"], status["reason"].startswith(
            "rebuilding the dense index failed: embedding endpoint ")) == ("unavailable", True)
        found = search(client, "coffee machine")
        assert ([r["id"] for r in found["results"]], found["legs_used"]) == ([3], ["lexical"])
        assert found["note"] == f"dense leg unavailable ({status['reason']}); lexical results only"
        server.failure = None
        status = client.call("memory.reindex", {})
        assert (status["state"], status["vectors"], status["reason"]) == ("ready", 3, None)


def test_an_approximate_index_with_few_memories_keeps_the_daemon_up(
        daemon_root: Path) -> None:
    daemon = DaemonProcess(daemon_root, ["--memory-ann-threshold", "1"]).start()
    try:
        with daemon.client() as client:
            record_lessons(client)
            index = wait_index(client, "ready")
            assert (index["vectors"], index["memories"]) == (3, 3)
            found = search(client, "coffee machine", mode="dense", k=1)
            assert [r["id"] for r in found["results"]] == [3]
    finally:
        assert daemon.stop() == 0


OWNER_TICK_S = 0.2
"""The index owner's idle tick in the daemon of the test below (5 s in ctxd)."""


def test_a_rebuild_may_take_longer_than_the_index_owners_tick(daemon_root: Path) -> None:
    with EmbeddingServer(dim=64) as server:
        daemon = http_daemon(daemon_root, server.url)
        daemon.entry = entry_with({"ctxd.memory._index.TICK_S": OWNER_TICK_S})
        daemon.start()
        try:
            with daemon.client(timeout=60) as client, daemon.client(timeout=60) as other:
                wait_index(client, "ready")
                record_lessons(client)
                server.hold()
                answers: list[dict[str, Any]] = []
                rebuild = threading.Thread(target=lambda: answers.append(
                    other.call("memory.reindex", {})))
                rebuild.start()
                until(lambda: len(server.requests) > 4)  # the rebuild's first, held
                # A real wait on purpose: the rebuild outlasts ticks of the daemon's clock.
                time.sleep(5 * OWNER_TICK_S)
                server.release()
                rebuild.join()
                assert [(status["state"], status["vectors"]) for status in answers] == [
                    ("ready", 3)]
        finally:
            assert daemon.stop() == 0


def test_a_grown_index_is_rebuilt_while_it_answers(daemon_root: Path) -> None:
    with EmbeddingServer(dim=256) as server:
        daemon = DaemonProcess(daemon_root, [
            "--memory-embedder", "http", "--memory-embedding-url", server.url,
            "--memory-embedding-model", "test-model", "--memory-ann-threshold", "20"]).start()
        try:
            with daemon.client(timeout=30) as client:
                wait_index(client, "ready")

                def add(i: int) -> dict[str, Any]:
                    return client.call("memory.record", {  # type: ignore[no-any-return]
                        "title": f"lesson {i}", "content": f"topic{i} notes about subject{i}"})

                def dense_ids(i: int) -> list[int]:  # with the memory's own text
                    found = search(client, f"lesson {i} topic{i} notes about subject{i}",
                                   mode="dense", k=3)
                    assert (found["legs_used"], found["note"]) == (["dense"], None)
                    return [r["id"] for r in found["results"]]

                def rebuilt() -> int:
                    return daemon.log().count("memory index rebuilt as it grew")

                for i in range(1, 31):  # past ann_threshold: rebuilt approximate (1 list)
                    add(i)
                until(lambda: rebuilt() == 1 and wait_index(client, "ready")["vectors"] == 30)
                # 78 memories call for 2 lists: the next rebuild's reading waits.
                server.hold("topic1 notes")
                server.requests.clear()
                for i in range(31, 79):
                    add(i)
                # The rebuild's first batch (one memory's add is one text).
                until(lambda: any(len(r.body["input"]) > 1 for r in server.requests))
                # Meanwhile the index answers, takes a new memory and loses a deleted one.
                assert dense_ids(8)[:1] == [8]
                assert add(79)["indexed"] is True
                assert dense_ids(79)[:1] == [79]
                client.call("memory.delete", {"id": 9})
                assert 9 not in dense_ids(9)
                assert (rebuilt(), client.call("daemon.status")["memory_index"]["state"]) == (
                    1, "ready")
                server.release()
                until(lambda: rebuilt() == 2)
                index = wait_index(client, "ready")
                assert (index["vectors"], index["memories"]) == (78, 78)
                assert (dense_ids(8)[:1], dense_ids(79)[:1]) == ([8], [79])
                assert 9 not in dense_ids(9)
        finally:
            assert daemon.stop() == 0
        assert ("rebuilt as it grew: 78 vectors, 2 lists (was 1 lists; 78 memories"
                in daemon.log())
        saved = faiss.read_index(str(daemon.data_dir / "memory.faiss"))
        assert (saved.nlist, saved.ntotal) == (2, 78)
