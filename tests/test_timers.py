"""InternalTimerService: ordering, dedup, deletion, firing by watermark and by processing
time, and timers as keyed state through real snapshot bytes, restored at other parallelisms."""

from __future__ import annotations

from typing import Any

import pytest

from chandy.core.state import ValueStateDescriptor
from chandy.core.time import MIN_TIMESTAMP
from chandy.state.handles import ByteStreamStateHandle, KeyGroupsStateHandle
from chandy.state.heap import HeapKeyedStateBackend, SerializedKeyedState
from chandy.state.key_groups import KeyGroupRange, assign_to_key_group
from chandy.storage.checkpoint_storage import StateReader
from chandy.task.processing_time import ProcessingTimeService
from chandy.task.timers import InternalTimer, InternalTimerService
from chandy.util.clock import ManualClock

MAX_PARALLELISM = 128


class Recorder:
    """A Triggerable that records what fired, with the backend's key at that moment,
    and runs an optional action inside the callback."""

    def __init__(self, backend: HeapKeyedStateBackend) -> None:
        self.backend = backend
        self.fired: list[tuple[str, int, Any, Any]] = []
        self.action: Any = None

    def _record(self, domain: str, timer: InternalTimer) -> None:
        assert self.backend.current_key == timer.key
        assert self.backend.current_index == assign_to_key_group(timer.key, MAX_PARALLELISM)
        self.fired.append((domain, timer.timestamp, timer.key, timer.namespace))
        if self.action is not None:
            self.action(domain, timer)

    def on_event_time(self, timer: InternalTimer) -> None:
        self._record("event", timer)

    def on_processing_time(self, timer: InternalTimer) -> None:
        self._record("processing", timer)


class Setup:
    def __init__(
        self, key_group_range: KeyGroupRange | None = None, clock: ManualClock | None = None
    ) -> None:
        self.backend = HeapKeyedStateBackend(key_group_range or KeyGroupRange(0, 127), MAX_PARALLELISM)
        self.clock = clock or ManualClock(start_ms=1_000)
        self.pts = ProcessingTimeService(self.clock)
        self.recorder = Recorder(self.backend)
        self.timers = InternalTimerService("user-timers", self.backend, self.pts, self.recorder)

    def at(self, key: Any) -> None:
        self.backend.set_current_key(key, assign_to_key_group(key, MAX_PARALLELISM))


@pytest.fixture
def s() -> Setup:
    return Setup()


def test_event_time_timers_fire_in_timestamp_order_up_to_the_watermark(s: Setup) -> None:
    for key, ts in [("a", 30), ("b", 10), ("c", 20), ("a", 5), ("b", 40)]:
        s.at(key)
        s.timers.register_event_time_timer(None, ts)
    assert s.timers.current_watermark() == MIN_TIMESTAMP
    s.timers.advance_watermark(20)
    assert s.recorder.fired == [("event", 5, "a", None), ("event", 10, "b", None), ("event", 20, "c", None)]
    assert s.timers.current_watermark() == 20
    assert s.timers.num_event_time_timers() == 2
    s.timers.advance_watermark(29)
    assert len(s.recorder.fired) == 3
    s.timers.advance_watermark(100)
    assert [f[1] for f in s.recorder.fired] == [5, 10, 20, 30, 40]
    assert s.timers.num_event_time_timers() == 0


def test_a_timer_is_kept_once_per_key_namespace_and_timestamp(s: Setup) -> None:
    s.at("a")
    s.timers.register_event_time_timer("w1", 10)
    s.timers.register_event_time_timer("w1", 10)  # duplicate
    s.timers.register_event_time_timer("w2", 10)  # other namespace
    s.at("b")
    s.timers.register_event_time_timer("w1", 10)  # other key
    assert s.timers.num_event_time_timers() == 3
    s.timers.advance_watermark(10)
    assert sorted(s.recorder.fired) == [
        ("event", 10, "a", "w1"),
        ("event", 10, "a", "w2"),
        ("event", 10, "b", "w1"),
    ]


def test_deleted_timers_do_not_fire_and_may_be_registered_again(s: Setup) -> None:
    s.at("a")
    s.timers.register_event_time_timer(None, 10)
    s.timers.register_event_time_timer(None, 20)
    s.timers.delete_event_time_timer(None, 10)
    s.timers.delete_event_time_timer(None, 99)  # never registered: nothing happens
    s.at("b")
    s.timers.delete_event_time_timer(None, 20)  # another key's timer is not touched
    assert s.timers.num_event_time_timers() == 1
    s.timers.advance_watermark(15)
    assert s.recorder.fired == []
    s.at("a")
    s.timers.register_event_time_timer(None, 10)
    s.timers.delete_event_time_timer(None, 10)
    s.timers.register_event_time_timer(None, 10)
    s.timers.advance_watermark(30)
    assert s.recorder.fired == [("event", 10, "a", None), ("event", 20, "a", None)]


def test_moving_a_timer_on_every_record_keeps_the_heap_bounded(s: Setup) -> None:
    s.at("k")
    for ts in range(10_000):
        s.timers.register_event_time_timer(None, ts + 1_000)
        s.timers.delete_event_time_timer(None, ts + 1_000)
    s.timers.register_event_time_timer(None, 5)
    assert s.timers.num_event_time_timers() == 1
    assert len(s.timers._event.heap) < 200
    s.timers.advance_watermark(20_000)
    assert s.recorder.fired == [("event", 5, "k", None)]


def test_a_callback_may_register_timers_for_its_key_and_due_ones_fire_in_the_same_advance(s: Setup) -> None:
    def action(domain: str, timer: InternalTimer) -> None:
        if timer.timestamp < 30:
            s.timers.register_event_time_timer(timer.namespace, timer.timestamp + 10)
        state = s.backend.get_partitioned_state(ValueStateDescriptor("seen"))
        state.update((state.value() or 0) + 1)  # the timer's key is current

    s.recorder.action = action
    s.at("a")
    s.timers.register_event_time_timer(None, 10)
    s.at("b")
    s.timers.register_event_time_timer(None, 25)
    s.timers.advance_watermark(30)
    assert s.recorder.fired == [
        ("event", 10, "a", None),
        ("event", 20, "a", None),
        ("event", 25, "b", None),
        ("event", 30, "a", None),
    ]
    assert s.timers.num_event_time_timers() == 1  # b's follow-up at 35
    seen = s.backend.get_partitioned_state(ValueStateDescriptor("seen"))
    s.at("a")
    assert seen.value() == 3
    s.at("b")
    assert seen.value() == 1


def test_processing_time_timers_fire_through_the_processing_time_service(s: Setup) -> None:
    s.at("a")
    s.timers.register_processing_time_timer(None, 1_100)
    s.at("b")
    s.timers.register_processing_time_timer(None, 1_050)
    s.timers.register_processing_time_timer(None, 1_050)
    s.at("c")
    s.timers.register_processing_time_timer(None, 1_300)
    # only the earliest due time is registered with the service
    assert s.pts.next_due_ms == 1_050
    assert s.timers.current_processing_time() == 1_000
    assert s.pts.fire_due() == 0
    s.clock.advance_ms(60)
    s.pts.fire_due()
    assert s.recorder.fired == [("processing", 1_050, "b", None)]
    assert s.pts.next_due_ms == 1_100
    s.clock.advance_ms(1_000)  # both remaining are due: fired in order in one pass
    s.pts.fire_due()
    assert s.recorder.fired[1:] == [("processing", 1_100, "a", None), ("processing", 1_300, "c", None)]
    assert s.pts.next_due_ms is None
    assert s.timers.num_processing_time_timers() == 0


def test_an_earlier_processing_time_timer_is_registered_at_once_and_deletion_is_respected(s: Setup) -> None:
    s.at("a")
    s.timers.register_processing_time_timer(None, 1_500)
    assert s.pts.next_due_ms == 1_500
    s.timers.register_processing_time_timer(None, 1_200)
    assert s.pts.next_due_ms == 1_200
    s.timers.delete_processing_time_timer(None, 1_200)
    s.clock.advance_ms(300)
    s.pts.fire_due()
    assert s.recorder.fired == []
    assert s.pts.next_due_ms == 1_500  # the next one was registered when nothing was due
    s.clock.advance_ms(300)
    s.pts.fire_due()
    assert s.recorder.fired == [("processing", 1_500, "a", None)]


def test_a_processing_time_callback_may_register_the_next_timer(s: Setup) -> None:
    def action(domain: str, timer: InternalTimer) -> None:
        if len(s.recorder.fired) < 3:
            s.timers.register_processing_time_timer(None, timer.timestamp + 100)

    s.recorder.action = action
    s.at("k")
    s.timers.register_processing_time_timer(None, 1_100)
    s.clock.advance_ms(150)
    s.pts.fire_due()
    assert [f[1] for f in s.recorder.fired] == [1_100]
    assert s.pts.next_due_ms == 1_200
    s.clock.advance_ms(1_000)
    s.pts.fire_due()  # 1200 fires and registers 1300, also due now
    assert [f[1] for f in s.recorder.fired] == [1_100, 1_200, 1_300]
    assert s.pts.next_due_ms is None


def test_timer_tables_are_not_user_state(s: Setup) -> None:
    with pytest.raises(ValueError, match="reserved for timers"):
        s.backend.get_partitioned_state(ValueStateDescriptor("_timer_state/event_user-timers"))


# ---------------------------------------------------------------------- snapshots


def snapshot_bytes(backend: HeapKeyedStateBackend) -> SerializedKeyedState:
    """What the checkpoint path stores: the synchronous copy, serialized, released."""
    snapshot = backend.snapshot()
    try:
        return snapshot.serialize()
    finally:
        snapshot.release()


def restored(states: list[SerializedKeyedState], key_group_range: KeyGroupRange, clock: ManualClock) -> Setup:
    """A fresh subtask for ``key_group_range`` restored from ``states`` the way
    ``OperatorChain._restore`` does it, with its timer service created afterwards."""
    setup = Setup.__new__(Setup)
    setup.backend = HeapKeyedStateBackend(key_group_range, MAX_PARALLELISM)
    handles = [
        KeyGroupsStateHandle(s.key_group_range, s.ranges, ByteStreamStateHandle("x", s.payload))
        for s in states
    ]
    setup.backend.restore(handles, StateReader())
    setup.clock = clock
    setup.pts = ProcessingTimeService(clock)
    setup.recorder = Recorder(setup.backend)
    setup.timers = InternalTimerService("user-timers", setup.backend, setup.pts, setup.recorder)
    return setup


def test_timers_set_before_a_snapshot_come_back_and_later_ones_do_not(s: Setup) -> None:
    s.at("a")
    s.timers.register_event_time_timer(None, 10)
    s.timers.register_processing_time_timer(None, 1_100)
    snapshot = s.backend.snapshot()
    # after the barrier: a new timer, a deletion and a firing change the live tables only
    s.at("b")
    s.timers.register_event_time_timer(None, 20)
    s.at("a")
    s.timers.delete_processing_time_timer(None, 1_100)
    s.timers.advance_watermark(10)
    serialized = snapshot.serialize()
    snapshot.release()
    back = restored([serialized], KeyGroupRange(0, 127), s.clock)
    assert back.timers.num_event_time_timers() == 1
    assert back.timers.num_processing_time_timers() == 1
    assert back.pts.next_due_ms == 1_100  # the restored processing-time timer is scheduled
    back.timers.advance_watermark(100)
    back.clock.advance_ms(200)
    back.pts.fire_due()
    assert back.recorder.fired == [("event", 10, "a", None), ("processing", 1_100, "a", None)]


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 2)])
def test_after_rescaling_each_timer_fires_once_on_the_subtask_owning_its_key_group(
    old: int, new: int
) -> None:
    clock = ManualClock(start_ms=1_000)
    keys = list(range(300))
    before = [Setup(KeyGroupRange.of_operator(MAX_PARALLELISM, old, i), clock) for i in range(old)]
    for key in keys:
        kg = assign_to_key_group(key, MAX_PARALLELISM)
        owner = next(b for b in before if kg in b.backend.key_group_range)
        owner.backend.set_current_key(key, kg)
        owner.timers.register_event_time_timer(("ns", key % 3), 100 + key)
        owner.timers.register_processing_time_timer(None, 2_000 + key)
    states = [snapshot_bytes(b.backend) for b in before]
    after = [restored(states, KeyGroupRange.of_operator(MAX_PARALLELISM, new, i), clock) for i in range(new)]
    assert sum(a.timers.num_event_time_timers() for a in after) == len(keys)
    for a in after:
        a.timers.advance_watermark(10_000)
    clock.advance_ms(5_000)
    for a in after:
        a.pts.fire_due()
    fired: list[tuple[str, int, Any, Any]] = []
    for a in after:
        for domain, ts, key, namespace in a.recorder.fired:
            assert assign_to_key_group(key, MAX_PARALLELISM) in a.backend.key_group_range
            fired.append((domain, ts, key, namespace))
        # each subtask fired its own timers in timestamp order
        event_ts = [f[1] for f in a.recorder.fired if f[0] == "event"]
        assert event_ts == sorted(event_ts)
    assert sorted(fired) == sorted(
        [("event", 100 + k, k, ("ns", k % 3)) for k in keys]
        + [("processing", 2_000 + k, k, None) for k in keys]
    )
