"""Memory against a real daemon: record, search (lexical, dense, hybrid), signals, deletes,
restarts, a corrupt index, injection into branches, secrets."""

from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path
from typing import Any

import apsw
import faiss
import numpy as np
from conftest import DaemonProcess
from tests_support import COUNTER, LESSONS, hello_text, next_event, rpc_error, search

from ctxclient import Client, RpcError
from ctxd.memory import HashingEmbedder
from ctxd.memory._queries import embedding_text


def record(client: Client, title: str, content: str, **extra: Any) -> dict[str, Any]:
    return client.call("memory.record", {"title": title, "content": content, **extra})  # type: ignore[no-any-return]


def found_soon(client: Client, query: str, scope: str, timeout: float = 10
               ) -> list[dict[str, Any]]:
    """The lexical results of a search that finds something within ``timeout`` (an
    extracted memory is promoted in the background), else the last, empty, ones."""
    deadline = time.monotonic() + timeout
    while True:
        results: list[dict[str, Any]] = search(client, query, scope=scope,
                                               mode="lexical")["results"]
        if results or time.monotonic() > deadline:
            return results
        time.sleep(0.05)


def return_with_lesson(client: Client, session_id: str, project: str, description: str,
                       message: str) -> str:
    """A branch in a new session of ``project`` returned with ``extract_memory``; its id."""
    client.call("session.open", {"session_id": session_id, "project": project})
    branch_id: str = client.call("branch.create", {"session_id": session_id,
                                                   "description": description,
                                                   "prompt": "find it"})["branch_id"]
    client.call("branch.return", {"branch_id": branch_id, "extract_memory": True,
                                  "message": message})
    return branch_id


def wait_index_ready(client: Client, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        index = client.call("daemon.status")["memory_index"]
        ready = index["state"] == "ready" and index["lexical"] == "ready"
        assert index["whole"] == (ready and index["vectors"] == index["memories"])
        if index["whole"] or time.monotonic() > deadline:
            return index  # type: ignore[no-any-return]
        time.sleep(0.02)


def test_record_search_rate_delete(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        wait_index_ready(client)  # else a dense search answers lexical-only, with a note
        ids = [record(client, title, content, scope="project:demo" if i == 0 else "global",
                      tags=["testing"] if i == 0 else [])["memory"]["id"]
               for i, (title, content) in enumerate(LESSONS)]
        assert ids == [1, 2, 3, 4]
        got = client.call("memory.get", {"id": 1})["memory"]
        assert {k: got[k] for k in ("scope", "title", "content", "outcome", "tags",
                                    "confidence", "usage_count", "source")} == {
            "scope": "project:demo", "title": LESSONS[0][0], "content": LESSONS[0][1],
            "outcome": "success", "tags": ["testing"], "confidence": 0.8, "usage_count": 0,
            "source": None}
        found = search(client, "why does the migration test fail", k=2)
        assert [r["id"] for r in found["results"]] == [2, 1]
        assert found["results"][0]["legs"] == ["dense", "lexical"]
        assert (found["mode"], found["legs_used"], found["note"]) == (
            "hybrid", ["dense", "lexical"], None)
        lexical = search(client, "coffee", mode="lexical")
        assert [(r["id"], r["legs"]) for r in lexical["results"]] == [(3, ["lexical"])]
        dense = search(client, "coffee machine floor", mode="dense", k=1)
        assert [(r["id"], r["legs"]) for r in dense["results"]] == [(3, ["dense"])]
        # A project scope sees its own memories and the global ones; "global" only those.
        assert {r["id"] for r in search(client, "test", scope="project:demo", k=10)[
            "results"]} == {1, 2}
        assert {r["id"] for r in search(client, "test", scope="global", k=10)[
            "results"]} == {2}
        assert search(client, "test", scope="project:other", k=10)["results"][0]["id"] == 2

        rated = client.call("memory.feedback", {"id": 2, "helpful": True})["memory"]
        assert rated["confidence"] == round(5 / 6, 6)
        rated = client.call("memory.outcome", {"id": 2, "succeeded": False})["memory"]
        assert rated["confidence"] == round(5 / 7, 6)
        assert search(client, "migration", min_confidence=0.75)["results"] == []
        client.call("memory.feedback", {"id": 3, "helpful": False})
        assert client.call("memory.get", {"id": 3})["memory"]["confidence"] == round(4 / 6, 6)

        assert client.call("memory.delete", {"id": 2}) == {"id": 2, "deleted": True}
        for mode in ("lexical", "dense", "hybrid"):
            assert 2 not in [r["id"] for r in search(client, "migration user_version",
                                                     mode=mode, k=10)["results"]]
        error = rpc_error(client, "memory.get", {"id": 2})
        assert (error.code, error.message, error.data["memory_id"]) == (
            -32004, "unknown memory 2", 2)
        assert rpc_error(client, "memory.delete", {"id": 2}).code == -32004
        assert rpc_error(client, "memory.feedback", {"id": 2, "helpful": True}).code == -32004
        listed = client.call("memory.list", {"limit": 2})
        assert ([m["id"] for m in listed["memories"]], listed["next_cursor"]) == ([1, 3], "3")
        rest = client.call("memory.list", {"limit": 2, "cursor": "3"})
        assert ([m["id"] for m in rest["memories"]], rest["next_cursor"]) == ([4], None)
        status = client.call("daemon.status")
        assert (status["memories"], status["memory_index"]["vectors"]) == (3, 3)


def test_secrets_in_memories_are_redacted(shared_daemon: DaemonProcess) -> None:
    with shared_daemon.client() as client:
        made = record(client, "deploy with AKIAIOSFODNN7EXAMPLE",
                      "export GITHUB_TOKEN=ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8 then deploy",
                      description="password=hunter2hunter2")
        memory = made["memory"]
        assert made["secrets_scrubbed"] == 3
        assert memory["title"] == "deploy with [REDACTED:aws_access_key_id]"
        assert "ghp_" not in memory["content"]
        assert "hunter2" not in memory["description"]
        assert search(client, "hunter2hunter2", mode="lexical")["results"] == []


def test_index_survives_restarts_and_deletes(daemon: DaemonProcess) -> None:
    queries = [content for _, content in LESSONS]

    def dense_ids(client: Client) -> list[list[int]]:
        return [[r["id"] for r in search(client, query, mode="dense", k=10)["results"]]
                for query in queries]

    with daemon.client() as client:
        wait_index_ready(client)
        for title, content in LESSONS:
            record(client, title, content)
        client.call("memory.delete", {"id": 3})
        lexical = search(client, "tests migration coffee rebase", mode="lexical", k=10)
        dense = dense_ids(client)
    # Each lesson's own text finds it first; the deleted one is found by nobody (nor is
    # anything else close enough to its text).
    assert [ids[:1] for ids in dense] == [[1], [2], [], [4]]
    assert all(3 not in ids for ids in dense)
    daemon.stop()
    daemon.start()
    with daemon.client() as client:
        index = wait_index_ready(client)
        assert (index["state"], index["vectors"], index["memories"], index["lexical"]) == (
            "ready", 3, 3, "ready")
        assert search(client, "tests migration coffee rebase", mode="lexical",
                      k=10) == lexical
        assert sorted(r["id"] for r in lexical["results"]) == [1, 2, 4]
        assert dense_ids(client) == dense
    assert "memory index loaded: 3 vectors" in daemon.log()


def test_the_lexical_ranking_starts_from_its_file_checked_against_the_database(
        daemon: DaemonProcess) -> None:
    # Saved at shutdown, the file gives the next start every memory without tokenizing;
    # after a kill it is older than the database: what changed since is tokenized or
    # dropped, and the ranking is the one a start without the file makes.
    rng = random.Random(8)
    words = "tests migration coffee rebase timezone cache docker flaky pin retry".split()

    def text() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(3, 9)))

    queries = [" ".join(words[i:i + 3]) for i in range(0, 9)]

    def ranked(client: Client) -> list[Any]:
        return [[(r["id"], r["score"]) for r in search(client, query, mode="lexical", k=20,
                                                      scope=scope)["results"]]
                for query in queries for scope in ("project:a", "global")]

    def loaded(line_number: int) -> str:
        return [line for line in daemon.log().splitlines()
                if "lexical ranking loaded" in line][line_number]

    with daemon.client() as client:
        wait_index_ready(client)
        for i in range(30):
            record(client, text(), text(), scope="project:a" if i % 3 else "global")
        assert wait_index_ready(client)["whole"]
        before = ranked(client)
    daemon.stop()
    mirror_file = daemon.data_dir / "memory-lexical.npz"
    assert mirror_file.exists()
    daemon.start()
    with daemon.client() as client:
        assert wait_index_ready(client)["whole"]
        assert ranked(client) == before
        for _ in range(5):
            record(client, text(), text(), scope="project:a")
        for memory_id in (2, 7):
            client.call("memory.delete", {"id": memory_id})
        after = ranked(client)
    assert "30 memories from memory-lexical.npz, 0 tokenized" in loaded(1)
    daemon.kill()  # the file still holds the 30
    daemon.start()
    with daemon.client() as client:
        assert wait_index_ready(client)["whole"]
        assert ranked(client) == after
    assert "28 memories from memory-lexical.npz, 5 tokenized" in loaded(2)
    daemon.stop()
    mirror_file.write_bytes(mirror_file.read_bytes()[:1000])  # damaged: refused, not used
    daemon.start()
    with daemon.client() as client:
        assert wait_index_ready(client)["whole"]
        assert ranked(client) == after
    assert "lexical ranking file" in daemon.log()
    assert "is not usable" in daemon.log()
    assert (daemon.data_dir / "memory-lexical.npz.unusable").exists()  # set aside
    assert "0 memories from memory-lexical.npz, 33 tokenized" in loaded(3)
    assert sum(len(hits) for hits in after) > 100  # the queries do find memories


def test_a_corrupt_index_file_is_rebuilt(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        # Recorded into a ready index, so that the search below is the dense leg's and
        # the stop saves the file (an index still being built when the daemon stops is
        # not saved: the next start rebuilds it).
        wait_index_ready(client)
        for title, content in LESSONS:
            record(client, title, content)
        expected = search(client, "migration user_version", mode="dense", k=2)
        assert (expected["note"], [r["id"] for r in expected["results"]]) == (None, [2])
    daemon.stop()
    index_file = daemon.data_dir / "memory.faiss"
    assert index_file.stat().st_size > 0
    index_file.write_bytes(b"\x00garbage" * 100)
    daemon.start()
    with daemon.client() as client:
        index = wait_index_ready(client)
        assert (index["state"], index["vectors"]) == ("ready", 4)
        assert search(client, "migration user_version", mode="dense", k=2) == expected
    log = daemon.log()
    assert f"memory index file {index_file} is corrupt (its checksum is " in log
    assert "memory index rebuilt: 4 vectors" in log


def wait_index_holds(client: Client, vectors: int, timeout: float = 20) -> dict[str, Any]:
    """The index's status once it is ready and holds ``vectors`` vectors (or at the
    timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        index = wait_index_ready(client, timeout)
        if index["vectors"] == vectors or time.monotonic() > deadline:
            return index
        time.sleep(0.02)


def test_a_stale_index_file_is_rebuilt(daemon: DaemonProcess, tmp_path: Path) -> None:
    with daemon.client() as client:
        record(client, *LESSONS[0])
        # Indexed before the stop, which saves the index: a stop while the memory is being
        # embedded abandons that (the file is then left to the next start's rebuild).
        assert wait_index_holds(client, 1)["vectors"] == 1
    daemon.stop()
    saved = (daemon.data_dir / "memory.faiss").read_bytes()
    saved_meta = (daemon.data_dir / "memory.json").read_text()
    daemon.start()
    with daemon.client() as client:
        record(client, *LESSONS[1])
    daemon.kill()
    # The older file (one vector, an older generation) comes back, as after a crash.
    (daemon.data_dir / "memory.faiss").write_bytes(saved)
    (daemon.data_dir / "memory.json").write_text(saved_meta)
    daemon.start()
    with daemon.client() as client:
        index = wait_index_ready(client)
        assert (index["state"], index["vectors"], index["memories"]) == ("ready", 2, 2)
        assert [r["id"] for r in search(client, "migration user_version", mode="dense",
                                        k=1)["results"]] == [2]
    assert "memory index file is stale; rebuilding" in daemon.log()


def injected_message(client: Client, session_id: str, branch_id: str) -> dict[str, Any]:
    listed = client.call("message.list", {"session_id": session_id, "branch_id": branch_id,
                                          "limit": 3})
    return listed["messages"][1]  # type: ignore[no-any-return]


def test_injection_fits_twenty_percent_of_the_budget_exactly(
        shared_daemon: DaemonProcess) -> None:
    with shared_daemon.client() as client:
        long_lesson = "When the migration test fails, check user_version. " * 12
        for i in range(12):
            record(client, f"migration lesson {i}", f"{i}: {long_lesson}",
                   scope="project:inject")
        record(client, "Low confidence migration lesson", "migration " + long_lesson,
               scope="project:inject")
        low = client.call("memory.list", {"scope": "project:inject", "limit": 100})[
            "memories"][-1]["id"]
        for _ in range(3):
            client.call("memory.feedback", {"id": low, "helpful": False})
        client.call("session.open", {"session_id": "inject1", "project": "inject"})
        created = client.call("branch.create", {
            "session_id": "inject1", "description": "fix the failing migration test",
            "prompt": "The migration test fails. Fix it.", "budget": 2000})
        injection = created["injection"]
        assert (injection["status"], injection["budget"]) == ("injected", 400)
        message = injected_message(client, "inject1", created["branch_id"])
        tokens = COUNTER.message_tokens("user", message["content"])
        assert injection["tokens"] == message["tokens"] == tokens
        assert tokens <= 400
        items = created["injected_context"]
        assert 1 <= len(items) <= 10
        header = COUNTER.message_tokens(
            "user", "Memories from earlier work that may help with this sub-task:\n")
        assert header + sum(item["tokens"] for item in items) == tokens
        # Each item carries its memory's text, which the branch's opening shows.
        for item in items:
            memory = client.call("memory.get", {"id": item["id"]})["memory"]
            assert (item["type"], item["title"], item["content"]) == (
                "memory", memory["title"], memory["content"])
            assert f"{item['title']} (confidence" in message["content"]
        assert low not in [item["id"] for item in items]
        # One more item would not have fitted: each costs about the same.
        assert tokens + min(item["tokens"] for item in items) > 400
        opening = client.call("message.list", {"session_id": "inject1",
                                               "branch_id": created["branch_id"]})["messages"]
        assert created["budget_used"] == sum(m["tokens"] for m in opening)
        used = client.call("memory.get", {"id": items[0]["id"]})["memory"]
        assert used["usage_count"] == 1
        without = client.call("branch.create", {
            "session_id": "inject1", "description": "fix the failing migration test",
            "prompt": "The migration test fails.", "inject_memories": False,
            "parent_branch_id": None})
        assert (without["injected_context"], without["injection"]["status"]) == (
            [], "disabled")


def content_tokens(daemon: DaemonProcess) -> dict[int, int | None]:
    """Each memory's content tokens as SQLite keeps them."""
    database = apsw.Connection(str(daemon.data_dir / "ctxd.db"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return dict(database.execute("SELECT id, content_tokens FROM memories").fetchall())
    finally:
        database.close()


def test_a_memory_s_content_tokens_are_counted_once_and_kept(daemon: DaemonProcess) -> None:
    # Recorded: counted then. Extracted from a branch: counted when first injected, in the
    # injecting branch's own commit. Either way the injected blocks' counts stay exact.
    recorded = "Run the migration tests with the project's venv, not the system Python."
    extracted = "Migrations must bump user_version, or the migration test fails."
    with daemon.client() as client:
        recorded_id = record(client, "migration tests need the venv", recorded,
                             scope="project:counted")["memory"]["id"]
        return_with_lesson(client, "counted1", "counted", "why the migration test fails",
                           extracted)
        [hit] = found_soon(client, "user_version bump", "project:counted")
        extracted_id = hit["id"]
        for _ in range(2):  # 0.6 to 5/7: past injection's 0.7
            client.call("memory.feedback", {"id": extracted_id, "helpful": True})
        assert content_tokens(daemon) == {recorded_id: COUNTER.count(f" {recorded}\n"),
                                          extracted_id: None}
        created = client.call("branch.create", {
            "session_id": "counted1", "description": "fix the failing migration test",
            "prompt": "The migration test fails: user_version, venv?"})
        items = {item["id"]: item["tokens"] for item in created["injected_context"]}
        assert sorted(items) == sorted([recorded_id, extracted_id])
        message = injected_message(client, "counted1", created["branch_id"])
        assert created["injection"]["tokens"] == COUNTER.message_tokens(
            "user", message["content"])
        assert items[extracted_id] == COUNTER.count(
            f"- why the migration test fails (confidence 0.71): {extracted}\n")
    kept = {recorded_id: COUNTER.count(f" {recorded}\n"),
            extracted_id: COUNTER.count(f" {extracted}\n")}
    assert content_tokens(daemon) == kept
    daemon.stop()
    daemon.start()
    with daemon.client() as client:
        wait_index_ready(client)
        again = client.call("branch.create", {
            "session_id": "counted1", "description": "fix the failing migration test",
            "prompt": "The migration test fails: user_version, venv?",
            "parent_branch_id": None})
        assert {i["id"] for i in again["injected_context"]} == set(kept)
        message = injected_message(client, "counted1", again["branch_id"])
        assert again["injection"]["tokens"] == COUNTER.message_tokens(
            "user", message["content"])
        # Counted for a branch that nothing fitted: kept all the same.
        too_long = "Zebrafish migrations must bump user_version; " * 20
        return_with_lesson(client, "counted2", "counted", "the long migration lesson",
                           too_long)
        [long_hit] = found_soon(client, "zebrafish", "project:counted")
        for _ in range(2):
            client.call("memory.feedback", {"id": long_hit["id"], "helpful": True})
        small = client.call("branch.create", {
            "session_id": "counted1", "description": "fix the failing migration test",
            "prompt": "The zebrafish migration lesson: user_version?", "budget": 160,
            "parent_branch_id": None})
        assert (small["injection"]["status"], small["injected_context"]) == ("none_found", [])
    assert content_tokens(daemon) == {**kept,
                                      long_hit["id"]: COUNTER.count(f" {too_long.rstrip()}\n")}


FLAKY = ("pytest flaky fixture", "Run the tests with -p no:randomly when the tmp_path "
         "fixture is flaky; it is a test order issue.")
FLAKY_BLOCK = ("Memories from earlier work that may help with this task:\n"
               f"- {FLAKY[0]} (confidence 0.80): {FLAKY[1]}\n")


def test_a_memory_goes_only_beside_prompts_that_share_its_uncommon_words(
        daemon_root: Path) -> None:
    floor = DaemonProcess(daemon_root, name="floor").start()
    anything = DaemonProcess(daemon_root, ["--memory-inject-shared-words", "0"],
                             name="anything", data=daemon_root / "anything").start()
    prompts = ("run it", "Is this a good test of the weather?", "the fixture is flaky again")
    try:
        with floor.client() as strict, anything.client() as loose:
            ids = {record(client, *FLAKY)["memory"]["id"] for client in (strict, loose)}
            got = {(name, prompt): client.call("memory.context", {"query": prompt})
                   for name, client in (("floor", strict), ("anything", loose))
                   for prompt in prompts}
            # A branch: its description and prompt share one of their uncommon words.
            strict.call("session.open", {"session_id": "floor1", "project": "birds"})
            created = strict.call("branch.create", {
                "session_id": "floor1", "description": "list the weather station's fixtures",
                "prompt": "Which fixtures does the weather station hold?"})
            about = strict.call("branch.create", {
                "session_id": "floor1", "description": "why is the fixture flaky",
                "prompt": "Find why the fixture is flaky.", "parent_branch_id": None})
            # Rated down below injection's 0.7: the reason names it, and how to raise it.
            rated = strict.call("memory.feedback", {"id": min(ids), "helpful": False})
            below = strict.call("memory.context", {"query": prompts[2]})["injection"]
            strict.call("memory.feedback", {"id": min(ids), "helpful": True})  # above again
            # Given to a session already: the reason says so, though retrieval also found
            # a memory the floor keeps out (it shares one of the two uncommon words).
            weather = record(strict, "weather station fixture",
                             "The station's fixture is read hourly.")
            strict.call("session.open", {"session_id": "floor2"})
            given = [strict.call("memory.context", {
                "query": prompts[2], "session_id": "floor2"}) for _ in range(2)]
            found = {hit["id"] for hit in search(strict, prompts[2], k=10)["results"]}
            # A long prompt: its first 8 uncommon words named.
            long_prompt = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet "
                           "and the fixture")
            long_reason = strict.call("memory.context", {"query": long_prompt})["injection"]
    finally:
        floor.stop()
        anything.stop()
    [memory_id] = ids  # each daemon's first memory
    none = {"status": "none_found", "tokens": 0, "budget": 1000}
    assert got["floor", "run it"] == {"text": None, "tokens": 0, "items": [], "injection": {
        **none, "reason": "the prompt has no uncommon word to match memories by"}}
    assert got["floor", prompts[1]] == {"text": None, "tokens": 0, "items": [], "injection": {
        **none, "reason": "no memory shares the prompt's one uncommon word (weather; "
                          "[memory] inject_shared_words)"}}
    for name, prompt in [("floor", prompts[2]), *(("anything", p) for p in prompts)]:
        answer = got[name, prompt]
        assert (answer["text"], [item["id"] for item in answer["items"]]) == (
            FLAKY_BLOCK, [memory_id]), (name, prompt)
        assert answer["tokens"] == COUNTER.message_tokens("user", FLAKY_BLOCK)
    assert (created["injected_context"], created["injection"]["status"],
            created["injection"]["reason"]) == (
        [], "none_found", "no memory shares 2 of the prompt's 4 uncommon words (weather, "
                          "station, fixtures, hold; [memory] inject_shared_words)")
    assert [item["id"] for item in about["injected_context"]] == [memory_id]
    assert [item["id"] for item in given[0]["items"]] == [memory_id]
    assert (given[1]["text"], given[1]["injection"]["reason"]) == (
        None, "the memories that match were given to this session already (they may come "
              "again once its agent compacts its context)")
    assert found == {memory_id, weather["memory"]["id"]}
    assert long_reason["reason"] == (
        "no memory shares 2 of the prompt's 10 uncommon words (alpha, bravo, charlie, delta, "
        "foxtrot, golf, hotel, india, …; [memory] inject_shared_words)")  # "echo" is common
    assert rated["memory"]["confidence"] < 0.7
    assert below["reason"] == (
        f"no memory of confidence ≥ 0.7 matched; memory {memory_id} (pytest flaky fixture) "
        f"did, at {rated['memory']['confidence']:.2f} (feedback that it helped raises it: "
        f"ctxctl memory rate {memory_id} --helpful)")


def test_a_shared_scope_needs_this_ctxd_s_team(daemon_root: Path) -> None:
    lone = DaemonProcess(daemon_root, name="lone").start()
    config = daemon_root / "team.toml"
    # A team whose database is not reachable: shared memories wait in the outbox.
    config.write_text('[memory.team]\nname = "payments"\nurl_env = "NO_SUCH_URL"\n')
    member = DaemonProcess(daemon_root, ["--config", str(config)], name="member",
                           data=daemon_root / "member").start()
    try:
        with lone.client() as alone, member.client() as teamed:
            local = record(alone, *FLAKY)["memory"]
            refusals = [rpc_error(alone, "memory.record", {
                "title": "t", "content": "c", "scope": "team:payments"}),
                rpc_error(alone, "memory.share", {"id": local["id"], "scope": "org:acme"}),
                rpc_error(teamed, "memory.record", {
                    "title": "t", "content": "c", "scope": "team:web"})]
            kept = alone.call("memory.get", {"id": local["id"]})["memory"]
            listed = alone.call("memory.list", {"limit": 10})["memories"]
            shared = record(teamed, "t", "c", scope="team:payments")["memory"]
            orgs = record(teamed, "u", "d", scope="org:acme")["memory"]
    finally:
        lone.stop()
        member.stop()
    fix = ("name the team under [memory.team] in ctxd's config (config.toml): name = \"…\", "
           "and the database's URL in the variable url_env names; then restart ctxd")
    assert [(e.code, e.message, e.data) for e in refusals] == [
        (-32003, "no team to share team:payments with: this ctxd has no [memory.team]",
         {"scope": "team:payments", "fix": fix}),
        (-32003, "no team to share org:acme with: this ctxd has no [memory.team]",
         {"scope": "org:acme", "fix": fix}),
        (-32003, "this ctxd's team is payments, not web",
         {"scope": "team:web", "fix": "use the scope team:payments, or an org: scope"})]
    # Refused, the memory stays where it was, and nothing else was stored.
    assert kept == local
    assert [m["id"] for m in listed] == [local["id"]]
    assert (shared["scope"], orgs["scope"]) == ("team:payments", "org:acme")


def test_a_lesson_s_memory_recorded_event_goes_to_its_session(
        shared_daemon: DaemonProcess) -> None:
    with shared_daemon.client() as session_watcher, shared_daemon.client() as watcher, \
            shared_daemon.client() as client:
        session_watcher.call("events.subscribe", {"session_id": "lesson-events",
                                                  "types": ["memory.recorded"]})
        watcher.call("events.subscribe", {"types": ["memory.recorded"]})
        recorded = record(client, "a recorded lesson", "recorded by hand",
                          scope="project:elsewhere")["memory"]["id"]
        branch_id = return_with_lesson(client, "lesson-events", "events", "find the lesson",
                                       "the kestrel logs hold the answer")
        [hit] = found_soon(client, "kestrel", "project:events")
        extracted = next_event(session_watcher)
        assert (extracted["session_id"], extracted["data"]) == ("lesson-events", {
            "id": hit["id"], "scope": "project:events", "source": branch_id})
        seen = [next_event(watcher) for _ in range(2)]
        assert [(e["session_id"], e["data"]["id"]) for e in seen] == [
            (None, recorded), ("lesson-events", hit["id"])]
        session_watcher.call("daemon.ping")  # another event would have arrived before this
        assert session_watcher.notifications.empty()


def test_extracted_memories_become_memories(shared_daemon: DaemonProcess) -> None:
    with shared_daemon.client() as client:
        branch_id = return_with_lesson(client, "extract1", "lessons", "find the flaky test",
                                       "test_io is flaky because of a 1 s sleep")
        [hit] = found_soon(client, "flaky sleep", "project:lessons")
        memory = client.call("memory.get", {"id": hit["id"]})["memory"]
        assert {k: memory[k] for k in ("scope", "title", "content", "outcome", "confidence",
                                       "source")} == {
            "scope": "project:lessons", "title": "find the flaky test",
            "content": "test_io is flaky because of a 1 s sleep", "outcome": "success",
            "confidence": 0.6, "source": branch_id}


def _approximate_index_of_30(process: DaemonProcess, client: Client) -> None:
    """30 memories recorded past ``--memory-ann-threshold 20``: once the approximate index
    is in place with all of them."""
    for i in range(1, 31):
        record(client, f"lesson {i}", f"topic{i} notes about subject{i}")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        index = client.call("daemon.status")["memory_index"]
        if (index["state"], index["vectors"]) == ("ready", 30) and (
                "memory index rebuilt as it grew" in process.log()):
            return
        time.sleep(0.05)
    raise AssertionError(f"no approximate index of 30 memories: {index}")


def test_an_approximate_index_handles_deletes(daemon_root: Path) -> None:
    # nprobe above the number of lists: the approximate index searches exhaustively here.
    process = DaemonProcess(daemon_root, ["--memory-ann-threshold", "20",
                                          "--memory-nprobe", "64"]).start()
    try:
        with process.client() as client:
            _approximate_index_of_30(process, client)
            client.call("memory.delete", {"id": 7})
            for wanted in (6, 8, 30):
                found = search(client, f"topic{wanted} subject{wanted}", mode="dense", k=1)
                assert [r["id"] for r in found["results"]] == [wanted]
            assert 7 not in [r["id"] for r in search(client, "topic7 subject7", mode="dense",
                                                     k=30)["results"]]
        process.stop()
        process.start()
        with process.client() as client:
            index = wait_index_ready(client)
            assert (index["state"], index["vectors"], index["memories"]) == ("ready", 29, 29)
            found = search(client, "topic8 subject8", mode="dense", k=1)
            assert [r["id"] for r in found["results"]] == [8]
    finally:
        process.stop()


def test_an_approximate_index_keeps_a_byte_a_dimension_and_replaces_an_older_kind(
        daemon_root: Path) -> None:
    process = DaemonProcess(daemon_root, ["--memory-ann-threshold", "20"]).start()
    try:
        with process.client() as client:
            _approximate_index_of_30(process, client)
        process.stop()
        index_file = process.data_dir / "memory.faiss"
        saved = faiss.read_index(str(index_file))
        assert isinstance(saved, faiss.IndexIVFScalarQuantizer)
        # One byte a dimension, on the fixed range of unit vectors' components.
        assert (saved.sq.qtype, saved.ntotal, saved.code_size) == (
            faiss.ScalarQuantizer.QT_8bit_uniform, 30, 1024)
        assert faiss.vector_to_array(saved.sq.trained).tolist() == [-1.0, 2.0]
        # The same memories as an IVF of 16-bit floats, as an earlier version saved them.
        conn = apsw.Connection(str(process.data_dir / "ctxd.db"))
        rows = conn.execute("SELECT id, title, description, content, tags FROM memories "
                            "ORDER BY id").fetchall()
        conn.close()
        vectors = HashingEmbedder(1024).embed_sync(
            [embedding_text(*row[1:]) for row in rows])
        older = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(1024), 1024, 1,
                                              faiss.ScalarQuantizer.QT_fp16,
                                              faiss.METRIC_INNER_PRODUCT)
        older.train(vectors)
        older.add_with_ids(vectors, np.asarray([row[0] for row in rows], dtype=np.int64))
        faiss.write_index(older, str(index_file))
        # Saved whole, as that version did (its checksum beside it).
        meta_file = process.data_dir / "memory.json"
        meta = json.loads(meta_file.read_text())
        meta_file.write_text(json.dumps(meta | {"sha256": hashlib.sha256(
            index_file.read_bytes()).hexdigest()}))
        process.start()
        with process.client() as client:
            index = wait_index_ready(client)
            assert (index["state"], index["vectors"]) == ("ready", 30)
            found = search(client, "topic8 subject8", mode="dense", k=1)
            assert [r["id"] for r in found["results"]] == [8]
        process.stop()
        assert "memory index file is an IVF of an older kind; rebuilding" in process.log()
        rebuilt = faiss.read_index(str(index_file))
        assert isinstance(rebuilt, faiss.IndexIVFScalarQuantizer)
        assert rebuilt.sq.qtype == faiss.ScalarQuantizer.QT_8bit_uniform
    finally:
        process.stop()


def test_a_trailing_newline_is_not_part_of_a_valid_id(shared_daemon: DaemonProcess) -> None:
    with shared_daemon.client() as client:
        for method, params, path in (
                ("memory.record", {"title": "t", "content": "c", "scope": "global\n"},
                 "$.scope"),
                ("session.open", {"session_id": "abc\n"}, "$.session_id"),
                ("branch.status", {"branch_id": "br_000000000000\n"}, "$.branch_id")):
            error = rpc_error(client, method, params)
            assert (error.code, error.data["path"]) == (-32602, path), method


def test_an_extracted_memory_keeps_its_project_scope(shared_daemon: DaemonProcess) -> None:
    with shared_daemon.client() as client:
        return_with_lesson(client, "extract2", "my  app", "find the slow query",
                           "the orders query lacks an index")
        client.call("session.delete", {"session_id": "extract2"})
        found = found_soon(client, "orders query index", "project:my-app")
        assert [(r["scope"], r["title"]) for r in found] == [
            ("project:my-app", "find the slow query")]


def test_a_record_that_fails_to_commit_leaves_no_trace_in_search(daemon_root: Path) -> None:
    """A full store fails a record with -32008; the lexical ranking then still matches
    what SQLite holds (the failed memory is nowhere), before and after a restart."""
    # (384 KiB: the store's own tables and WAL take part of it; team memory's made 256 too
    # few for ten records.)
    process = DaemonProcess(daemon_root, extra_args=["--max-db-bytes", str(384 * 1024)])
    process.start()
    failure = None
    try:
        with process.client() as client:
            recorded = 0
            while failure is None and recorded < 2000:
                try:
                    record(client, f"lesson marker{recorded}",
                           hello_text(150) + f" unique{recorded}")
                    recorded += 1
                except RpcError as error:
                    failure = error
            assert failure is not None
            assert failure.code == -32008
            assert recorded > 10
            assert search(client, f"unique{recorded}", mode="lexical")["results"] == []
            assert [r["id"] for r in search(client, f"unique{recorded - 1}",
                                            mode="lexical")["results"]] == [recorded]
            found = search(client, "marker0 unique1 marker2 unique3", mode="lexical", k=10)
            assert sorted(r["id"] for r in found["results"]) == [1, 2, 3, 4]
            assert client.call("daemon.status")["memory_index"]["memories"] == recorded
    finally:
        process.stop()
    process.start()
    try:
        with process.client() as client:
            assert wait_index_ready(client)["lexical"] == "ready"
            assert search(client, "marker0 unique1 marker2 unique3", mode="lexical",
                          k=10) == found
            assert search(client, f"unique{recorded}", mode="lexical")["results"] == []
    finally:
        process.stop()


def test_the_dense_leg_finds_a_scope_s_memory_behind_many_closer_ones(
        daemon: DaemonProcess) -> None:
    """FAISS searches within the scope: a project's one memory is found although 900
    memories of another project are nearer to the query."""
    with daemon.client() as client:
        mine = record(client, "migration lock", "migration lock", scope="project:mine")
        for n in range(900):
            record(client, f"database migration lock timeout {n}",
                   "database migration lock timeout", scope="project:other")
        wait_index_ready(client)
        query = "database migration lock timeout"
        nearest = search(client, query, mode="dense", k=5)["results"]
        assert len(nearest) == 5
        assert all(r["scope"] == "project:other" for r in nearest)
        found = search(client, query, mode="dense", scope="project:mine", k=5)
        assert [r["id"] for r in found["results"]] == [mine["memory"]["id"]]
        assert found["note"] is None
