"""ctxctl's ``memory`` commands: search, add, list, show, rate, rm and reindex."""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import time
from typing import TYPE_CHECKING, Any, get_args

from ctxclient._cli_args import (
    CURSOR_HELP,
    PAGE_ALL,
    ParagraphsFormatter,
    cursor,
    group,
    length_problem,
    number_in,
    read_stdin,
    scope,
    shared_name,
    tag,
    text_of,
)
from ctxclient._cli_values import CONTENT_SHOWN, confidence, shorten, timestamp
from ctxclient._output import Column, Fields, Lines, Listing, Note, Output, cell
from ctxclient._sync import Client
from ctxd.wire import types as wire

if TYPE_CHECKING:
    from ctxclient._cli_args import Commands, Parser

MEMORY_PAGE = 50
"""Memories `memory list` shows by default."""

HIT_COLUMNS = (
    Column("id", right=True), Column("score", keep=30, right=True),
    Column("confidence", keep=40, right=True), Column("legs", keep=20),
    Column("scope", keep=50, wrap=True, min_width=8), Column("title", keep=70, wrap=True),
    Column("content", keep=60, wrap=True, min_width=20))


def memory_hits_listing(result: dict[str, Any]) -> Listing:
    """The results of memory.search, best first."""
    legs = ", ".join(result["legs_used"]) or "none"
    listing = Listing(HIT_COLUMNS, title=f"{len(result['results'])} found by {result['mode']} "
                                         f"search (legs: {legs})",
                      empty=f"no memories found by {result['mode']} search")
    for hit in result["results"]:
        listing.rows.append([
            cell(str(hit["id"])), cell(f"{hit['score']:.4f}"), cell(confidence(hit["confidence"])),
            cell("+".join(hit["legs"])), cell(hit["scope"]), shorten(hit["title"]),
            shorten(hit["content"], CONTENT_SHOWN)])
    return listing


MEMORY_COLUMNS = (
    Column("id", right=True), Column("scope", keep=50, wrap=True, min_width=8),
    Column("confidence", keep=40, right=True), Column("outcome", keep=30),
    Column("uses", keep=20, right=True), Column("tags", keep=10, wrap=True, min_width=8),
    Column("title", keep=70, wrap=True), Column("content", keep=60, wrap=True, min_width=20))


def memories_listing(memories: list[dict[str, Any]], title: str,
                     empty: str = "no memories") -> Listing:
    listing = Listing(MEMORY_COLUMNS, title=title, empty=empty)
    for m in memories:
        listing.rows.append([
            cell(str(m["id"])), cell(m["scope"]), cell(confidence(m["confidence"])),
            cell(m["outcome"]), cell(str(m["usage_count"])), cell(" ".join(m["tags"])),
            shorten(m["title"]), shorten(m["content"], CONTENT_SHOWN)])
    return listing


def cmd_memory_search(client: Client, args: argparse.Namespace, out: Output) -> int:
    params: dict[str, Any] = {"query": args.query}
    for name in ("scope", "k", "min_confidence", "mode"):
        if getattr(args, name) is not None:
            params[name] = getattr(args, name)
    result = client.call("memory.search", params)
    out.emit(result, memory_hits_listing(result),
             *([Note(f"note: {result['note']}", style="yellow")] if result["note"] else []))
    return 0


def cmd_memory_add(client: Client, args: argparse.Namespace, out: Output) -> int:
    content = read_stdin() if args.content == "-" else args.content
    if content is None:
        return 2
    problem = length_problem(wire.MemoryRecordParams, "content", content, blank_ok=False)
    if problem:
        print(f"ctxctl: {'standard input' if args.content == '-' else 'CONTENT'} {problem}",
              file=sys.stderr)
        return 2
    params: dict[str, Any] = {"title": args.title, "content": content}
    for name in ("description", "scope", "outcome"):
        if getattr(args, name) is not None:
            params[name] = getattr(args, name)
    if args.tag:
        params["tags"] = args.tag
    result = client.call("memory.record", params)
    memory = result["memory"]
    scrubbed = result["secrets_scrubbed"]
    out.emit(result, Lines([f"memory {memory['id']} recorded in {memory['scope']}"
                            + (f"; {scrubbed} secret{'s' if scrubbed > 1 else ''} scrubbed"
                               if scrubbed else "")]),
             *([] if result["indexed"] else [
                 Note("not in the dense index yet (it is not ready); lexical search finds it")]))
    return 0


def cmd_memory_list(client: Client, args: argparse.Namespace, out: Output) -> int:
    limit = args.limit if args.limit is not None else PAGE_ALL if args.all else MEMORY_PAGE
    params: dict[str, Any] = {"limit": limit}
    if args.scope is not None:
        params["scope"] = args.scope
    result = client.call("memory.list", {**params, "cursor": args.cursor})
    memories = list(result["memories"])
    while args.all and result["next_cursor"] is not None:
        result = client.call("memory.list", {**params, "cursor": result["next_cursor"]})
        memories += result["memories"]
    out.emit({"memories": memories, "next_cursor": result["next_cursor"]},
             memories_listing(memories, "memories",
                              "no more memories" if args.cursor else "no memories"),
             *([Note(f"(more: --all, --limit larger than {limit}, or --cursor "
                     f"{result['next_cursor']})")] if result["next_cursor"] is not None else []))
    return 0


def cmd_memory_show(client: Client, args: argparse.Namespace, out: Output) -> int:
    result = client.call("memory.get", {"id": args.id})
    m = result["memory"]
    out.emit(result, Fields([
        ("id", str(m["id"])), ("scope", m["scope"]), ("title", m["title"]),
        ("description", m["description"]), ("outcome", m["outcome"]),
        ("tags", " ".join(m["tags"])), ("confidence", confidence(m["confidence"])),
        ("uses", str(m["usage_count"])), ("source", m["source"] or ""),
        ("created", timestamp(m["created_at"])), ("updated", timestamp(m["updated_at"])),
        ("content", m["content"])]))
    return 0


def _index_line(index: dict[str, Any]) -> str:
    return (f"{index['state']}: {index['vectors']:,} vectors, {index['memories']:,} memories "
            f"({index['embedder']})")


def cmd_memory_reindex(client: Client, args: argparse.Namespace, out: Output) -> int:
    started = time.monotonic()
    rebuilt = client.submit("memory.reindex")
    if out.format == "table" and out.console.is_terminal:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        # memory.reindex answers when the index is rebuilt; meanwhile daemon.status (on the
        # same connection: requests are pipelined) says how far it is.
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                      console=out.console, transient=True) as progress:
            task = progress.add_task("rebuilding the memory index", total=None)
            while not concurrent.futures.wait([rebuilt], timeout=0.25).done:
                index = client.call("daemon.status")["memory_index"]
                progress.update(task, description=f"rebuilding the memory index: "
                                                  f"{_index_line(index)}")
    index = rebuilt.result()
    out.emit(index, Lines([f"memory index {_index_line(index)}; rebuilt in "
                           f"{time.monotonic() - started:.1f} s"]))
    return 0


RATINGS = {"helpful": ("memory.feedback", "helpful", True),
           "unhelpful": ("memory.feedback", "helpful", False),
           "succeeded": ("memory.outcome", "succeeded", True),
           "failed": ("memory.outcome", "succeeded", False)}
"""A rating flag's method and params."""


def cmd_memory_rate(client: Client, args: argparse.Namespace, out: Output) -> int:
    method, name, value = RATINGS[args.rating]
    result = client.call(method, {"id": args.id, name: value})
    out.emit(result, Lines([f"memory {args.id}: confidence "
                            f"{confidence(result['memory']['confidence'])}"]))
    return 0


def cmd_memory_share(client: Client, args: argparse.Namespace, out: Output) -> int:
    scope = f"team:{args.team}" if args.team else f"org:{args.org}"
    result = client.call("memory.share", {"id": args.id, "scope": scope})
    out.emit(result, Lines([f"memory {args.id} shared with {scope} (it leaves through the "
                            "outbox: ctxctl status shows the team link)"]))
    return 0


def cmd_memory_rm(client: Client, args: argparse.Namespace, out: Output) -> int:
    if not args.yes:
        scope = client.call("memory.get", {"id": args.id})["memory"]["scope"]
        if scope.startswith(("team:", "org:")) and not _confirmed(args.id, scope):
            print(f"ctxctl: memory {args.id} is shared with {scope}: removing it removes it "
                  f"for everyone there; to do so, run `ctxctl memory rm {args.id} --yes`",
                  file=sys.stderr)
            return 2
    result = client.call("memory.delete", {"id": args.id})
    out.emit(result, Lines([f"memory {args.id} deleted"]))
    return 0


def _confirmed(memory_id: int, scope: str) -> bool:
    """Whether the user, at a terminal, says yes to removing a shared memory (no terminal:
    no)."""
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return False
    print(f"memory {memory_id} is shared with {scope}; remove it for everyone there? [y/N] ",
          end="", file=sys.stderr, flush=True)
    try:
        return input().strip().lower() in ("y", "yes")
    except (EOFError, KeyboardInterrupt):
        print(file=sys.stderr)  # the prompt's line ends
        return False


def add_memory(commands: Commands, common: Parser) -> None:
    """``memory …``."""
    actions = group(commands, "memory", common,
                    "search, add, list, show, rate, share, remove and reindex memories")
    scope_help = ("global or project:NAME (an agent's project is the folder it runs in: "
                  "project:$PWD)")
    memory_id = number_in(wire.MemoryIdParams, "id")
    search = actions.add_parser("search", parents=[common], help="find memories")
    search.add_argument("query", metavar="QUERY",
                        type=text_of(wire.MemorySearchParams, "query", "QUERY"),
                        help="what to look for, in words")
    search.add_argument("--scope", type=scope, metavar="SCOPE",
                        help=f"{scope_help} (a project also sees global ones)")
    search.add_argument("-k", type=number_in(wire.MemorySearchParams, "k"), metavar="N",
                        help="results wanted (default 5, at most 100)")
    search.add_argument("--min-confidence", metavar="X",
                        type=number_in(wire.MemorySearchParams, "min_confidence"),
                        help="hide memories below this confidence (0 to 1, default 0)")
    search.add_argument("--mode", choices=get_args(wire.SearchMode),
                        help="which retrievers to use (default hybrid)")
    search.set_defaults(run=cmd_memory_search)
    add = actions.add_parser("add", parents=[common], help="record a memory")
    add.add_argument("title", metavar="TITLE",
                     type=text_of(wire.MemoryRecordParams, "title", "TITLE", blank_ok=False))
    add.add_argument("content", metavar="CONTENT", help="the text, or - to read standard input")
    add.add_argument("--description", metavar="TEXT", help="when the memory applies",
                     type=text_of(wire.MemoryRecordParams, "description", "TEXT"))
    add.add_argument("--scope", type=scope, metavar="SCOPE", help=f"{scope_help} "
                                                                  "(default global)")
    add.add_argument("--outcome", choices=get_args(wire.Outcome),
                     help="whether what it records worked (default success)")
    add.add_argument("--tag", action="append", type=tag, help="a tag (repeat for more)")
    add.set_defaults(run=cmd_memory_add)
    listing = actions.add_parser("list", parents=[common], help="list memories, oldest first")
    listing.add_argument("--scope", type=scope, metavar="SCOPE",
                         help=f"{scope_help} (a project also lists global ones)")
    listing.add_argument("--limit", type=number_in(wire.MemoryListParams, "limit"), metavar="N",
                         help=f"memories per page (default {MEMORY_PAGE}, or {PAGE_ALL} with "
                              "--all)")
    listing.add_argument("--all", action="store_true", help="every page, not just the first")
    listing.add_argument("--cursor", type=cursor, metavar="CURSOR", help=CURSOR_HELP)
    listing.set_defaults(run=cmd_memory_list)
    show = actions.add_parser("show", parents=[common], help="one memory, whole")
    show.add_argument("id", metavar="ID", type=memory_id)
    show.set_defaults(run=cmd_memory_show)
    rate = actions.add_parser("rate", parents=[common], help="move a memory's confidence")
    rate.add_argument("id", metavar="ID", type=memory_id)
    ratings = rate.add_mutually_exclusive_group(required=True)
    for flag, help_text in (("helpful", "it helped"), ("unhelpful", "it did not help"),
                            ("succeeded", "acting on it succeeded"),
                            ("failed", "acting on it failed")):
        ratings.add_argument(f"--{flag}", dest="rating", action="store_const", const=flag,
                             help=help_text)
    rate.set_defaults(run=cmd_memory_rate)
    share = actions.add_parser(
        "share", parents=[common], help="share a memory with your team (or org)",
        description="Move a memory of this machine to a shared scope: the team database "
                    "([memory.team] in ctxd's config, ctxd.toml(5)) gets it, and every "
                    "teammate's ctxd finds it.",
        epilog="example:\n  ctxctl memory share 12 --team payments",
        formatter_class=ParagraphsFormatter)
    share.add_argument("id", metavar="ID", type=memory_id)
    whom = share.add_mutually_exclusive_group(required=True)
    whom.add_argument("--team", metavar="NAME", type=shared_name("team"),
                      help="the team (its scope team:NAME)")
    whom.add_argument("--org", metavar="NAME", type=shared_name("org"),
                      help="the organisation (its scope org:NAME)")
    share.set_defaults(run=cmd_memory_share)
    remove = actions.add_parser("rm", parents=[common], help="delete a memory")
    remove.add_argument("id", metavar="ID", type=memory_id)
    remove.add_argument("--yes", action="store_true",
                        help="remove a memory shared with a team or org without asking (at "
                             "a terminal it asks; elsewhere it refuses)")
    remove.set_defaults(run=cmd_memory_rm)
    reindex = actions.add_parser("reindex", parents=[common],
                                 help="rebuild the dense index from the stored memories")
    reindex.set_defaults(run=cmd_memory_reindex)
