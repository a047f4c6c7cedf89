"""Ranks as threads, for running a program's SPMD copies in one process."""

from __future__ import annotations

import threading


def run_ranks(world: int, barrier: threading.Barrier, rank_main) -> list:
    """``rank_main(rank)`` on ``world`` threads; their results in rank order. The first
    error aborts ``barrier`` (so no rank waits forever on a dead peer) and is raised."""
    results, errors = [None] * world, []

    def run(r: int):
        try:
            results[r] = rank_main(r)
        except BaseException as e:  # noqa: BLE001 - re-raised by the caller's thread
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
