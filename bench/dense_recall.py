"""The dense leg's approximate index against the exact one: how much of the exact top 5 it
finds, and at what cost, as ``nprobe`` grows; beside it, an exact search by postings
(the hashing embedder's vectors are sparse: about 100 of 1,024 dimensions set).

In this process, on ``bench/memory.py``'s synthetic memories (the same writer: 20 project
scopes and ``global``) embedded by the daemon's hashing embedder, an IVF made as the
daemon makes it (``lists_for``, its codes, trained on every memory up to 100,000) and
searched as the daemon searches (k 50, within the bitmap of a project's scope and the
global one). The baseline is the exact top 5 (inner product of the 32-bit vectors) within
the same scope. Queries: ``memory.search``'s (4-10 words) and a branch's injection (a
description and a 1 KB prompt).

Run: ``python bench/dense_recall.py`` (about 2 minutes at 100,000 memories).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the daemon (ctxd/memory/_index.py)

import argparse
import sys
import time
from collections.abc import Sequence

import faiss
import numpy as np
from memory import PROJECTS, Writer
from rpc import machine_line, print_table

from ctxd.memory import CODES, HashingEmbedder, fix_code_range, lists_for

K = 5
CANDIDATES = 50  # what the dense leg asks FAISS for (ctxd/memory/_retrieval.py)


def main(argv: Sequence[str] | None = None) -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    cli.add_argument("--memories", type=int, default=100_000)
    cli.add_argument("--queries", type=int, default=300)
    args = cli.parse_args(argv)
    writer = Writer(seed=20251122)
    memories = [writer.memory() for _ in range(args.memories)]
    texts = ["\n".join([m["title"], m["description"], m["content"], " ".join(m["tags"])])
             for m in memories]
    embedder = HashingEmbedder()
    print(f"embedding {len(texts):,} memories ...", flush=True)
    vectors = np.concatenate([embedder.embed_sync(texts[i:i + 512])
                              for i in range(0, len(texts), 512)])
    scope = np.array([-1 if m["scope"] == "global" else int(m["scope"].rsplit("-", 1)[1])
                      for m in memories])
    project = 1
    within = np.flatnonzero((scope == -1) | (scope == project))
    bitmap = np.zeros((len(texts) + 7) // 8, np.uint8)
    np.bitwise_or.at(bitmap, within >> 3, (1 << (within & 7)).astype(np.uint8))
    selector = faiss.IDSelectorBitmap(len(bitmap), faiss.swig_ptr(bitmap))
    lists = lists_for(len(texts))
    quantizer = faiss.IndexFlatIP(vectors.shape[1])
    ivf = faiss.IndexIVFScalarQuantizer(quantizer, vectors.shape[1], lists, CODES,
                                        faiss.METRIC_INNER_PRODUCT)
    print(f"training an IVF of {lists:,} lists ...", flush=True)
    ivf.train(vectors[:100_000])
    fix_code_range(ivf)
    ivf.add_with_ids(vectors, np.arange(len(texts), dtype=np.int64))
    scoped = vectors[within]
    # The exact search by postings: each dimension's memories (of the scope) and values.
    dims, members = np.nonzero(scoped.T)
    values = scoped.T[dims, members]
    starts = np.searchsorted(dims, np.arange(vectors.shape[1] + 1))
    queries = {
        "memory.search query (4-10 words)": [writer.query(texts) for _ in range(args.queries)],
        "injection (description + 1 KB prompt)": [
            writer.sentence(6, 12) + "\n" + writer.prompt(1024) for _ in range(args.queries)]}
    rows: list[tuple[str, ...]] = [("queries", "search", "exact top 5 found", "p50 / p99")]
    for name, texts_of_queries in queries.items():
        embedded = embedder.embed_sync(texts_of_queries)
        exact = [set(within[np.argsort(-(scoped @ q), kind="stable")[:K]].tolist())
                 for q in embedded]

        def measure(search: object, label: str, exact: list[set[int]] = exact,
                    embedded: np.ndarray = embedded, name: str = name) -> None:
            found, seconds = 0, []
            for q, best in zip(embedded, exact, strict=True):
                began = time.perf_counter()
                top = search(q)  # type: ignore[operator]
                seconds.append(time.perf_counter() - began)
                found += len(best & set(top[:K]))
            samples = np.array(seconds) * 1e3
            rows.append((name, label, f"{found / (K * len(exact)):.1%}",
                         f"{np.percentile(samples, 50):.2f} / "
                         f"{np.percentile(samples, 99):.2f} ms"))

        for nprobe in (64, 128, 256, 512):
            params = faiss.SearchParametersIVF()
            params.nprobe, params.sel = nprobe, selector

            def by_ivf(q: np.ndarray, params: object = params) -> list[int]:
                _, ids = ivf.search(q[None, :], CANDIDATES, params=params)
                return ids[0].tolist()

            measure(by_ivf, f"IVF, nprobe {nprobe}" + (" (the default)" if nprobe == 64
                                                        else ""))

        def by_postings(q: np.ndarray) -> list[int]:
            set_dims = np.flatnonzero(q)
            docs = np.concatenate([members[starts[d]:starts[d + 1]] for d in set_dims])
            weights = np.concatenate([values[starts[d]:starts[d + 1]] * q[d]
                                      for d in set_dims])
            scores = np.bincount(docs, weights, minlength=len(within))
            top = np.argpartition(-scores, CANDIDATES)[:CANDIDATES]
            return within[top[np.argsort(-scores[top], kind="stable")]].tolist()

        measure(by_postings, "exact, by postings (numpy)")
    print()
    print(machine_line("ctxd dense leg: approximate against exact"))
    print(f"{len(texts):,} memories, {PROJECTS} projects and global; a project's scope holds "
          f"{len(within):,}; {vectors.astype(bool).sum(1).mean():.0f} of "
          f"{vectors.shape[1]:,} dimensions set per memory (mean)")
    print()
    print_table(rows)


if __name__ == "__main__":
    sys.exit(main())
