"""Jobs and their results: a `Slot` that a task or another thread fulfils once and trio tasks
wait for, the `JobQueue` of an owner task that runs its callers' jobs one at a time, and the
`Request` a client may cancel (docs/protocol.md, "Cancellation")."""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Generic, TypeVar, cast

import trio

T = TypeVar("T")


class Slot(Generic[T]):
    """A one-shot result: fulfilled once, with a value (`set`) or an exception (`fail`), and
    awaited by trio tasks (`wait`).

    Made in a trio task, it notes when (`arrived`). It may be fulfilled by a task of that
    trio run, which wakes its waiters at once, or from any other thread, which wakes them
    through the run's token (a thread gives up nothing when the run is over: nobody waits
    any more). Either way, by one party only.
    """

    __slots__ = ("_done", "_error", "_event", "_thread", "_token", "_value", "arrived")

    def __init__(self) -> None:
        self.arrived = trio.current_time()
        """When it was made (trio's clock): a request's deadline is judged against when it
        arrived, not against when its owner got to it."""
        self._event = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        self._thread = threading.get_ident()
        self._done = False
        self._value: T | None = None
        self._error: BaseException | None = None

    def set(self, value: T) -> None:
        """Fulfil it with ``value`` (from any thread).

        Raises:
            RuntimeError: it was fulfilled already.
        """
        self._fulfil()
        self._value = value
        self._wake()

    def fail(self, error: BaseException) -> None:
        """Fulfil it with ``error``, which its waiters raise (from any thread).

        Raises:
            RuntimeError: it was fulfilled already.
        """
        self._fulfil()
        self._error = error
        self._wake()

    @property
    def done(self) -> bool:
        """Whether it has been fulfilled."""
        return self._done

    async def wait(self) -> T:
        """The value it is fulfilled with.

        Raises:
            BaseException: the error it is failed with.

        Cancellation: only the wait ends; the slot may still be fulfilled and waited for.
        A deadline is the caller's cancel scope around it.
        """
        await self._event.wait()
        if self._error is not None:
            raise self._error
        return cast(T, self._value)

    def _fulfil(self) -> None:
        if self._done:
            raise RuntimeError("a Slot is fulfilled once")
        self._done = True

    def _wake(self) -> None:
        if threading.get_ident() == self._thread:
            self._event.set()
            return
        try:
            self._token.run_sync_soon(self._event.set)
        except trio.RunFinishedError:
            pass  # the run is over: nobody waits


class Job(Generic[T]):
    """A job of a `JobQueue` and the slot its caller waits on."""

    __slots__ = ("_fn", "_stopping", "slot")

    def __init__(self, fn: Callable[[], Awaitable[T]], stopping: Callable[[], Exception]):
        self._fn = fn
        self._stopping = stopping
        self.slot: Slot[T] = Slot()

    async def run(self) -> None:
        """Run the job and hand its caller what it returned or raised (an `Exception`).

        Cancellation: its caller gets the queue's stopping error; `Cancelled` goes on.
        """
        try:
            self.slot.set(await self._fn())
        except Exception as exc:  # the job's failure is its caller's to raise
            self.slot.fail(exc)
        finally:
            if not self.slot.done:
                self.slot.fail(self._stopping())


class JobQueue:
    """The jobs of one owner task, which runs them one at a time in the order they were
    queued; each caller waits for its own job's result.

    Args:
        size: jobs queued at most (a caller waits for room beyond them).
        stopping: the error of a job that the owner will not run or finish (it has
            stopped, or was cancelled while running it).
    """

    def __init__(self, size: int, stopping: Callable[[], Exception]):
        self._send, self._receive = trio.open_memory_channel[Job[Any]](size)
        self._stopping = stopping

    async def submit(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Queue ``fn`` for the owner to run and return what it returns.

        Raises:
            Exception: what ``fn`` raised, or the stopping error.

        Cancellation: a job queued is not taken back; the owner runs it all the same.
        """
        job = Job(fn, self._stopping)
        try:
            await self._send.send(job)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise self._stopping() from None
        return await job.slot.wait()

    async def receive(self) -> Job[Any]:
        """The next job, for the owner to `run <Job.run>`."""
        return await self._receive.receive()

    def close(self) -> None:
        """For the owner, when it stops: the jobs still queued, and any submitted from now
        on, fail with the stopping error."""
        while True:
            try:
                job = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            job.slot.fail(self._stopping())
        self._receive.close()


class Request:
    """One in-flight request that `request.cancel` may stop, and where it stands.

    Cancellation lands only where nothing is half-done (docs/protocol.md, "Cancellation"):
    while the request waits in a session actor's mailbox (`queued`), at a
    `cancellation_point` (a wait before anything is written: the summarizer), or when a
    session actor's operation ends without having written. Its first store write is its
    commit point (`commit_point`): from then on it is answered as done.

    Args:
        request_id: the JSON-RPC id it was sent with.
        stopped_error: the error it is answered with once cancelled, given the reason.
    """

    __slots__ = ("_queued", "_scopes", "_stopped_error", "actor_op", "committed", "finished",
                 "reason", "request_id", "stopped")

    def __init__(self, request_id: str | int,
                 stopped_error: Callable[[str | int, str | None], Exception]):
        self.request_id = request_id
        self._stopped_error = stopped_error
        self.stopped = False
        """`cancel` took effect: it is answered -32006 (`reason` says why)."""
        self.reason: str | None = None
        self.committed = False
        """It passed its commit point: it will be answered as done."""
        self.finished = False
        """Answered (a task it started may still hold it: it no longer counts)."""
        self.actor_op = False
        """A session actor runs it and answers -32006 if it ends without writing."""
        self._queued: Slot[Any] | None = None
        self._scopes: set[trio.CancelScope] = set()

    @property
    def cancellable(self) -> bool:
        """Whether `cancel` would stop it now."""
        return not (self.finished or self.committed or self.stopped) and bool(
            self._queued is not None or self.actor_op or self._scopes)

    def error(self) -> Exception:
        """What it is answered with once cancelled."""
        return self._stopped_error(self.request_id, self.reason)

    def cancel(self, reason: str | None) -> bool:
        """Stop it where it waits; False when it cannot be stopped any more (it committed,
        or is at no point where it may stop: it is answered as done)."""
        if not self.cancellable:
            return False
        self.stopped, self.reason = True, reason
        if self._queued is not None and not self._queued.done:
            self._queued.fail(self.error())
        for scope in self._scopes:
            scope.cancel()
        return True

    def queued(self, reply: Slot[Any] | None) -> None:
        """It waits in a mailbox for ``reply`` (None: its owner took it up)."""
        self._queued = reply


_current: contextvars.ContextVar[Request | None] = contextvars.ContextVar(
    "ctxd_request", default=None)


def current_request() -> Request | None:
    """The cancellable request this task works for, if any (not one already answered)."""
    request = _current.get()
    return None if request is None or request.finished else request


class working_for:
    """Run the block on behalf of ``request`` (its commit point and cancellation points).

    A class rather than a generator: every request enters it twice, and a generator-based
    context manager costs several times as much.
    """

    __slots__ = ("_request", "_token")

    def __init__(self, request: Request | None):
        self._request = request

    def __enter__(self) -> None:
        self._token = _current.set(self._request)

    def __exit__(self, *exc_info: object) -> None:
        _current.reset(self._token)


@contextlib.contextmanager
def cancellation_point() -> Iterator[None]:
    """A block (waits, nothing written, nothing changed in memory) where `Request.cancel`
    may land: it is cancelled, and the request's -32006 is raised after it.

    Raises:
        CtxdError: -32006 when the request was cancelled.
    """
    request = current_request()
    if request is None or request.committed:
        yield
        return
    scope = trio.CancelScope()
    if request.stopped:
        scope.cancel()
    request._scopes.add(scope)
    try:
        with scope:
            yield
    finally:
        request._scopes.discard(scope)
    if scope.cancelled_caught or request.stopped:
        raise request.error()


def commit_point() -> None:
    """Called (without a checkpoint before the write starts) by the store before it writes
    for a request: one cancelled is refused, otherwise it is answered as done from now on.

    Raises:
        CtxdError: -32006 when the request was cancelled.
    """
    request = current_request()
    if request is None:
        return
    if request.stopped:
        raise request.error()
    request.committed = True


__all__ = ["Job", "JobQueue", "Request", "Slot", "cancellation_point", "commit_point",
           "current_request", "working_for"]
