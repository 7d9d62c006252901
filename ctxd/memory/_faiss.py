"""FAISS as the memory index loads it: its OpenMP threads sleep, not spin, between parallel
regions. Every module of ctxd that uses FAISS imports it from here."""

import os

# FAISS's OpenMP threads spin for a while after each parallel region by default, taking a
# core from the store's thread and the event loop (p99 of a 10k-memory search 13.5 ms
# instead of 2.6 ms on two cores). Read once, when libgomp loads with faiss.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import faiss

__all__ = ["faiss"]
