"""The chaos suite: its fault-injecting filesystem, its exactly-once oracle, its faults timed
to a subtask finishing, and a short seeded subset of its runs on Spark and on the local
executor (the long run is ``python -m chaos --runs 200``)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chandy.core.time import MAX_WATERMARK
from chandy.errors import InvalidCheckpointError
from chandy.state.handles import FileStateHandle
from chandy.storage.checkpoint_storage import CheckpointStorage
from chandy.task.operators.process import KeyedProcessOperator
from chaos.batch_job import BATCH_WINDOW_SCHEMA, SUM_ONLY, event_times, jitter
from chaos.faultyfs import PLAN_DIR_NAME, SITE_METADATA, SITE_STATE, ArmedFault, FaultPlan, InjectedFault
from chaos.finishing import (
    MOMENTS,
    SITE_FINISH,
    FinishFaults,
    finish_params,
    finish_storage_params,
    last_ids,
)
from chaos.job import DISORDER_MS, EARLY, NO_ROW, EventTime, HoldWindows, _jitter, window_key
from chaos.suite import FAULT_KINDS, SPARK_ONLY, Fault, Runner, Scenario, make_scenario
from chaos.verify import check_batch_windows, check_rows, check_windows, expected_windows
from tests.operator_harness import KeyedOperatorHarness

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- faulty:// through chandy's storage


def storage(tmp_path: Path) -> tuple[CheckpointStorage, FaultPlan]:
    plan = FaultPlan.for_root(str(tmp_path))
    store = CheckpointStorage(f"faulty://{tmp_path}/checkpoints", "job", inline_threshold=0)
    store.initialize()  # its probe write never strikes
    return store, plan


def test_an_armed_write_fault_strikes_the_next_state_file_once(tmp_path: Path) -> None:
    store, plan = storage(tmp_path)
    plan.arm(ArmedFault("w", SITE_STATE, "raise"))
    with pytest.raises(InjectedFault, match="injected write failure"):
        store.write_state(1, b"x" * 100)
    handle = store.write_state(1, b"y" * 100)
    assert isinstance(handle, FileStateHandle)
    assert store.reader().read(handle, (0, 100)) == b"y" * 100
    fired = plan.fired("w")
    assert fired is not None and fired["pid"] == os.getpid() and "chk-1" in fired["path"]
    assert plan.disarm_all() == []


def test_a_metadata_fault_waits_for_metadata(tmp_path: Path) -> None:
    store, plan = storage(tmp_path)
    plan.arm(ArmedFault("m", SITE_METADATA, "raise"))
    store.write_state(2, b"state" * 10)
    assert plan.fired("m") is None
    with pytest.raises(InjectedFault):
        store.write_metadata(2, b"meta")
    assert not os.path.exists(f"{tmp_path}/checkpoints/job/chk-2/_metadata")
    assert store.write_metadata(3, b"meta") is not None


def test_a_torn_write_leaves_half_a_file_that_a_restore_refuses(tmp_path: Path) -> None:
    store, plan = storage(tmp_path)
    plan.arm(ArmedFault("p", SITE_STATE, "partial"))
    path = f"{tmp_path}/checkpoints/job/chk-4/state"
    fsspec.filesystem("faulty").makedirs(os.path.dirname(path), exist_ok=True)
    with pytest.raises(InjectedFault, match="torn write"):
        fsspec.filesystem("faulty").pipe_file(f"faulty://{path}", b"z" * 1000)
    assert os.path.getsize(path) == 500
    # had a handle to it been acknowledged, its checksum would refuse the half file
    torn = FileStateHandle(f"faulty://{path}", 1000, "0" * 64)
    with pytest.raises(InvalidCheckpointError, match="corrupt"):
        store.reader().read(torn, (0, 1000))


def test_a_state_write_that_fails_partway_leaves_no_file(tmp_path: Path) -> None:
    # As Flink's FsCheckpointStateOutputStream deletes its file when it fails: a task whose
    # write fails after its checkpoint was discarded (an old attempt, still snapshotting
    # after a failover) would otherwise leave the half file behind for good.
    store, plan = storage(tmp_path)
    plan.arm(ArmedFault("p", SITE_STATE, "partial"))
    with pytest.raises(InjectedFault, match="torn write"):
        store.write_state(4, b"z" * 1000)
    fired = plan.fired("p")
    assert fired is not None
    assert not os.path.exists(fired["path"])


def test_a_hanging_write_hangs_then_writes(tmp_path: Path) -> None:
    store, plan = storage(tmp_path)
    plan.arm(ArmedFault("h", SITE_STATE, "hang", hang_s=0.2))
    started = time.monotonic()
    handle = store.write_state(5, b"slow" * 10)
    assert time.monotonic() - started >= 0.2
    assert store.reader().read(handle, (0, 40)) == b"slow" * 10


def test_paths_outside_a_plan_never_strike(tmp_path: Path) -> None:
    plan = FaultPlan(str(tmp_path / "elsewhere" / PLAN_DIR_NAME))
    plan.arm(ArmedFault("x", SITE_STATE, "raise"))
    (tmp_path / "run").mkdir()
    store = CheckpointStorage(f"faulty://{tmp_path}/run/checkpoints", "job", inline_threshold=0)
    store.write_state(1, b"fine" * 10)
    assert plan.disarm_all() == ["x"]


_CLAIM = """
import sys
from chaos.faultyfs import FaultPlan
sys.stdout.write("won" if FaultPlan(sys.argv[1]).claim("user") else "lost")
"""


def test_exactly_one_of_several_processes_claims_a_fault(tmp_path: Path) -> None:
    plan = FaultPlan(str(tmp_path / "plan"))
    plan.arm(ArmedFault("u", "user", "raise"))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CLAIM, plan.directory], stdout=subprocess.PIPE, text=True, cwd=ROOT
        )
        for _ in range(4)
    ]
    outcomes = sorted(p.communicate(timeout=60)[0] for p in procs)
    assert outcomes == ["lost", "lost", "lost", "won"]


# ---------------------------------------------------------------- the oracle


def rows_of(order: list[int], keys: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """What an exact job emits for ids processed in ``order``."""
    counts: dict[int, int] = {}
    sums: dict[int, int] = {}
    out: tuple[list[int], list[int], list[int], list[int]] = ([], [], [], [])
    for i in order:
        k = i % keys
        counts[k] = counts.get(k, 0) + 1
        sums[k] = sums.get(k, 0) + i
        for column, value in zip(out, (i, k, counts[k], sums[k]), strict=True):
            column.append(value)
    return out


def test_the_oracle_passes_an_exact_output_in_any_order() -> None:
    ids, keys, counts, sums = rows_of(list(reversed(range(60))), 7)
    verdict = check_rows("s", ids, keys, counts, sums, 60, 7)
    assert verdict.exact and (verdict.lost, verdict.duplicated) == (0, 0)


def test_the_oracle_sees_a_replayed_record() -> None:
    ids, keys, counts, sums = rows_of([*range(30), 12, *range(30, 60)], 7)  # 12 counted twice
    verdict = check_rows("s", ids, keys, counts, sums, 60, 7)
    assert verdict.duplicated == 1 and not verdict.exact


def test_the_oracle_sees_a_lost_record_and_the_gap_it_leaves() -> None:
    ids, keys, counts, sums = rows_of(list(range(60)), 7)
    for column in (ids, keys, counts, sums):
        del column[20]
    verdict = check_rows("s", ids, keys, counts, sums, 60, 7)
    assert verdict.lost == 1
    assert any("counts are not" in p for p in verdict.problems)


def test_the_oracle_sees_state_restored_from_another_checkpoint_than_the_output() -> None:
    # every row once, but a key's sum jumps: its state came back without one id's update
    ids, keys, counts, sums = rows_of(list(range(60)), 7)
    sums[40] += 5
    verdict = check_rows("s", ids, keys, counts, sums, 60, 7)
    assert (verdict.lost, verdict.duplicated) == (0, 0)
    assert any("sum" in p for p in verdict.problems)


def test_event_time_keeps_every_source_split_within_the_watermarks_bound() -> None:
    # Each source subtask reads its split in id order; its watermark is the largest timestamp
    # seen minus DISORDER_MS, minus 1: no record may be at or below it (it would be late and
    # dropped, which the oracle would call a loss). And every split starts at event time 0.
    event_time = EventTime([3333, 3334, 3334])
    for start, end in ((0, 3333), (3333, 6667), (6667, 10_001)):
        assert event_time.of(start) < DISORDER_MS
        highest = -(2**63)
        for i in range(start, end):
            ts = event_time.of(i)
            assert ts > highest - DISORDER_MS - 1, (i, ts, highest)
            highest = max(highest, ts)
    assert len({event_time.of(i) - event_time.of(i - 1) for i in range(1, 3333)}) > 20  # out of order


def window_rows(expected: dict[tuple[int, int], tuple[int, int]]) -> tuple[list[int], ...]:
    """The rows an exact event-time branch commits, as columns (key, start, count, sum)."""
    columns: tuple[list[int], ...] = ([], [], [], [])
    for (key, start), (count, total) in sorted(expected.items(), reverse=True):
        for column, value in zip(columns, (key, start, count, total), strict=True):
            column.append(value)
    return columns


def test_the_window_oracle_passes_an_exact_output_and_sees_each_kind_of_error() -> None:
    expected = expected_windows([1500, 1500], 7, 100)
    assert len(expected) == 7 * 16  # 1500 ms (and the disorder) per split, in 100 ms windows
    assert sum(c for c, _ in expected.values()) == 3000 and sum(s for _, s in expected.values()) == sum(
        range(3000)
    )
    keys, starts, counts, sums = window_rows(expected)
    assert check_windows("w", keys, starts, counts, sums, expected).exact

    verdict = check_windows("w", keys[1:], starts[1:], counts[1:], sums[1:], expected)  # a window lost
    assert verdict.lost == 1 and not verdict.exact
    verdict = check_windows(
        "w", [*keys, keys[5]], [*starts, starts[5]], [*counts, counts[5]], [*sums, sums[5]], expected
    )
    assert verdict.duplicated == 1 and not verdict.exact  # a window (or its timer) fired twice
    wrong_sum = [*sums[:3], sums[3] + 11, *sums[4:]]  # a window restored without one record
    assert any(
        "wrong count or sum" in p
        for p in check_windows("w", keys, starts, counts, wrong_sum, expected).problems
    )
    early = [*counts[:2], EARLY, *counts[3:]]
    assert any(
        "before the watermark" in p for p in check_windows("w", keys, starts, early, sums, expected).problems
    )
    rowless = [*counts[:2], NO_ROW, *counts[3:]]
    assert any(
        "without their window's row" in p
        for p in check_windows("w", keys, starts, rowless, sums, expected).problems
    )
    stray = check_windows("w", [*keys, 0], [*starts, 10_000], [*counts, 1], [*sums, 0], expected)
    assert any("hold no record" in p for p in stray.problems)


def test_the_batch_job_stamps_each_id_with_the_record_jobs_event_time() -> None:
    sizes = [1200, 300, 2500]
    ids = np.arange(sum(sizes), dtype=np.int64)
    assert jitter(ids).tolist() == [_jitter(i) for i in range(sum(sizes))]
    assert event_times(ids, sizes).tolist() == [EventTime(sizes).of(i) for i in range(sum(sizes))]


def write_batch_windows(directory: Path, rows: list[tuple[int, int, int, int, int]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    columns = list(zip(*rows, strict=True))
    table = pa.table({name: list(col) for name, col in zip(BATCH_WINDOW_SCHEMA.names, columns, strict=True)})
    pq.write_table(table.cast(BATCH_WINDOW_SCHEMA), directory / "part-0.parquet")


def test_the_batch_window_oracle_judges_tumbling_counts_and_sums_and_sliding_sums(tmp_path: Path) -> None:
    sizes, keys, window = [1500, 1500], 7, 100
    tumbling = expected_windows(sizes, keys, window)
    sliding = expected_windows(sizes, keys, window, 2 * window)
    assert sum(c for c, _ in sliding.values()) == 2 * 3000  # every record in two sliding windows
    assert min(start for _, start in sliding) == -window
    exact = [(k, s, s + window, c, total) for (k, s), (c, total) in tumbling.items()]
    exact += [(k, s, s + 2 * window, SUM_ONLY, total) for (k, s), (_, total) in sliding.items()]
    write_batch_windows(tmp_path / "exact" / "windows", exact)
    assert all(v.exact for v in check_batch_windows(str(tmp_path / "exact"), sizes, keys, window))

    k, s, e, c, total = next(row for row in exact if row[2] - row[1] == 2 * window)
    broken = [row for row in exact if row[:2] != (k, s) or row[2] - row[1] != 2 * window]
    broken += [(k, s, e, c, total + 5), exact[0]]  # a sliding sum off, a tumbling window twice
    write_batch_windows(tmp_path / "broken" / "windows", broken)
    verdicts = {v.sink: v for v in check_batch_windows(str(tmp_path / "broken"), sizes, keys, window)}
    assert verdicts["windows"].duplicated == 1 and verdicts["windows"].lost == 0
    assert verdicts["sliding"].duplicated == 0
    assert any("wrong count or sum" in p for p in verdicts["sliding"].problems)

    write_batch_windows(tmp_path / "lost" / "windows", exact[1:])
    verdicts = {v.sink: v for v in check_batch_windows(str(tmp_path / "lost"), sizes, keys, window)}
    assert verdicts["windows"].lost == 1 and verdicts["sliding"].exact


def hold_windows(tmp_path: Path) -> KeyedOperatorHarness:
    function = HoldWindows(str(tmp_path / "plan"), 100)
    return KeyedOperatorHarness(KeyedProcessOperator(function), window_key).open_keyed()


def test_the_timer_function_holds_each_window_one_window_through_a_restore(tmp_path: Path) -> None:
    # window results arrive with their window's max timestamp: (key, count, sum)
    harness = hold_windows(tmp_path)
    harness.process_records([(1, 2, 30), (2, 1, 7)], [99, 99])
    harness.process_records([(1, 3, 40)], [199])
    harness.watermark(198)
    assert harness.values() == []  # held until the end of the window after each
    snapshot = harness.snapshot_keyed(1)
    harness.watermark(199)
    assert len(harness.values()) == 2  # fired before the failure; the restore fires them again
    restored = KeyedOperatorHarness(
        KeyedProcessOperator(HoldWindows(str(tmp_path / "plan"), 100)), window_key
    ).open_keyed([snapshot])
    restored.watermark(MAX_WATERMARK)
    assert sorted((r["key"], r["window_start"], r["count"], r["sum"]) for r in restored.values()) == [
        (1, 0, 2, 30),
        (1, 100, 3, 40),
        (2, 0, 1, 7),
    ]


def test_the_timer_function_shows_a_window_fired_twice(tmp_path: Path) -> None:
    harness = hold_windows(tmp_path)
    harness.process_records([(1, 2, 30), (1, 2, 30)], [99, 99])
    harness.watermark(MAX_WATERMARK)
    [row] = harness.values()
    assert (row["count"], row["sum"]) == (4, 60)  # the oracle calls it a wrong count and sum


def test_a_seed_is_a_replayable_schedule_of_the_allowed_kinds() -> None:
    assert make_scenario(7, FAULT_KINDS, 4) == make_scenario(7, FAULT_KINDS, 4)
    kinds = {
        f.kind for seed in range(50) for f in make_scenario(seed, ("kill-slot", "storage-hang"), 3).faults
    }
    assert kinds == {"kill-slot", "storage-hang"}
    assert all(2 <= make_scenario(s, FAULT_KINDS, 3).parallelism <= 3 for s in range(50))
    assert {make_scenario(s, FAULT_KINDS, 4).window_ms for s in range(50)} == {250, 500, 1000}


def test_a_mixed_seed_draws_its_path_last_and_keeps_every_other_draw() -> None:
    paths = set()
    for seed in range(40):
        mixed = make_scenario(seed, FAULT_KINDS, 4, "mixed")
        paths.add(mixed.path)
        assert dataclasses.replace(mixed, path="record") == make_scenario(seed, FAULT_KINDS, 4)
        assert make_scenario(seed, FAULT_KINDS, 4, "batch").path == "batch"
    assert paths == {"record", "batch"}
    with pytest.raises(ValueError, match="none of record, batch, mixed"):
        make_scenario(1, FAULT_KINDS, 4, "arrow")


def test_a_seed_draws_uneven_splits_both_backends_and_both_checkpoint_modes() -> None:
    scenarios = [make_scenario(s, FAULT_KINDS, 4) for s in range(60)]
    for scenario in scenarios:
        sizes = scenario.split_sizes
        assert len(sizes) == scenario.parallelism and sum(sizes) == scenario.records
        assert min(sizes) <= 0.4 * max(sizes) + 1  # the shortest split ends while the longest runs
    assert {s.backend for s in scenarios} == {"heap", "rocksdb"}
    assert {s.unaligned for s in scenarios} == {False, True}
    fired_kinds = {f.kind for s in scenarios for f in s.faults}
    assert {"finish-raise", "finish-kill", "finish-storage"} <= fired_kinds
    drawn = {(p["moment"], p["victim"]) for p in (finish_params(c / 100) for c in range(100))}
    assert drawn == {(m, v) for m in MOMENTS for v in ("self", "other")} - {("finished", "self")}


def test_a_storage_fault_aimed_at_a_final_checkpoint_waits_for_the_splits_to_end(tmp_path: Path) -> None:
    plan = FaultPlan(str(tmp_path / "plan"))
    plan.arm(ArmedFault("m", SITE_METADATA, "raise", params={"after_ended": 2}))
    assert plan.claim(SITE_METADATA) is None
    plan.mark("ended-9")
    assert plan.claim(SITE_METADATA) is None
    plan.mark("ended-19")
    fault = plan.claim(SITE_METADATA)
    assert fault is not None and fault.name == "m"


def finisher(plan_dir: str, subtask: int) -> FinishFaults:
    return FinishFaults(plan_dir, subtask, last_ids([10, 20]))


def test_a_finishing_subtask_raises_at_its_moment_itself(tmp_path: Path) -> None:
    plan = FaultPlan(str(tmp_path / "plan"))
    plan.arm(ArmedFault("f", SITE_FINISH, "raise", params={"moment": "final-snapshot", "victim": "self"}))
    subtask = finisher(plan.directory, 0)
    subtask.on_record(8)
    subtask.on_snapshot(3)  # before its last record: not its final checkpoint
    subtask.on_record(9)
    assert plan.marks("ended-") == ["ended-9"]
    with pytest.raises(RuntimeError, match="final checkpoint 4"):
        subtask.on_snapshot(4)
    fired = plan.fired("f")
    assert fired is not None and fired["struck"] and fired["subtask"] == 0


def test_a_finishing_subtask_waits_in_its_moment_until_another_one_raised(tmp_path: Path) -> None:
    plan = FaultPlan(str(tmp_path / "plan"))
    params = {"moment": "final-complete", "victim": "other"}
    plan.arm(ArmedFault("f", SITE_FINISH, "raise", params=params))
    first, other = finisher(plan.directory, 0), finisher(plan.directory, 1)
    first.on_record(9)
    first.on_snapshot(5)
    raised: list[str] = []

    def run_other() -> None:
        while not raised:
            try:
                other.on_record(15)
            except RuntimeError as exc:
                raised.append(str(exc))
            other.next_poll = 0.0
            time.sleep(0.002)

    thread = threading.Thread(target=run_other)
    thread.start()
    first.on_complete(5)  # returns once subtask 1 raised
    thread.join(10)
    assert raised and "as subtask 0 reached its final checkpoint 5's completion notice" in raised[0]
    fired = plan.fired("f")
    assert fired is not None and fired["struck"] and "subtask 1 raised" in fired["struck_by"]


def test_a_trigger_nobody_takes_is_withdrawn_and_the_fault_did_not_happen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("chaos.finishing.STRIKE_WAIT_S", 0.05)
    plan = FaultPlan(str(tmp_path / "plan"))
    plan.arm(ArmedFault("f", SITE_FINISH, "raise", params={"moment": "end-of-input", "victim": "other"}))
    finisher(plan.directory, 0).on_record(9)  # the last subtask running: nobody takes it
    fired = plan.fired("f")
    assert fired is not None and not fired["struck"] and "no other party" in fired["gave_up"]
    assert plan.take_trigger("raise") is None


# ---------------------------------------------------------------- seeded runs on Spark

SUBSET = {
    # a Spark task killed, then a process of the stage that replaces it (a failure during recovery)
    "kill-during-recovery": [
        Fault("kill-supervisor", 1.5, 0.2),
        Fault("kill-slot", 1.6, 0.7, in_recovery=True),
    ],
    "kill-slot-twice": [Fault("kill-slot", 1.2, 0.4), Fault("kill-slot", 1.3, 0.9, in_recovery=True)],
    "user-and-file-commit": [Fault("user-raise", 1.0, 0.2), Fault("commit-raise", 2.5, 0.1)],
    "state-write-raise-and-torn": [Fault("storage-raise", 0.8, 0.9), Fault("storage-partial", 2.5, 0.5)],
    "hang-metadata-delta-commit": [
        Fault("storage-hang", 0.8, 0.5),
        Fault("storage-raise", 1.2, 0.1),  # choice < 0.3: _metadata
        Fault("commit-raise", 1.6, 0.9),  # choice >= 2/3: the Delta sink
    ],
    # user-raise: 0.4 <= choice < 0.75 the event-time timer function, choice >= 0.75 the same among
    # the timers the end of input fires; commit-raise: 1/3 <= choice < 2/3 the event-time sink
    "timer-function-and-window-commit": [
        Fault("user-raise", 1.0, 0.6),
        Fault("commit-raise", 2.5, 0.5),
        Fault("user-raise", 3.0, 0.9),
    ],
}


@pytest.fixture(scope="module")
def runner(spark_session: Any, tmp_path_factory: pytest.TempPathFactory) -> Runner:
    return Runner(str(tmp_path_factory.mktemp("chaos")), "", timeout_s=150, session=spark_session)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SUBSET))
def test_a_seeded_chaos_run_is_exact(runner: Runner, name: str) -> None:
    seed = 1000 + list(SUBSET).index(name)
    scenario = Scenario(
        seed,
        2,
        200,
        24_000,
        50,
        6.0,
        0,
        [Fault(f.kind, f.at_s, f.choice, in_recovery=f.in_recovery) for f in SUBSET[name]],
    )
    result = runner.run(scenario)
    assert result.exact, result.line()
    assert result.restarts >= 1, result.line()
    assert [f for f in scenario.faults if not f.outcome.startswith("fired")] == [], result.line()


def finish_choice(moment: str, victim: str) -> float:
    """A ``choice`` that makes a finish-raise/finish-kill strike at ``moment`` in ``victim``."""
    drawn = ((c / 1000, finish_params(c / 1000)) for c in range(1000))
    return next(c for c, params in drawn if (params["moment"], params["victim"]) == (moment, victim))


def storage_choice(site: str, after: str, action: str) -> float:
    """A ``choice`` that makes a finish-storage fault the given one."""
    wanted = {"site": site, "after": after, "action": action}
    return next(c / 1000 for c in range(1000) if finish_storage_params(c / 1000) == wanted)


#: Runs whose source splits end at very different times, with faults timed to a subtask
#: finishing (armed before the first split ends, each strikes at the next moment it names):
#: (executor, split sizes, backend, unaligned, faults).
FINISHING: dict[str, tuple[str, tuple[int, ...], str, bool, list[Fault]]] = {
    # the other slot is SIGKILLed while subtask 0 snapshots its final checkpoint; the replay's
    # subtask 0 raises at its final checkpoint's completion notice; the job's final checkpoint
    # fails to write its _metadata
    "spark-final-checkpoint-kill-and-raise-rocksdb-unaligned": (
        "spark",
        (6_000, 18_000),
        "rocksdb",
        True,
        [
            Fault("finish-kill", 0.3, finish_choice("final-snapshot", "other")),
            Fault("finish-raise", 0.4, finish_choice("final-complete", "self")),
            Fault("finish-storage", 0.5, storage_choice(SITE_METADATA, "all", "raise")),
        ],
    ),
    # subtask 1 raises as subtask 0 reads its last record, a state file of subtask 0's final
    # checkpoint fails to write, and subtask 1 raises again once subtask 0 has finished
    "local-other-fails-as-it-ends-and-after-it-finished": (
        "local",
        (5_000, 19_000),
        "heap",
        True,
        [
            Fault("finish-raise", 0.3, finish_choice("end-of-input", "other")),
            Fault("finish-storage", 0.4, storage_choice(SITE_STATE, "first", "raise")),
            Fault("finish-raise", 0.5, finish_choice("finished", "other")),
        ],
    ),
    # three splits: another subtask raises in the final snapshot of the first to end, that one
    # raises at its own final checkpoint's completion, and the job's last _metadata write hangs
    "local-final-snapshot-and-completion-rocksdb": (
        "local",
        (3_000, 7_000, 14_000),
        "rocksdb",
        False,
        [
            Fault("finish-raise", 0.3, finish_choice("final-snapshot", "other")),
            Fault("finish-raise", 0.4, finish_choice("final-complete", "self")),
            Fault("finish-storage", 0.5, storage_choice(SITE_METADATA, "all", "hang")),
        ],
    ),
}


@pytest.fixture(scope="module")
def local_runner(tmp_path_factory: pytest.TempPathFactory) -> Runner:
    return Runner(str(tmp_path_factory.mktemp("chaos-local")), "", timeout_s=150, executor="local")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FINISHING))
def test_a_seeded_run_with_subtasks_finishing_is_exact(request: pytest.FixtureRequest, name: str) -> None:
    executor, sizes, backend, unaligned, faults = FINISHING[name]
    assert executor == "spark" or not any(f.kind in SPARK_ONLY for f in faults)
    chosen: Runner = request.getfixturevalue("runner" if executor == "spark" else "local_runner")
    scenario = Scenario(
        2000 + list(FINISHING).index(name),
        len(sizes),
        200,
        sum(sizes),
        50,
        6.0,
        0,
        [Fault(f.kind, f.at_s, f.choice) for f in faults],
        sizes=sizes,
        backend=backend,
        unaligned=unaligned,
    )
    result = chosen.run(scenario)
    assert result.exact, result.line()
    assert result.restarts >= 1, result.line()
    assert [f for f in scenario.faults if not f.outcome.startswith("fired")] == [], result.line()


@pytest.mark.slow
def test_a_seeded_batch_path_run_is_exact(local_runner: Runner) -> None:
    # The Arrow job on the local executor: another subtask raises while the first split to end
    # snapshots its final checkpoint, the running rows' function raises, the window sink's
    # commit raises, and the window rows' function raises among the windows only the end of
    # input fires.
    scenario = Scenario(
        3000,
        2,
        200,
        24_000,
        50,
        6.0,
        0,
        [
            Fault("finish-raise", 0.3, finish_choice("final-snapshot", "other")),
            Fault("user-raise", 0.5, 0.1),  # sum
            Fault("commit-raise", 1.0, 0.5),  # windows
            Fault("user-raise", 2.5, 0.9),  # timers-at-end
        ],
        window_ms=250,
        sizes=(6_000, 18_000),
        unaligned=True,
        path="batch",
    )
    result = local_runner.run(scenario)
    assert result.exact, result.line()
    assert [v.sink for v in result.verdicts] == ["parquet", "delta", "windows", "sliding"]
    assert result.restarts >= 1, result.line()
    assert [f for f in scenario.faults if not f.outcome.startswith("fired")] == [], result.line()


@pytest.mark.slow
def test_python_m_chaos_kills_an_executor_jvm_and_reports_the_run() -> None:
    # Two executor JVMs of two cores (the default for kill-jvm is four of one: twice the JVMs
    # to start on a 2-core machine) and seed 15, one of the shortest kill-jvm runs (5 s, one
    # kill, parallelism 2): the same path, a whole executor lost, at half the cost.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYSPARK_PYTHON", None)
    master = "local-cluster[2,2,1024]"
    done = subprocess.run(
        [
            sys.executable,
            *"-m chaos --only-seed 15 --path record --faults kill-jvm --timeout 200".split(),
            "--master",
            master,
        ],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
        cwd=ROOT,
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "kill-jvm@" in lines[-2] and "fired" in lines[-2] and "FINISHED exact" in lines[-2]
    assert lines[-1].startswith("chaos: 1/1 runs exact, ")


def test_the_snapshot_key_in_the_storage_root_is_not_a_leftover_checkpoint_file(tmp_path: Path) -> None:
    """A run without CHANDY_SNAPSHOT_KEY generates the key in its checkpoint root and keeps it
    (restores verify with it): the report must not count it, nor wait for it to go, while a
    checkpoint's own file left behind still counts."""
    from chandy.storage.snapshot_key import KEY_FILE_NAME
    from chaos.suite import _files_under

    (tmp_path / KEY_FILE_NAME).write_text("key")
    assert _files_under(str(tmp_path)) == []
    (tmp_path / "chk-3").mkdir()
    (tmp_path / "chk-3" / "_metadata").write_text("")
    assert _files_under(str(tmp_path)) == [os.path.join("chk-3", "_metadat")]
