"""Memory: records, searches and rates ReasoningBank items; owns the MemoryIndex task and
turns folding's memory candidates into memories (docs/protocol.md, Memory)."""

from __future__ import annotations

import contextlib
import getpass
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import apsw
import trio

from ctxd.config import MemoryConfig
from ctxd.errors import CtxdError, ErrorCode, not_found, params_error, scrub_failed
from ctxd.hub import EventBus
from ctxd.memory import _mirror_file
from ctxd.memory import _queries as q
from ctxd.memory import _shared as shared
from ctxd.memory._embedders import Embedder
from ctxd.memory._heap import give_back_freed_memory
from ctxd.memory._index import MemoryIndex
from ctxd.memory._injection import (
    HEADER,
    INJECT_MAX_ITEMS,
    INJECT_MIN_CONFIDENCE,
    Candidate,
    Injected,
    fit,
    tail,
)
from ctxd.memory._lexical import LexicalIndex
from ctxd.memory._queries import MemoryCandidate
from ctxd.memory._relevance import Vocabulary, shares_enough
from ctxd.memory._retrieval import Ranked, Retrieved, retrieve
from ctxd.memory._shared import is_shared
from ctxd.scrub import ScrubError, scrub
from ctxd.store import Store, Transaction
from ctxd.tokens import TokenCounter
from ctxd.wire.types import (
    Injection,
    MemoryIndexStatus,
    MemoryItem,
    MemoryListParams,
    MemoryListResult,
    MemoryRecordParams,
    MemoryRecordResult,
    MemorySearchParams,
    MemorySearchResult,
    SearchHit,
)

log = logging.getLogger("ctxd.memory")
GIVEN_ALREADY = ("the memories that match were given to this session already (they may come "
                 "again once its agent compacts its context)")
"""Injection's reason when every relevant memory was left out as given already."""
SHOWN_WORDS = 8
"""The prompt's uncommon words a reason names, at most."""
RELEVANCE_CHARS = 8_192
"""A memory's content is looked through this far for the prompt's words (a 64 KB content
would take milliseconds of the event loop)."""
BELOW_SOUGHT = 5
"""Memories below injection's confidence a reason looks through for one that would pass."""
TITLE_SHOWN = 60
"""A memory's title in a reason, at most (characters)."""
T = TypeVar("T")
CANDIDATE_POLL_S = 1.0
RETRY_S = 30.0
MIRROR_FILE = "memory-lexical.npz"
"""The lexical mirror's file, beside the index's (docs/decisions.md, Memory)."""
MIRROR_QUIET_S = 30.0
"""The mirror's file is saved once it has not changed for this long (and at shutdown)."""
SHUTDOWN_SAVE_S = 20.0
FIT_ON_LOOP_CHARS = 16_384
"""Below this much memory text, injection counts its tokens on the loop (a thread hop
would cost more)."""


def _unknown(memory_id: int) -> CtxdError:
    return CtxdError(ErrorCode.NOT_FOUND, f"unknown memory {memory_id}",
                     {"memory_id": memory_id,
                      "fix": "list memories with memory.list or find them with memory.search"})


class Memory:
    """The memory service.

    Args:
        store: the database.
        embedder: the configured embedder.
        index_path: where the FAISS index is saved.
        config: the ``[memory]`` configuration.
        bus: where memory events are published.
        counter: the daemon's token counter (injection's exact counts).
    """

    def __init__(self, store: Store, embedder: Embedder, index_path: Path,
                 config: MemoryConfig, bus: EventBus, counter: TokenCounter):
        self.store = store
        self.counter = counter
        self.config = config
        self.vocabulary = Vocabulary(counter)
        self.bus = bus
        self.index = MemoryIndex(index_path, embedder, store, config.ann_threshold,
                                 config.nprobe)
        self.lexical = LexicalIndex()
        self._lexical_reset = trio.Event()
        self._lexical_loaded = trio.Event()
        self._mirror_path = index_path.with_name(MIRROR_FILE)
        self._mirror_saved = -1
        """The mirror's version its file holds (-1: not this one)."""
        self._file_rows = -1
        """Memories in the file the mirror was last restored from (-1: none)."""
        self.count = 0
        self.shared_written = trio.Event()
        """Set when a write to a shared scope entered the outbox (the team link drains it,
        then makes a new one)."""
        self.outbox_depth = 0
        """Writes to shared scopes the team database has not applied (read at start)."""
        self.last_change = 0
        """The team database's last change mirrored here (read at start)."""

    async def run(self, *, task_status: trio.TaskStatus[Memory] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Run the index's owner task and promote folding's memory candidates."""
        _, self.count = await self.store.read(q.index_generation)
        if await self.store.read(q.tokens_encoding) != self.counter.name:
            await self.store.write(q.count_tokens_with, self.counter.name)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.index.run)
            nursery.start_soon(self._load_lexical)
            nursery.start_soon(self._keep_mirror_file)
            task_status.started(self)
            while True:
                try:
                    await self.promote_candidates()
                except Exception:
                    # Service boundary: the candidates stay queued and are tried again.
                    log.exception("promoting memory candidates failed")
                    await trio.sleep(RETRY_S)
                await trio.sleep(CANDIDATE_POLL_S)

    async def _load_lexical(self) -> None:
        """Load the lexical mirror: from its file when there is one, then what the file
        lacks a chunk per store job (other jobs run in between); again whenever a failed
        write has reset it. A failure to load is logged and tried again later: FTS5 ranks
        meanwhile."""
        while True:
            started = time.monotonic()
            try:
                from_file = await self._restore_lexical()
                loaded = False
                while not loaded:
                    loaded = await self.store.read(self.lexical.load_more)
            except Exception:
                # Service boundary: the mirror is a cache of SQLite.
                log.exception("loading the lexical ranking failed; FTS5 ranks meanwhile "
                              "(retrying in %g s)", RETRY_S)
                await self.store.read(lambda _: self.lexical.reset())
                await trio.sleep(RETRY_S)
                continue
            log.info("lexical ranking loaded in %.2f s: %d memories from %s, %d tokenized",
                     time.monotonic() - started, from_file, self._mirror_path.name,
                     self.lexical.rows - from_file)
            await trio.to_thread.run_sync(give_back_freed_memory)
            if self.lexical.rows == from_file == self._file_rows:
                self._mirror_saved = self.lexical.version  # the file is already this
            self._lexical_loaded.set()
            await self._lexical_reset.wait()
            self._lexical_reset = trio.Event()

    async def _restore_lexical(self) -> int:
        """Restore the mirror from its file (read in a worker thread, checked against
        SQLite in the store's): how many memories it gave, 0 without a usable file."""
        self._file_rows = -1
        try:
            image = await trio.to_thread.run_sync(_mirror_file.read, self._mirror_path)
            if image is None:
                return 0
            taken: int = await self.store.read(self.lexical.restore, image)
        except Exception as exc:
            # The file is a cache: one that cannot be used is set aside (not read again at
            # every retry) and every memory tokenized.
            log.warning("lexical ranking file %s is not usable (%s); tokenizing every "
                        "memory instead", self._mirror_path, exc)
            await self.store.read(lambda _: self.lexical.reset())
            with contextlib.suppress(OSError):
                self._mirror_path.replace(self._mirror_path.with_name(
                    self._mirror_path.name + ".unusable"))
            return 0
        self._file_rows = sum(int((shard.ids >= 0).sum()) for shard in image.shards)
        return taken

    async def _keep_mirror_file(self) -> None:
        """Save the lexical mirror to its file when it changed and then stayed unchanged
        for `MIRROR_QUIET_S` (the write runs in a worker thread); a last time at shutdown."""
        try:
            seen = -1
            while True:
                await trio.sleep(MIRROR_QUIET_S)
                version = self.lexical.version
                if version == seen and version != self._mirror_saved:
                    await self._save_mirror()
                seen = version
        finally:
            with trio.move_on_after(SHUTDOWN_SAVE_S, shield=True):
                if self.lexical.version != self._mirror_saved:
                    await self._save_mirror()

    async def _save_mirror(self) -> None:
        """Write the mirror's file now (nothing while it is not whole). A failure is
        logged: the next start tokenizes what the file lacks."""
        try:
            captured = await self.store.read(lambda _: (self.lexical.version,
                                                        self.lexical.capture()))
            version, capture = captured
            if capture is None:
                return
            # Left to finish alone when cancelled (a shutdown's deadline): it writes a
            # temp file of its own, renamed into place only once whole.
            await trio.to_thread.run_sync(_mirror_file.write, self._mirror_path, *capture,
                                          abandon_on_cancel=True)
        except Exception as exc:
            # The file is a cache: a failure costs the next start its tokenizing, never
            # the daemon.
            log.warning("could not save the lexical ranking to %s: %s",
                        self._mirror_path, exc)
            return
        self._mirror_saved = version

    async def wait_lexical_loaded(self) -> None:
        """Return once the lexical mirror is loaded (again)."""
        await self._lexical_loaded.wait()

    async def _write(self, fn: Callable[..., T], *args: Any) -> T:
        """A write that keeps the lexical mirror in step. Should its transaction roll back
        after the mirror was changed, the mirror is reset in the same store job (nothing
        runs in between) and loaded again."""

        def write(conn: apsw.Connection, mirror: LexicalIndex) -> T:
            mirror.touched = False
            return fn(conn, mirror, *args)

        try:
            return await self.store.write(write, self.lexical,
                                          on_rollback=self.lexical.rolled_back)
        finally:
            self._reload_if_reset()

    def _reload_if_reset(self) -> None:
        """After a write: load the lexical mirror again if a rollback reset it."""
        if not self.lexical.ready and self._lexical_loaded.is_set():
            self._lexical_loaded = trio.Event()
            self._lexical_reset.set()

    async def promote_candidates(self) -> int:
        """Turn queued memory candidates into memories (confidence 0.6)."""
        made = await self._write(q.promote_candidates)
        for item, generation, session_id in made:
            self.count += 1
            await self.index.add(item.id, _text(item), generation)
            # The session whose branch it came from: its subscribers learn of their lesson.
            self.bus.publish(session_id, "memory.recorded", {
                "id": item.id, "scope": item.scope, "source": item.source})
        return len(made)

    async def record(self, p: MemoryRecordParams) -> MemoryRecordResult:
        for path, text in (("$.title", p.title), ("$.content", p.content)):
            if not text.strip():
                raise params_error(path, "Expected a text that is not blank")
        if is_shared(p.scope):
            self._check_team(p.scope)
        try:
            parts = [scrub(text) for text in (p.title, p.description, p.content,
                                              " ".join(p.tags))]
        except ScrubError as exc:
            raise scrub_failed("the memory", exc, "nothing was stored") from exc
        title, description, content, tags = (part.text for part in parts)
        shown = tail(content)  # counted once, here: see `fit`
        tokens = None if shown is None else await self.counter.count_async(shown)
        memory = q.NewMemory(scope=p.scope, title=title, description=description,
                             content=content, outcome=p.outcome, tags=tags,
                             prior=q.PRIOR_RECORDED, source=None, created_at=time.time(),
                             content_tokens=tokens)
        if is_shared(p.scope):
            item, generation = await self._write(self._insert_shared, memory)
            self.outbox_depth += 1
            self.shared_written.set()
        else:
            item, generation = await self._write(q.insert, memory)
        self.count += 1
        await self.index.add(item.id, _text(item), generation)
        self.bus.publish(None, "memory.recorded", {"id": item.id, "scope": item.scope,
                                                   "source": None})
        return MemoryRecordResult(memory=item, secrets_scrubbed=sum(p.total for p in parts),
                                  indexed=self.index.state == "ready")

    def _check_team(self, scope: str) -> None:
        """A shared scope is this ctxd's team's (``team:<its name>``) or an ``org:`` one,
        and only with a team: without one, its memories would wait in the outbox for
        ever, and leave the scope they were in.

        Raises:
            CtxdError: -32003 without a team, or for another team's scope.
        """
        team = self.config.team.name
        if not team:
            raise CtxdError(ErrorCode.INVALID_STATE, f"no team to share {scope} with: this "
                            "ctxd has no [memory.team]", {"scope": scope, "fix": (
                                "name the team under [memory.team] in ctxd's config "
                                "(config.toml): name = \"…\", and the database's URL in "
                                "the variable url_env names; then restart ctxd")})
        if scope.startswith("team:") and scope != f"team:{team}":
            raise CtxdError(ErrorCode.INVALID_STATE, f"this ctxd's team is {team}, not "
                            f"{scope.removeprefix('team:')}", {"scope": scope, "fix": (
                                f"use the scope team:{team}, or an org: scope")})

    def _recorded_by(self) -> dict[str, str] | None:
        """Who shares a memory from here, unless ``[memory.team] share_identity`` is off."""
        return {"machine": socket.gethostname(), "user": getpass.getuser()} \
            if self.config.team.share_identity else None

    def _insert_shared(self, conn: apsw.Connection, mirror: LexicalIndex, memory: q.NewMemory
                       ) -> tuple[MemoryItem, int]:
        """A memory of a shared scope and its outbox entry, in one transaction."""
        item, generation = q.insert(conn, mirror, memory)
        shared.stage_record(conn, item.id, self._recorded_by(), memory.created_at)
        return item, generation

    async def share(self, memory_id: int, scope: str) -> MemoryItem:
        """memory.share: a memory of this store moved to a shared scope and sent to the
        team database (docs/protocol.md, Memory)."""
        item = await self.get(memory_id)
        self._check_team(scope)
        if is_shared(item.scope):
            raise CtxdError(ErrorCode.INVALID_STATE, f"memory {memory_id} is shared already "
                            f"({item.scope})", {
                                "memory_id": memory_id, "scope": item.scope,
                                "fix": "nothing to do: a shared memory stays in its scope "
                                       "(to have it in another, record it there)"})
        moved = await self._write(shared.share, memory_id, scope, self._recorded_by(),
                                  time.time())
        if moved is None:
            raise _unknown(memory_id)
        self.outbox_depth += 1
        self.shared_written.set()
        return moved

    # ---- shared scopes (the team link, ctxd.team) -----------------------------------

    async def outgoing(self, limit: int) -> list[shared.Outgoing]:
        """The oldest writes to shared scopes the team database has not applied."""
        return await self.store.read(shared.outgoing, limit)

    async def sent(self, done: list[tuple[int, int | None, int | None]]) -> None:
        """Outbox entries applied: out of the outbox, their memories mapped (a local copy
        of a memory the team had already goes: its mirrored copy stands for both)."""
        duplicates = await self._write(shared.sent, done)
        self.outbox_depth = max(0, self.outbox_depth - len(done))
        for memory_id, generation in duplicates:
            self.count -= 1
            await self.index.remove([memory_id], generation)

    async def mirror(self, changes: list[Any], seq: int) -> None:
        """A page of the team database's changes, applied and indexed."""
        mirrored = await self._write(shared.mirror, changes, seq)
        self.last_change = seq
        if mirrored.added:
            self.count += len(mirrored.added)
            await self.index.add_many([(item.id, _text(item)) for item, _ in mirrored.added],
                                      max(generation for _, generation in mirrored.added))
        for item, _ in mirrored.added:
            self.bus.publish(None, "memory.recorded", {"id": item.id, "scope": item.scope,
                                                       "source": item.source})
        for memory_id, generation in mirrored.removed:
            self.count -= 1
            await self.index.remove([memory_id], generation)

    async def team_state(self) -> tuple[int, int]:
        """(outbox depth, last change mirrored), read from the store (and kept)."""
        def read(conn: apsw.Connection) -> tuple[int, int]:
            return shared.outbox_depth(conn), shared.last_change(conn)
        self.outbox_depth, self.last_change = await self.store.read(read)
        return self.outbox_depth, self.last_change

    async def search(self, p: MemorySearchParams) -> MemorySearchResult:
        found = await self.retrieve(p.query, scope=p.scope, k=p.k,
                                    min_confidence=p.min_confidence, mode=p.mode)
        return MemorySearchResult(
            results=[SearchHit(id=r.item.id, title=r.item.title,
                               description=r.item.description, content=r.item.content,
                               scope=r.item.scope, confidence=r.item.confidence,
                               score=r.score, legs=r.legs) for r in found.ranked],
            mode=p.mode, legs_used=found.legs_used, note=found.note)

    async def retrieve(self, query: str, *, scope: str | None, k: int, min_confidence: float,
                       mode: str = "hybrid") -> Retrieved:
        return await retrieve(self.store, self.lexical, self.index, self.config, query,
                              scope=scope, k=k,
                              min_confidence=min_confidence,
                              mode="hybrid" if mode not in ("lexical", "dense") else
                              ("lexical" if mode == "lexical" else "dense"))

    async def inject(self, query: str, scope: str, cap: int,
                     leave_out: frozenset[int] = frozenset(),
                     header: str = HEADER) -> Injected:
        """The memories to inject into a new branch (docs/protocol.md, Injection into a new
        branch): retrieved with the branch's description and prompt, confidence ≥ 0.7,
        relevant to them (`relevant`), at most 10, fitted into ``cap`` tokens under
        ``header`` (`PROMPT_HEADER` beside a user's prompt); none of ``leave_out``. A
        failure never fails the branch: it comes back as the reason; so does why nothing
        was injected."""
        if self.count == 0:
            return fit([], self.counter, cap, header)
        try:
            # Twice as many with the floor: some of the best may not be relevant.
            wanted = INJECT_MAX_ITEMS * (2 if self.config.inject_shared_words else 1)
            found = await self.retrieve(query, scope=scope, k=wanted + len(leave_out),
                                        min_confidence=INJECT_MIN_CONFIDENCE)
        except Exception as exc:
            # Injection is optional: the branch is created without it, and says why.
            log.warning("memory injection failed: %s", exc)
            return Injected(None, 0, [], Injection(
                status="failed", reason=f"retrieval failed: {exc}", tokens=0, budget=cap))
        if not found.ranked:
            return Injected(None, 0, [], Injection(
                status="none_found", tokens=0, budget=cap,
                reason=await self.unmatched_reason(query, scope, leave_out)))
        fresh = self.relevant(query, [r for r in found.ranked if r.item.id not in leave_out])
        if not fresh:
            given = self.relevant(query, [r for r in found.ranked if r.item.id in leave_out])
            return Injected(None, 0, [], Injection(
                status="none_found", tokens=0, budget=cap, reason=(
                    GIVEN_ALREADY if given else self.irrelevant_reason(query))))
        candidates = [Candidate(r.item.id, r.item.title, r.item.content, r.item.confidence,
                                r.item.outcome, r.content_tokens) for r in fresh]
        uncounted = sum(len(c.content) for c in candidates if c.content_tokens is None)
        if uncounted < FIT_ON_LOOP_CHARS:
            return fit(candidates, self.counter, cap, header)
        # Counting tokens of long memories takes milliseconds: off the event loop.
        return await trio.to_thread.run_sync(fit, candidates, self.counter, cap, header)

    def relevant(self, query: str, ranked: list[Ranked]) -> list[Ranked]:
        """The first `INJECT_MAX_ITEMS` of ``ranked`` that may be injected beside
        ``query``: those that share ``inject_shared_words`` of its uncommon words
        (`_relevance`), whatever the embedder (a cosine floor for an embedder of meaning
        is not measured). A memory's words are looked for in its title, description, tags
        and its content's first `RELEVANCE_CHARS` characters, on the event loop."""
        needed = self.config.inject_shared_words
        if needed == 0:
            return ranked[:INJECT_MAX_ITEMS]
        prompt = self.vocabulary.uncommon_keys(query)
        if not prompt:
            return []
        keys = self.vocabulary.keys
        kept: list[Ranked] = []
        for r in ranked:
            item = r.item
            text = " ".join((item.title, item.description, *item.tags,
                             item.content[:RELEVANCE_CHARS]))
            if shares_enough(prompt, keys(text), needed):
                kept.append(r)
                if len(kept) == INJECT_MAX_ITEMS:
                    break
        return kept

    async def unmatched_reason(self, query: str, scope: str,
                               leave_out: frozenset[int]) -> str:
        """Why no memory of confidence ≥ 0.7 matched ``query``: when one below it would
        have been injected, which, and how to raise it (a lexical search of its own, only
        when nothing was found)."""
        try:
            below = self.relevant(query, [
                r for r in (await self.retrieve(query, scope=scope, k=BELOW_SOUGHT,
                                                min_confidence=0.0, mode="lexical")).ranked
                if r.item.id not in leave_out])
        except Exception:  # the reason's detail only: the plain reason stands
            log.debug("looking for a memory below injection's confidence failed",
                      exc_info=True)
            below = []
        if not below:
            return "no memory matched"
        item = below[0].item
        title = (item.title if len(item.title) <= TITLE_SHOWN
                 else item.title[:TITLE_SHOWN - 1] + "…")
        return (f"no memory of confidence ≥ {INJECT_MIN_CONFIDENCE} matched; memory "
                f"{item.id} ({title}) did, at {item.confidence:.2f} (feedback that it "
                f"helped raises it: ctxctl memory rate {item.id} --helpful)")

    def irrelevant_reason(self, query: str) -> str:
        """Why no memory that retrieval found is relevant to ``query``: its uncommon words,
        named, and how many a memory had to share."""
        words = self.vocabulary.uncommon_words(query)
        if not words:
            return "the prompt has no uncommon word to match memories by"
        shown = ", ".join(words[:SHOWN_WORDS]) + (", …" if len(words) > SHOWN_WORDS else "")
        needed = min(self.config.inject_shared_words, len(words))
        what = ("the prompt's one uncommon word" if len(words) == 1 else
                f"{needed} of the prompt's {len(words)} uncommon words")
        return f"no memory shares {what} ({shown}; [memory] inject_shared_words)"

    async def inject_once(self, session_id: str, query: str, scope: str, cap: int,
                          compacted: bool, header: str = HEADER) -> Injected:
        """`inject` for a session's context, leaving out the memories it was given
        already (all of them may come again once ``compacted`` says its agent compacted its
        context), and remembering those it is given now.

        Raises:
            CtxdError: -32004 when ctxd does not know the session.
        """
        if compacted:
            await self.store.write(q.forget_delivered, session_id)
        given = frozenset(await self.store.read(q.delivered, session_id))
        injected = await self.inject(query, scope, cap, given, header)

        def remember(conn: apsw.Connection) -> None:
            try:
                q.record_delivered(conn, session_id, [item.id for item in injected.items],
                                   time.time())
            except apsw.ConstraintError:
                raise not_found("session", session_id,
                                "open it with session.open first") from None

        if injected.items:
            await self.store.write(remember)
        return injected

    def stage_use(self, transaction: Transaction, injected: Injected, source: str) -> None:
        """Add to a new branch's transaction a weak positive signal for each memory
        injected into it, and the content tokens injection counted: one commit for all."""
        if not (injected.shown or injected.counted):
            return
        mirror = self.lexical
        now = time.time()

        def use(conn: apsw.Connection) -> None:
            mirror.touched = False
            q.record_use(conn, mirror, injected.shown, source, now)
            q.keep_content_tokens(conn, injected.counted)

        transaction.add(use)
        transaction.on_rollback(mirror.rolled_back)
        transaction.after(self._reload_if_reset)

    @staticmethod
    def stage_candidate(transaction: Transaction, candidate: MemoryCandidate) -> None:
        """Add a memory candidate (a lesson from a returned branch) to the branch's fold
        transaction; it becomes a memory within `CANDIDATE_POLL_S`."""
        transaction.add(q.queue_candidate, candidate)

    async def get(self, memory_id: int) -> MemoryItem:
        item = await self.store.read(q.get, memory_id)
        if item is None:
            raise _unknown(memory_id)
        return item

    async def signal(self, memory_id: int, kind: str, positive: bool,
                     source: str | None = None) -> MemoryItem:
        """Feedback, outcome or use: moves the memory's confidence."""
        item = await self._write(q.signal, memory_id, kind, positive, source, time.time())
        if item is None:
            raise _unknown(memory_id)
        return item

    async def delete(self, memory_id: int) -> None:
        generation = await self._write(q.delete, memory_id)
        if generation is None:
            raise _unknown(memory_id)
        self.count -= 1
        await self.index.remove([memory_id], generation)

    async def list(self, p: MemoryListParams) -> MemoryListResult:
        after = int(p.cursor) if p.cursor else 0
        items = await self.store.read(q.list_memories, p.scope, after, p.limit + 1)
        more = len(items) > p.limit
        items = items[:p.limit]
        return MemoryListResult(memories=items,
                                next_cursor=str(items[-1].id) if more else None)

    async def reindex(self) -> MemoryIndexStatus:
        await self.index.rebuild()
        return self.status()

    def status(self) -> MemoryIndexStatus:
        stats = self.index.statistics()
        return MemoryIndexStatus(state=stats.state, reason=stats.reason,
                                 vectors=stats.vectors, memories=self.count,
                                 embedder=stats.signature,
                                 lexical="ready" if self.lexical.ready else "loading",
                                 whole=(self.lexical.ready and stats.state == "ready"
                                        and stats.vectors == self.count))


def _text(item: MemoryItem) -> str:
    return q.embedding_text(item.title, item.description, item.content, " ".join(item.tags))
