"""Side-by-side timing without a GPU (CUDA events faked): every candidate is sampled each
round, and the rounds' orders balance carryover, so that each candidate comes right after
every other equally often (a kernel inherits the clock its predecessor's power draw left;
a fixed order biases every sample of a candidate alike)."""

import itertools

import pytest
import torch

from runtime import timing


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 10])
def test_balanced_orders_put_every_candidate_after_every_other(n):
    rows = timing.balanced_orders(n)
    assert all(sorted(r) == list(range(n)) for r in rows)
    pairs = [(x, y) for r in rows for x, y in zip(r, r[1:])]
    want = 1 if n % 2 == 0 else 2
    for x in range(n):
        for y in range(n):
            if x != y:
                assert pairs.count((x, y)) == want, (n, x, y, rows)


class _FakeEvent:
    clock = itertools.count()

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        self.t = next(self.clock)

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return float(other.t - self.t)


def test_side_by_side_samples_each_candidate_a_round_in_balanced_order(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    order = []
    labels = ["a", "b", "c", "d"]
    fns = {k: (lambda i, k=k: order.append(k) if i == 0 else None) for k in labels}
    timed = timing.side_by_side(fns, reps=3, per_group=3, warmup=0)  # rounds up to 4
    assert set(timed) == set(labels) and all(t > 0 for t in timed.values())
    rounds = [order[i:i + 4] for i in range(0, len(order), 4)]
    assert len(rounds) == 4 and all(sorted(r) == labels for r in rounds)
    follows = [(x, y) for r in rounds for x, y in zip(r, r[1:])]
    assert all(follows.count((x, y)) == 1 for x in labels for y in labels if x != y)


def test_copy_reference_is_the_faster_of_the_copy_timed_and_the_model(monkeypatch):
    from runtime import timing

    # 2 us fixed, 4e6 bytes a microsecond (4 TB/s)
    monkeypatch.setattr(timing, "copy_model", lambda dev: (2.0, 4e6))
    assert timing.copy_reference_us(400_000_000, 150.0, 0) == 102.0  # a slow-path copy
    assert timing.copy_reference_us(400_000_000, 95.0, 0) == 95.0  # faster than the model
    assert timing.copy_reference_us(0, 5.0, 0) == 2.0
    assert timing.copy_model_summary(0) == {"fixed_us": 2.0, "tbps": 4.0}
