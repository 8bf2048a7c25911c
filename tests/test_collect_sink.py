"""The collect sink behind ``execute_and_collect()``: exactly-once across failover,
and a new job restored from a retained checkpoint does not re-deliver the old job's output."""

from __future__ import annotations

import pytest

from chandy import StreamExecutionEnvironment
from chandy.runtime.collect import CollectResultQueue
from chandy.task.operators.sink import CollectSinkOperator
from chandy.task.services import TaskServices
from tests.operator_harness import OperatorHarness


def _collect_sink(collect_id: str, queue: CollectResultQueue) -> OperatorHarness:
    operator = CollectSinkOperator(collect_id)
    operator.bind_task_services(TaskServices(results=queue), lambda: False)
    return OperatorHarness(operator)


def _drain(queue: CollectResultQueue) -> list[object]:
    queue.end(None)
    records: list[object] = []
    while (batch := queue.take()) is not None:
        records.extend(batch)
    return records


def test_records_are_published_only_when_their_checkpoint_completes() -> None:
    queue = CollectResultQueue()
    sink = _collect_sink("job-1", queue).open()
    sink.process(1, 2)
    sink.snapshot(1)
    sink.process(3)
    sink.snapshot(2)
    sink.notify_complete(1)
    assert _drain(queue) == [1, 2]


def test_a_failover_publishes_records_held_for_a_completed_checkpoint() -> None:
    queue = CollectResultQueue()
    sink = _collect_sink("job-1", queue).open()
    sink.process(1, 2)
    snapshot = sink.snapshot(1)
    # checkpoint 1 completed but the task failed before the notification reached it
    restarted = _collect_sink("job-1", queue).open([snapshot], restored_checkpoint_id=1)
    restarted.process(3)
    restarted.snapshot(2)
    restarted.notify_complete(2)
    assert _drain(queue) == [1, 2, 3]


def test_a_new_job_restored_from_a_retained_checkpoint_does_not_repeat_the_old_output() -> None:
    old_client = CollectResultQueue()
    old_job = _collect_sink("job-1", old_client).open()
    old_job.process(1, 2)
    retained = old_job.snapshot(1)
    old_job.notify_complete(1)
    assert _drain(old_client) == [1, 2]

    new_client = CollectResultQueue()
    new_job = _collect_sink("job-2", new_client).open([retained], restored_checkpoint_id=1)
    new_job.process(3)
    new_job.snapshot(2)
    new_job.notify_complete(2)
    assert _drain(new_client) == [3]


def test_a_reader_sees_the_end_even_when_closing_the_executor_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cleaning up after the job raised: the collect iterator and the job's result still end
    (they hung, waiting for an end that was never signalled)."""
    from chandy.runtime.local_executor import LocalExecutor

    def broken_close(self: LocalExecutor) -> None:
        raise OSError("the executor could not be closed")

    monkeypatch.setattr(LocalExecutor, "close", broken_close)
    env = StreamExecutionEnvironment.get_execution_environment(executor="local")
    with env:
        results = env.from_collection([1, 2, 3]).map(lambda x: x * 10).execute_and_collect()
        assert sorted(results) == [10, 20, 30]
        with pytest.raises(OSError, match="could not be closed"):
            results.job_client.get_job_execution_result()
