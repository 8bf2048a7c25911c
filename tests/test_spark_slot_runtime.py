"""A slot process's control loop against a real driver socket: what it answers the driver."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from chandy.messages.checkpoint import (
    CheckpointFailureReason,
    CheckpointOptions,
    CheckpointType,
    DeclineCheckpoint,
)
from chandy.messages.ids import ExecutionAttemptID
from chandy.network.auth import new_secret
from chandy.network.framing import FramedSocket
from chandy.network.tcp import DataPlane, bind_data_listener
from chandy.runtime.spark.messages import ForwardedLogRecord, Heartbeat, TriggerCheckpoint
from chandy.runtime.spark.slot import SlotBootstrap, SlotRuntime


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Two ends of a loopback TCP connection (the driver's, the slot's)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    return accepted, client


@pytest.fixture
def slot() -> Iterator[tuple[SlotRuntime, FramedSocket]]:
    driver_end, slot_end = tcp_pair()
    secret = new_secret()
    listener, address = bind_data_listener("127.0.0.1")
    data = DataPlane(0, secret, listener, address, {})
    bootstrap = SlotBootstrap("job-1", 1, "127.0.0.1:1", secret, None)
    runtime = SlotRuntime(0, bootstrap, FramedSocket(slot_end), data)
    driver = FramedSocket(driver_end)
    try:
        yield runtime, driver
    finally:
        runtime.close()
        data.close()
        listener.close()
        driver.close()


def test_a_trigger_for_a_task_the_slot_does_not_run_is_declined_at_once(
    slot: tuple[SlotRuntime, FramedSocket],
) -> None:
    # Dropping it would leave the checkpoint pending until its timeout (10 minutes by
    # default) and every checkpoint queued behind it with it.
    runtime, driver = slot
    attempt = ExecutionAttemptID(3, 0, 7)
    options = CheckpointOptions(CheckpointType.CHECKPOINT, None, True)
    runtime._handle(TriggerCheckpoint(attempt, 42, 1000, options))
    driver.sock.settimeout(10)
    message = driver.recv_message()
    while isinstance(message, (Heartbeat, ForwardedLogRecord)):  # liveness and its log line
        message = driver.recv_message()
    assert isinstance(message, DeclineCheckpoint)
    assert (message.job_id, message.attempt_id, message.checkpoint_id) == ("job-1", attempt, 42)
    assert message.reason is CheckpointFailureReason.TASK_CHECKPOINT_FAILURE
    assert str(attempt) in message.message
