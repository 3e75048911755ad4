"""A device tier over the shards (angel.sparse.placement=worker with
angel.worker.table.capacity, learners/worker/device_tier.py): whatever the capacity and the
policy, the rows end exactly as when the worker holds the whole table (and as a numpy shard);
a capacity below one update's rows is refused by name; the keys and the placement."""

from __future__ import annotations

import collections
import time
from typing import Any

import numpy as np
import pytest
import torch

from angelconf.config import ConfigError, load_config
from angelps import OptimizerSpec, TableSpec
from angelps.client.tier_swap import swap_async
from angelps.partition import Partitioner
from angelps.server.shard import ParameterShard
from learners.job.loop_options import TrainPlan
from learners.job.sparse_placement import place_tables
from learners.keys import all_keys
from learners.worker.device_tier import TierPolicy
from learners.worker.held_tables import HeldTables
from learners.worker.tier_link import TierLink


class _Shards:
    """Shards in this process behind the real swap routing (angelps/client/tier_swap.py)."""

    def __init__(self, specs: list[TableSpec], n: int) -> None:
        self.specs = {s.name: s for s in specs}
        self.num_shards = n
        self.shards = [ParameterShard(i, n, specs) for i in range(n)]
        self.parts = {s.name: Partitioner(s, n, "hash") for s in specs}
        #: each shard's "process id" (a test restarts one by changing it); calls per shard
        self.pids = [1000 + i for i in range(n)]
        self.shard_pids: dict[int, int] = {}
        self.calls = [0] * n

    def swap_call(self, shard: int, writes: Any, reads: Any) -> Any:
        self.calls[shard] += 1
        return self.pids[shard], self.shards[shard].swap(writes, reads)

    def swap_answers(self, refs: list[Any]) -> list[Any]:
        return list(refs)

    def swap_async(self, writes: Any, reads: Any, every: bool = False) -> Any:
        return swap_async(self, writes, reads, every)  # type: ignore[arg-type]

    def rows(self, name: str, keys: np.ndarray) -> np.ndarray:
        return swap_async(self, {}, {name: keys}).result()[name]  # type: ignore[arg-type]


OPTS = [
    OptimizerSpec("sgd", l1=0.01, l2=0.1),
    OptimizerSpec("momentum", l2=0.01),
    OptimizerSpec("adam", l2=0.01),
    OptimizerSpec("adagrad", l1=0.001),
    OptimizerSpec("rmsprop", l1=0.001, l2=0.01),
    OptimizerSpec("ftrl", l1=0.1, l2=0.1),
]


def _steps(
    opt: OptimizerSpec,
    capacity: int | None,
    policy: TierPolicy | None = None,
    steps: int = 8,
    device: str = "cpu",
) -> tuple[np.ndarray, HeldTables]:
    """``steps`` updates (two micro-batches each, power-law ids) of a table held whole
    (``capacity`` None) or in a device tier of ``capacity`` rows over 2 shards; every row
    after them (with its optimizer state: the shards' whole rows after a flush)."""
    spec = TableSpec("e", 2000, 4, sparse=True, init="normal", init_std=0.1, optimizer=opt)
    shards = _Shards([spec], 2)
    tiers = {} if capacity is None else {"e": capacity}
    held = HeldTables(
        [spec],
        0,
        1,
        "hash",
        torch.device(device),
        "gloo",
        tiers,
        policy or TierPolicy(),
        lambda: shards,
    )
    rng = np.random.default_rng(7)
    for step in range(steps):
        for _ in range(2):
            ids = np.unique((rng.pareto(1.2, 90) * 20).astype(np.int64) % 2000)
            held.rows({"e": ids})
            g = rng.standard_normal((len(ids), 4)).astype(np.float32)
            held.add_grad("e", ids, torch.from_numpy(g).to(device))
        held.apply(0.5, 0.05 * (step + 1))
    held.settle()
    keys = np.arange(2000)
    if capacity is None:
        t = held.tables["e"]
        return t.data.cpu().numpy()[keys].copy(), held  # (local row = key, one owner)
    held.flush_tiers()
    return shards.rows("e", keys), held


@pytest.mark.parametrize("opt", OPTS, ids=lambda o: o.name)
def test_a_tier_smaller_than_the_table_trains_as_the_whole_table(opt: OptimizerSpec) -> None:
    want, _ = _steps(opt, None)
    got, held = _steps(opt, 200)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    tier = held.tiers["e"]
    assert tier.rows_held() <= 200


def _pair(
    capacity: int | None,
    same_ids: bool,
    prefetch: bool,
    policy: TierPolicy | None = None,
    astray: bool = False,
    device: str = "cpu",
    ask: bool = False,
    skip: frozenset[int] = frozenset(),
    flush: bool = True,
    two: bool = False,
    between: frozenset[int] = frozenset(),
) -> tuple[dict, HeldTables]:
    """Two tables keyed alike (FM's weights and factors: one book of slots in a tier), read
    with the same ids (or each with its own), updated in a thread while the next batch is
    prefetched (``ask``: its misses asked for as soon as the update's reads are done, as one
    worker's training does; the updates numbered in ``skip`` skipped, as a non-finite gradient
    makes the worker do, its next read a request of its own); every row after 10 updates
    (``flush`` False: none, the tier's write-backs left as they are). ``two`` (with ``ask``):
    the batch after the next one asked for as the next one is prefetched, as the worker does
    once its reads are staged (two swaps in flight; not at the last update, as at an epoch's
    end). After the prefetch of the updates numbered in ``between``, a save's flush and a read
    outside training come before the next read."""
    specs = [
        TableSpec("w", 3000, 1, sparse=True, optimizer=OptimizerSpec("momentum", l2=0.01)),
        TableSpec(
            "v",
            3000,
            4,
            sparse=True,
            init="normal",
            init_std=0.1,
            optimizer=OptimizerSpec("adam", l2=0.01),
        ),
    ]
    shards = _Shards(specs, 2)
    tiers = {} if capacity is None else {"w": capacity, "v": capacity}
    held = HeldTables(
        specs,
        0,
        1,
        "hash",
        torch.device(device),
        "gloo",
        tiers,
        policy or TierPolicy(),
        lambda: shards,
    )
    rng, ids_rng = np.random.default_rng(3), np.random.default_rng(5)

    def batch() -> dict[str, np.ndarray]:
        def draw() -> np.ndarray:
            return np.unique((ids_rng.pareto(1.1, 150) * 30).astype(np.int64) % 3000)

        a = draw()
        return {"w": a, "v": a if same_ids else draw()}

    nxt = batch()
    after = batch()
    asked = False  # (``after`` asked for by the last prefetch: two)
    for step in range(10):
        req = nxt
        got = held.rows(req)
        if ask and not asked:
            held.ask_ahead(after)
        asked = False
        if step in skip:
            held.clear()
            nxt, after = dict(after), batch()
            continue
        for n, spec in zip(("w", "v"), specs, strict=True):
            assert got[n].shape == (len(req[n]), spec.cols)
            g = rng.standard_normal((len(req[n]), spec.cols)).astype(np.float32)
            held.add_grad(n, req[n], torch.from_numpy(g).to(device))
        held.apply(1.0, 0.05)
        nxt, after = after, batch()
        if ask and two:
            asked = held.prefetch(nxt, after if step < 9 else None)
        elif ask:
            held.prefetch(nxt)  # (the same request: its misses were asked for already)
        elif prefetch:
            # astray: a prefetch for other ids than the next read's (the read must not lose
            # a row the prefetch chose to evict)
            held.prefetch(batch() if astray and rng.random() < 0.5 else nxt)
        if step in between:
            held.flush_tiers()
            held.train(False)
            held.rows({"w": np.arange(0, 3000, 7), "v": np.arange(0, 3000, 7)})
            held.train(True)
    held.settle()
    keys = np.arange(3000)
    if capacity is None:
        out = {n: held.tables[n].data.cpu().numpy()[keys].copy() for n in ("w", "v")}
        return out, held
    if not flush:
        return {}, held
    held.flush_tiers()
    return {n: shards.rows(n, keys) for n in ("w", "v")}, held


@pytest.mark.parametrize("eviction", ["lru", "lfu"])
@pytest.mark.parametrize("same_ids", [True, False], ids=["same-ids", "own-ids"])
@pytest.mark.parametrize(
    "prefetch,astray",
    [(True, False), (False, False), (True, True)],
    ids=["prefetch", "no-prefetch", "prefetch-astray"],
)
def test_tables_keyed_alike_share_one_tier_and_stay_exact(
    same_ids: bool, prefetch: bool, eviction: str, astray: bool
) -> None:
    """The capacity is near one update's reads (at most 99 ids, 144 for two tables read with
    their own ids): evicting a row pinned by the update in progress or by the next read would
    show in the rows."""
    cap = 160 if same_ids else 200
    want, _ = _pair(None, same_ids, prefetch, astray=astray)
    got, held = _pair(cap, same_ids, prefetch, TierPolicy(eviction), astray)
    for n in ("w", "v"):
        np.testing.assert_allclose(got[n], want[n], rtol=1e-5, atol=1e-7)
    assert len(held.books) == 1 and set(held.books[0].tables) == {"w", "v"}
    assert held.books[0].rows_held() <= cap
    counts = held.tier_counts()
    assert counts.writebacks > 0 and 0 < counts.hits < counts.lookups


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.gpu
@pytest.mark.parametrize("opt", OPTS, ids=lambda o: o.name)
def test_a_tier_on_a_gpu_trains_as_the_whole_table_on_the_cpu(opt: OptimizerSpec) -> None:
    want, _ = _steps(opt, None)
    got, _ = _steps(opt, 200, device="cuda")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.gpu
@pytest.mark.parametrize("eviction", ["lru", "lfu"])
def test_a_gpu_tier_evicting_and_placing_in_its_update_thread_is_exact(eviction: str) -> None:
    """On CUDA the update thread queues the update, the victims' copy down (written back once
    its event fired) and the prefetched misses' placement on the stream the next batch reads."""
    want, _ = _pair(None, True, True)
    got, held = _pair(160, True, True, TierPolicy(eviction), device="cuda")
    for n in ("w", "v"):
        np.testing.assert_allclose(got[n], want[n], rtol=1e-5, atol=1e-6)
    assert held.books[0].reads_placed_ahead > 0
    # staged reads, the batch after asked for before the next one's rows are put
    got, held = _pair(160, True, True, TierPolicy(eviction), device="cuda", ask=True, two=True)
    for n in ("w", "v"):
        np.testing.assert_allclose(got[n], want[n], rtol=1e-5, atol=1e-6)
    assert held.asked_two == 9 and held.books[0].reads_staged == 9


@pytest.mark.parametrize("policy", [TierPolicy("lru"), TierPolicy("lfu", 2)], ids=str)
def test_the_gpu_code_path_run_on_the_cpu_is_exact(
    monkeypatch: pytest.MonkeyPatch, policy: TierPolicy
) -> None:
    """The rows moved as a GPU moves them (torch's index_select/index_copy_, slots uploaded
    once a read, the victims taken down by take_host_async), the misses placed by the update
    thread ahead of the read or at the read: the same rows as the whole table, and the same
    hits, misses and write-backs either way."""
    from learners.worker import device, held_tables

    monkeypatch.setattr(device, "NUMPY_ROWS_ON_CPU", False)
    want, _ = _pair(None, True, True)
    runs = {}
    for place in (True, False):
        monkeypatch.setattr(held_tables, "PLACE_AHEAD", place)
        got, held = _pair(160, True, True, policy)
        assert held.books[0].tables["w"].rows._host is None  # (torch's path)
        for n in ("w", "v"):
            np.testing.assert_allclose(got[n], want[n], rtol=1e-5, atol=1e-7)
        c = held.tier_counts()
        runs[place] = (got, (c.lookups, c.hits, c.misses, c.writebacks))
        assert (held.books[0].reads_placed_ahead > 0) == place
        assert c.wait_s > 0.0  # (the reads or the placements were waited for)
        assert held.tier_counts().wait_s == 0.0  # (taken)
    for n in ("w", "v"):
        np.testing.assert_array_equal(runs[True][0][n], runs[False][0][n])
    assert runs[True][1] == runs[False][1]


@pytest.mark.parametrize("rows", ["numpy", "torch"])
@pytest.mark.parametrize("policy", [TierPolicy("lru"), TierPolicy("lfu", 2)], ids=str)
def test_misses_asked_for_during_the_update_before_are_exact(
    monkeypatch: pytest.MonkeyPatch, policy: TierPolicy, rows: str
) -> None:
    """One worker asks the shards for the next update's misses as soon as the current one's
    reads are done (ask_ahead), before that update is handed over: the hits it pins are the
    next update's, so the rows, hits, misses and write-backs are those of the prefetch made
    after the update (and the rows those of the whole table), on the CPU's row path and on
    the GPU's (run on the CPU). Asked so, the update thread asks, makes room and places the
    misses while the read goes on (staged: its blocks assembled from the rows held and the
    shards' answer); without, the misses are placed ahead of the read or at the read. With
    ``two``, the batch after is asked for before the next one's rows are put (its misses
    indexed first): two swaps in flight, the same rows, and as many hits or more (its room,
    knowing the batch after, evicts that batch's rows last: tests/learners/test_tier_lookahead.py)."""
    from learners.worker import device, held_tables

    monkeypatch.setattr(device, "NUMPY_ROWS_ON_CPU", rows == "numpy")
    want, _ = _pair(None, True, True)
    for place in (True, False):
        monkeypatch.setattr(held_tables, "PLACE_AHEAD", place)
        runs = {}
        for ask, two in ((True, False), (True, True), (False, False)):
            got, held = _pair(160, True, True, policy, ask=ask, two=two)
            for n in ("w", "v"):
                np.testing.assert_allclose(got[n], want[n], rtol=1e-5, atol=1e-7)
            c = held.tier_counts()
            runs[ask, two] = (got, (c.lookups, c.hits, c.misses, c.writebacks))
            assert held.asked_ahead == (10 if ask else 0)
            assert held.asked_two == (9 if two else 0)  # (not at the last update)
            book = held.books[0]
            assert book.reads_staged == (9 if ask else 0)  # (the 10th is not read)
            assert (book.reads_placed_ahead > 0) == (place and not ask)
        for key in ((True, True), (False, False)):
            for n in ("w", "v"):
                np.testing.assert_array_equal(runs[True, False][0][n], runs[key][0][n])
        assert runs[True, False][1] == runs[False, False][1]
        one, two = runs[True, False][1], runs[True, True][1]
        assert two[0] == one[0] and two[1] >= one[1] and two[1] + two[2] == two[0]
        assert runs[True, False][1][3] > 0  # (the tier evicted: 160 rows of 3000)


@pytest.mark.parametrize("two", [False, True], ids=["one-swap", "two-swaps"])
def test_a_staged_read_and_the_placement_of_its_misses_send_their_rows_up_once(
    monkeypatch: pytest.MonkeyPatch, two: bool
) -> None:
    """On the GPU's row path (run on the CPU), the update thread placing a staged read's
    misses and the training thread assembling that read's blocks use one upload of the
    shards' answer (TierLink.rows_on), not one each; exact as before."""
    from learners.worker import device, held_tables, tier_link

    monkeypatch.setattr(device, "NUMPY_ROWS_ON_CPU", False)
    monkeypatch.setattr(held_tables, "PLACE_AHEAD", True)
    want, _ = _pair(None, True, True)
    ups: collections.Counter[str] = collections.Counter()
    for mod in (device, tier_link):

        def counted(a: np.ndarray, d: torch.device, real=mod.to_device, at=mod.__name__):
            ups[at] += np.ndim(a) == 2  # (whole rows; slots and ids are 1-D)
            return real(a, d)

        monkeypatch.setattr(mod, "to_device", counted)
    got, held = _pair(160, True, True, ask=True, two=two)
    for n in ("w", "v"):
        np.testing.assert_allclose(got[n], want[n], rtol=1e-5, atol=1e-7)
    book = held.books[0]
    assert book.reads_staged == 9 and book.link.uploads == 10  # (the 10th placed, not read)
    assert ups["learners.worker.tier_link"] == 2 * book.link.uploads  # (w and v)
    # the first read, asked in its own step, fetches and places its misses itself; no staged
    # read sends rows up (each did, 18 more, before)
    assert ups["learners.worker.device"] == 2


@pytest.mark.parametrize("two", [False, True], ids=["one-swap", "two-swaps"])
@pytest.mark.parametrize("policy", [TierPolicy("lru"), TierPolicy("lfu", 2)], ids=str)
def test_updates_skipped_between_staged_reads_stay_exact(policy: TierPolicy, two: bool) -> None:
    """A skipped update (a non-finite gradient) unpins its rows while the update thread may
    still be making room for and placing the misses of its staged read: the rows stay those
    of the whole table, and the read after it (not staged) finds the rows asked for."""
    skip = frozenset({2, 3, 7})
    want, _ = _pair(None, True, True, skip=skip)
    got, held = _pair(160, True, True, policy, ask=True, skip=skip, two=two)
    for n in ("w", "v"):
        np.testing.assert_allclose(got[n], want[n], rtol=1e-5, atol=1e-7)
    c = held.tier_counts()
    assert c.lookups == c.hits + c.misses and c.writebacks > 0
    assert 0 < held.books[0].reads_staged < 9  # (the reads after a skip are not staged)


@pytest.mark.parametrize("two", [False, True], ids=["one-swap", "two-swaps"])
@pytest.mark.parametrize("policy", [TierPolicy("lru"), TierPolicy("lfu", 2)], ids=str)
def test_a_flush_and_a_read_outside_training_between_two_updates_stay_exact(
    policy: TierPolicy, two: bool
) -> None:
    """A save's flush and a validation's read between an update's prefetch and the next read
    (a mid-epoch checkpoint, a read of the rows trained so far), with the batch after the next
    one asked for already: the rows stay those of the whole table; the asks are kept."""
    between = frozenset({1, 4, 5})
    want, _ = _pair(None, True, True, between=between)
    got, held = _pair(160, True, True, policy, ask=True, two=two, between=between)
    for n in ("w", "v"):
        np.testing.assert_allclose(got[n], want[n], rtol=1e-5, atol=1e-7)
    assert held.asked_two == (9 if two else 0)


@pytest.mark.parametrize("rows", ["numpy", "torch"])
@pytest.mark.parametrize("policy", [TierPolicy("lru"), TierPolicy("lfu", 2)], ids=str)
def test_skips_flushes_and_reads_between_mixed_with_two_swaps_in_flight_stay_exact(
    monkeypatch: pytest.MonkeyPatch, policy: TierPolicy, rows: str
) -> None:
    """Skipped updates, saves' flushes and reads outside training in one run with two swaps in
    flight, on the CPU's row path and the GPU's (run on the CPU): the rows of the whole table."""
    from learners.worker import device

    monkeypatch.setattr(device, "NUMPY_ROWS_ON_CPU", rows == "numpy")
    skip, between = frozenset({2, 6}), frozenset({1, 3, 4, 7})
    want, _ = _pair(None, True, True, skip=skip, between=between)
    got, held = _pair(160, True, True, policy, ask=True, two=True, skip=skip, between=between)
    for n in ("w", "v"):
        np.testing.assert_allclose(got[n], want[n], rtol=1e-5, atol=1e-7)
    assert 0 < held.asked_two < 9 and held.tier_counts().writebacks > 0


def test_a_second_prefetch_while_the_update_thread_makes_room_stays_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A prefetch from the training thread (a request of its own) right after one the update
    thread serves (its room and placement may still run): the lookup waits for that work, so
    the rows stay those of the whole table (without the wait they went wrong)."""
    import threading

    from learners.worker.tier_evict import TierEvictions

    real, release = HeldTables.prefetch, TierEvictions._release

    def twice(self: HeldTables, req: Any, ahead: Any = None) -> bool:
        out = real(self, req, ahead)
        real(self, req)  # (the same ids, asked again from this thread)
        return out

    def slow_release(self: Any, victims: np.ndarray, wait: bool = True) -> Any:
        if threading.current_thread().name.startswith("held-update"):
            time.sleep(0.02)  # (the victims chosen, not yet released: the other thread runs)
        return release(self, victims, wait)

    want, _ = _pair(None, True, True)
    monkeypatch.setattr(HeldTables, "prefetch", twice)
    monkeypatch.setattr(TierEvictions, "_release", slow_release)
    for _ in range(3):
        got, _ = _pair(160, True, True, ask=True)
        for n in ("w", "v"):
            np.testing.assert_allclose(got[n], want[n], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("two", [False, True], ids=["one-swap", "two-swaps"])
def test_evicted_rows_go_back_with_the_next_ask_one_call_per_shard_an_update(two: bool) -> None:
    """The rows an update's room evicts are held until the tier's next swap, which writes
    them before it reads: one call per shard an update (not a write-back call beside the
    ask), exact even where the ask reads a row it writes back."""
    want, _ = _pair(None, True, True)
    got, held = _pair(160, True, True, ask=True, two=two)
    for n in ("w", "v"):
        np.testing.assert_allclose(got[n], want[n], rtol=1e-5, atol=1e-7)
    assert held.tier_counts().writebacks > 0
    shards = held.books[0].link.shards()
    # the first read, the ask of each of the 10 updates, the flush, the test's two reads
    assert shards.calls == [14, 14]


def test_write_backs_not_sent_yet_are_read_by_validation_and_dropped_by_a_restore() -> None:
    """Rows evicted but not yet sent are what a read outside training finds (its swap
    carries them); a restore drops them (the shards' restored rows stay)."""
    want, _ = _pair(None, True, True)
    _, held = _pair(160, True, True, ask=True, flush=False)
    link = held.books[0].link
    assert link._held  # (the last update's room evicted rows, not sent)
    held.train(False)
    keys = np.arange(3000)
    got = held.rows({"w": keys, "v": keys})
    np.testing.assert_allclose(got["v"].numpy(), want["v"][:, :4], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got["w"].numpy(), want["w"][:, :1], rtol=1e-5, atol=1e-7)
    held.train(True)

    _, held = _pair(160, True, True, ask=True, flush=False)
    shards = held.books[0].link.shards()
    assert held.books[0].link._held
    restored = {n: shards.rows(n, keys) for n in ("w", "v")}  # (the shards' rows now)
    held.reset_tiers()
    held.flush_tiers()
    for n in ("w", "v"):
        np.testing.assert_array_equal(shards.rows(n, keys), restored[n])


def test_tables_read_with_ids_of_their_own_are_not_staged() -> None:
    """A book whose tables read ids of their own (a union asked for) is not staged: its
    read waits for the room and placement, exactly as without the ask."""
    want, _ = _pair(None, False, True)
    got, held = _pair(200, False, True, ask=True)
    for n in ("w", "v"):
        np.testing.assert_allclose(got[n], want[n], rtol=1e-5, atol=1e-7)
    assert held.asked_ahead == 10 and held.books[0].reads_staged == 0


@pytest.mark.parametrize(
    "policy",
    [TierPolicy("lru", 1), TierPolicy("lfu", 1), TierPolicy("lru", 3), TierPolicy("lfu", 2)],
)
def test_every_policy_is_exact(policy: TierPolicy) -> None:
    want, _ = _steps(OPTS[2], None)
    got, held = _steps(OPTS[2], 180, policy)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    counts = held.tier_counts()
    assert counts.lookups == counts.hits + counts.misses
    assert 0 < counts.hits < counts.lookups
    assert counts.writebacks > 0


def test_a_tier_below_one_updates_rows_is_refused_by_name() -> None:
    with pytest.raises(
        ValueError,
        match=r"table 'e': its device tier of 60 rows \(angel.worker.table.capacity\) is below "
        r"the \d+ rows one update reads",
    ):
        _steps(OPTS[0], 60)


def test_reads_outside_training_pin_nothing_and_read_through() -> None:
    """Validation and prediction read more ids than the tier holds: the misses are read
    through (the shards' rows), and nothing is left pinned."""
    want, held = _steps(OPTS[1], 150)
    held.train(False)
    keys = np.arange(2000)
    got = held.rows({"e": keys})["e"].numpy()
    np.testing.assert_allclose(got, want[:, :4], rtol=1e-6)
    held.train(True)
    held.rows({"e": np.arange(100)})  # (the tier still has room for an update)


def test_validation_keeps_the_rows_training_holds_and_its_prefetch() -> None:
    """Reads outside training place nothing: the tier holds the same ids after them, and a
    prefetch of the next training batch made before them still serves that batch (no
    further call to the shards)."""
    _, held = _steps(OPTS[2], 150)
    shards = held.books[0].link.shards()
    calls: list[Any] = []
    real = shards.swap_call
    shards.swap_call = lambda *a: calls.append(a) or real(*a)
    book = held.books[0]
    before = book.held_ids()
    nxt = np.unique(np.concatenate([before[:40], np.arange(1900, 1950)]))
    held.prefetch({"e": nxt})
    held.settle()  # (room for its misses was made)
    before = book.held_ids()
    n_prefetch = len(calls)
    held.train(False)
    seen = held.rows({"e": np.arange(0, 2000, 3)})["e"]
    assert len(calls) > n_prefetch  # (its misses came from the shards)
    np.testing.assert_array_equal(book.held_ids(), before)
    held.train(True)
    n_valid = len(calls)
    got = held.rows({"e": nxt})["e"]
    assert len(calls) == n_valid  # the prefetch's rows, kept through validation
    for i, k in enumerate(np.arange(0, 2000, 3)):
        j = np.searchsorted(nxt, k)
        if j < len(nxt) and nxt[j] == k:
            np.testing.assert_array_equal(seen[i].numpy(), got[j].numpy())


def _plan(**sets: object) -> TrainPlan:
    return TrainPlan.from_config(load_config(None, sets, all_keys()))


TABLES = [
    TableSpec("wide", 1000, 1, sparse=True, optimizer=OptimizerSpec("adam")),
    TableSpec("wide_bias", 1, 1),
    TableSpec("embedding", 1000, 8, sparse=True, optimizer=OptimizerSpec("adam")),
    TableSpec("hashed", -1, 8, sparse=True),
]


def test_capacity_in_rows_tiers_the_tables_above_it() -> None:
    placed = place_tables(
        _plan(**{"angel.sparse.placement": "worker", "angel.worker.table.capacity": "600"}),
        TABLES,
    )
    assert placed.tiers == {"wide": 600, "embedding": 600, "hashed": 600}
    # the tiers' tables live on the shards; the bias is held whole with them
    assert [t.name for t in placed.ps] == ["wide", "embedding", "hashed"]
    assert [t.name for t in placed.whole()] == ["wide_bias"]
    placed = place_tables(
        _plan(**{"angel.sparse.placement": "worker", "angel.worker.table.capacity": "1000"}),
        TABLES,
    )
    assert placed.tiers == {"hashed": 1000}
    assert [t.name for t in placed.whole()] == ["wide", "embedding", "wide_bias"]
    where = placed.where()
    assert where["hashed"].startswith("on the shards, 1000 rows a worker on its device")


def test_capacity_auto_and_in_bytes_split_the_budget() -> None:
    known = TABLES[:3]
    plan = _plan(**{"angel.sparse.placement": "worker"})
    assert place_tables(plan, known, free=1 << 30).tiers == {}  # fits half of 1 GiB
    # Adam's rows: 1000 x (1 + 3) x 4 B and 1000 x (8 + 17) x 4 B, 116 kB; half of 58 kB
    # is 29 kB, a quarter of each table
    tiers = place_tables(plan, known, free=58_000).tiers
    assert tiers == {"wide": 250, "embedding": 250}
    plan = _plan(**{"angel.sparse.placement": "worker", "angel.worker.table.capacity": "58000B"})
    assert place_tables(plan, known).tiers == {"wide": 500, "embedding": 500}


@pytest.mark.parametrize(
    ("key", "value", "valid"),
    [
        ("angel.worker.table.capacity", "lots", "auto, a number of rows"),
        ("angel.worker.table.capacity", "0", "auto, a number of rows"),
        ("angel.worker.table.eviction", "fifo", "lru, lfu"),
        ("angel.worker.table.memory.fraction", "1.5", "a number in (0, 1]"),
    ],
)
def test_bad_tier_keys_are_refused_by_name(key: str, value: str, valid: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
        _plan(**{key: value})
    assert valid in str(e.value)


def test_a_skipped_update_leaves_no_row_pinned() -> None:
    """A skipped update (a non-finite gradient) reads rows and updates none: the next update
    may evict them; without the release it would count them against the capacity."""
    spec = TableSpec("e", 2000, 4, sparse=True, init="normal", init_std=0.1)
    shards = _Shards([spec], 1)
    held = HeldTables(
        [spec], 0, 1, "hash", torch.device("cpu"), "gloo", {"e": 120}, TierPolicy(), lambda: shards
    )
    held.rows({"e": np.arange(100)})
    held.clear()  # the update is skipped
    held.rows({"e": np.arange(100, 200)})  # 100 more rows: 80 of the first ones go
    g = torch.ones(100, 4)
    held.add_grad("e", np.arange(100, 200), g)
    held.apply(1.0, 0.1)
    held.settle()
    held.flush_tiers()
    want = ParameterShard(0, 1, [spec])
    want.push(0, 0, {"e": (np.arange(100, 200), np.ones((100, 4), np.float32))}, 0.1)
    np.testing.assert_allclose(
        shards.rows("e", np.arange(200))[:, :4],
        want.pull({"e": np.arange(200)})["e"],
        rtol=1e-6,
    )


def test_a_skipped_update_after_an_ask_reads_the_asked_rows_exactly() -> None:
    """The next update's misses asked for (ask_ahead), then the update skipped: the next one
    reads that batch from a request of its own (the worker's path after a skip) and finds
    its rows, the asked ones among them, as the shards have them."""
    spec = TableSpec("e", 2000, 4, sparse=True, init="normal", init_std=0.1)
    shards = _Shards([spec], 1)
    held = HeldTables(
        [spec], 0, 1, "hash", torch.device("cpu"), "gloo", {"e": 120}, TierPolicy(), lambda: shards
    )
    first = held.rows({"e": np.arange(100)})["e"].clone()
    held.ask_ahead({"e": np.arange(50, 150)})
    held.clear()  # the update is skipped
    got = held.rows({"e": np.arange(50, 150)})["e"]
    np.testing.assert_array_equal(got[:50].numpy(), first[50:].numpy())
    want = ParameterShard(0, 1, [spec])
    np.testing.assert_allclose(got.numpy(), want.pull({"e": np.arange(50, 150)})["e"], rtol=1e-6)
    held.add_grad("e", np.arange(50, 150), torch.ones(100, 4))
    held.apply(1.0, 0.1)
    held.settle()
    held.flush_tiers()
    want.push(0, 0, {"e": (np.arange(50, 150), np.ones((100, 4), np.float32))}, 0.1)
    np.testing.assert_allclose(
        shards.rows("e", np.arange(200))[:, :4], want.pull({"e": np.arange(200)})["e"], rtol=1e-6
    )


def _lfu_book(rows: int, capacity: int) -> Any:
    spec = TableSpec("e", rows, 2, sparse=True)
    shards = _Shards([spec], 1)
    held = HeldTables(
        [spec],
        0,
        1,
        "hash",
        torch.device("cpu"),
        "gloo",
        {"e": capacity},
        TierPolicy("lfu"),
        lambda: shards,
    )
    return held.books[0]


def test_lfu_counts_ids_exactly_where_the_id_range_is_small_enough() -> None:
    """A table whose id range is no larger than the sketch counts each id on its own: a rare
    id that shares a hashed counter with a hot one is not taken for hot (with 4 counters a
    row, such collisions cost the feed suite 8 points of hit rate: docs/device-tier.md)."""
    book = _lfu_book(50_000, 100)
    shift = np.uint64(64 - 16)  # (a hashed sketch of 2^16 counters)
    ids = np.arange(50_000, dtype=np.int64)
    h = (ids.view(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> shift
    order = np.argsort(h, kind="stable")
    dup = np.flatnonzero(h[order][1:] == h[order][:-1])[0]
    hot, rare = sorted(int(i) for i in order[dup : dup + 2])
    for _ in range(7):
        book.seen.add(np.array([hot]))
    book.seen.add(np.array([rare]))
    assert book.seen.of(np.array([rare])).tolist() == [1]
    book.seen.add(np.array([hot, rare]))
    assert book.seen.of(np.array([hot, rare])).tolist() == [8, 2]


def test_lfu_sketch_has_sixteen_counters_a_row_above_the_exact_range() -> None:
    """A table of a larger id range hashes its ids into at least 16 counters a row the tier
    holds (at most 2^24)."""
    book = _lfu_book(1 << 30, 10_000)
    assert not book.seen.exact and len(book.seen.table) == 1 << 18  # 16 x 10,000 -> 2^18
    assert _lfu_book(1 << 30, 2_000_000).seen.table.size == 1 << 24  # (32 x 2^20: at the cap)
    small = _lfu_book(100_000, 10_000)
    assert small.seen.exact and len(small.seen.table) == 100_000


def test_a_shard_restarted_unseen_is_found_at_the_flush_before_a_save() -> None:
    """A shard's backups leave the tier's table out, so a shard restarted from one lost the
    rows the tier wrote back: the flush before a checkpoint calls every shard, even one it
    has nothing to write to, and the one answering from a new process stops the save."""
    from angelps.client.tier_swap import TierLost

    _, held = _steps(OPTS[1], 150, steps=2)
    shards = held.books[0].link.shards()
    held.flush_tiers()  # (every shard seen: their process ids are known)
    before = list(shards.calls)
    held.reset_tiers()  # nothing held: nothing to write back to any shard
    held.flush_tiers()
    assert [c - b for c, b in zip(shards.calls, before, strict=True)] == [1, 1]
    shards.pids[1] += 7  # shard 1 restarted
    with pytest.raises(TierLost) as e:
        held.flush_tiers()
    assert str(e.value) == (
        "shard 1 restarted and may have lost rows of table 'e' that this worker's device tier "
        "wrote back to it"
    )


def test_a_shard_restarted_before_the_tier_s_first_call_is_found() -> None:
    """The process ids of the shards after the last load come with the PS client: a shard
    restarted before the tier first calls it is not taken for the one that loaded."""
    from angelps.client.tier_swap import TierLost

    spec = TableSpec("e", 2000, 4, sparse=True, init="normal", init_std=0.1)
    shards = _Shards([spec], 2)
    shards.shard_pids = {0: 1000, 1: 999}  # shard 1 was served by process 999 at the load
    held = HeldTables(
        [spec],
        0,
        1,
        "hash",
        torch.device("cpu"),
        "gloo",
        {"e": 150},
        TierPolicy(),
        lambda: shards,
    )
    with pytest.raises(TierLost, match=r"^shard 1 restarted"):
        held.rows({"e": np.arange(40)})


class _SlowAnswer:
    """A swap whose answer takes ``s`` seconds to come (a shard busy elsewhere)."""

    def __init__(self, s: float) -> None:
        self.s, self.pids = s, {0: 7}

    def result(self) -> dict[str, np.ndarray]:
        time.sleep(self.s)
        return {"w": np.zeros((1, 1), np.float32)}


class _OneShard:
    def __init__(self) -> None:
        self.shard_pids = {0: 7}

    def swap_async(self, writes: Any, reads: Any, every: bool = False) -> Any:
        return _SlowAnswer(0.05)


def test_the_training_thread_s_waits_for_the_shards_are_told_from_the_update_thread_s() -> None:
    """TierCounts.wait_shards_s (the training thread waiting for a shard's answer itself) and
    ahead_wait_s (the update thread's waits, asking ahead and placing) are counted apart."""
    link = TierLink("'w'", {"w": 4}, lambda: _OneShard())
    link.rows(link.swap({}, np.array([3])), timed=True)
    waited, ahead = link.take_waited()
    assert 0.05 <= waited < 1.0 and ahead == 0.0
    link.rows(link.swap({}, np.array([3])))
    link.rows(link.swap({}, np.array([4])))
    waited, ahead = link.take_waited()
    assert waited == 0.0 and 0.1 <= ahead < 2.0
    assert link.take_waited() == (0.0, 0.0)


def test_a_prefetch_pins_its_hits_and_nothing_for_its_misses() -> None:
    """The next read's rows held are pinned at its clock; its misses (slot -1) pin no row
    (they write a spare entry past the last slot, not the last slot)."""
    spec = TableSpec("e", 100, 2, sparse=True, optimizer=OptimizerSpec("sgd"))
    shards = _Shards([spec], 1)
    held = HeldTables(
        [spec], 0, 1, "hash", torch.device("cpu"), "gloo", {"e": 4}, TierPolicy(), lambda: shards
    )
    book = held.books[0]
    slots, hits = book.read(np.arange(4))
    assert slots is not None and hits == 0
    assert book.key_at[3] == 3  # (id 3 in the last slot)
    book.end_update()
    book.settled()
    book.prefetch(np.array([0, 50]))  # (0 held, 50 missing)
    assert book.used.tolist() == [2, 1, 1, 1]


@pytest.mark.parametrize("spread", [40, 1 << 23], ids=["histogram", "far-apart"])
def test_a_full_tier_s_lru_victims_are_the_oldest_rows_ties_by_slot(spread: int) -> None:
    """The eviction's choice from one histogram of every slot's clock is the counting
    selection over the old rows' clocks gathered first (the same slots, in the same order):
    rows pinned at ``below`` or later never, ties by slot, all the old rows where too few."""
    from learners.worker.tier_slots import lru_victims, smallest

    rng = np.random.default_rng(11)
    for _ in range(30):
        n = int(rng.integers(1, 400))
        below = int(rng.integers(2, 60)) + (spread if spread > 40 else 0)
        used = rng.integers(below - min(spread, below), below + 3, n).astype(np.int64)
        old = np.flatnonzero(used < below)
        for k in (1, 7, max(1, len(old) - 1), len(old), len(old) + 5):
            want = old[smallest(used[old], k)] if k < len(old) else old
            np.testing.assert_array_equal(lru_victims(used, below, k), want)
    assert lru_victims(np.full(5, 9, np.int64), 9, 3).size == 0  # (every row pinned)
