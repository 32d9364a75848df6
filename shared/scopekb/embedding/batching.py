"""Micro-batching of concurrent query embeddings (issue 20).

A local model runs one forward pass at a time (:class:`scopekb.embedding.local.LocalEmbedder` holds a lock across
each). With many searches in flight, each query then waited for every query ahead of it, one forward pass each:
under 32 concurrent hybrid searches the p95 grew with the queue. :class:`MicroBatcher` lets the calls that arrive
while a pass runs wait together and go through the next pass as one batch, so n queued queries cost about one
pass of n short sequences instead of n passes. No lock is held while a caller waits; the caller that finds no pass
running (the leader) runs the pass, then hands the lead to the first caller still waiting.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

#: Most queries one pass takes (more wait for the next pass).
MAX_BATCH = 32


class _Call:
    __slots__ = ("done", "error", "item", "lead", "result")

    def __init__(self, item: Any) -> None:
        self.item = item
        self.result: Any = None
        self.error: BaseException | None = None
        self.lead = False
        self.done = threading.Event()


class MicroBatcher:
    """Run ``run(items) -> results`` (same length, same order) on the items of concurrent :meth:`__call__`\\ s.

    Args:
        run: the batched function (e.g. one forward pass over several token-id sequences); an exception it raises
            is raised in every caller of that batch.
        max_batch: most items per ``run`` call.
    """

    def __init__(self, run: Callable[[Sequence[Any]], Sequence[Any]], max_batch: int = MAX_BATCH) -> None:
        self._run = run
        self._max = max(1, max_batch)
        self._mu = threading.Lock()
        self._waiting: list[_Call] = []
        self._busy = False
        #: Batches run and items they carried (for tests and metrics).
        self.batches = 0
        self.items = 0

    def __call__(self, item: Any) -> Any:
        """The result for ``item``; blocks until the batch that carries it has run."""
        me = _Call(item)
        with self._mu:
            self._waiting.append(me)
            if not self._busy:
                self._busy = me.lead = True
        while not me.lead:
            me.done.wait()
            if not me.lead:
                if me.error is not None:
                    raise me.error
                return me.result
        self._lead()
        if me.error is not None:
            raise me.error
        return me.result

    def _lead(self) -> None:
        with self._mu:
            batch, self._waiting = self._waiting[:self._max], self._waiting[self._max:]
        try:
            results = self._run([c.item for c in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"batched call returned {len(results)} results for {len(batch)} items")
            for c, r in zip(batch, results, strict=True):
                c.result = r
        except BaseException as e:  # noqa: BLE001 - every caller of the batch gets the error
            for c in batch:
                c.error = e
        finally:
            self.batches += 1
            self.items += len(batch)
            with self._mu:
                nxt = self._waiting[0] if self._waiting else None
                if nxt is None:
                    self._busy = False
                else:
                    nxt.lead = True
            for c in batch:
                c.lead = False
                c.done.set()
            if nxt is not None:
                nxt.done.set()
