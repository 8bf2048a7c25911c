"""The slot supervisor without Spark: real forked slot processes, a real control server
standing in for the driver, real SIGKILLs."""

from __future__ import annotations

import os
import queue
import signal
import socket
import threading
from collections.abc import Iterator

import pytest

from chandy.network.auth import new_secret
from chandy.network.framing import AuthenticatingAcceptor, FramedSocket, close_listener
from chandy.network.tcp import bind_data_listener
from chandy.runtime.spark.messages import RegisterSlot, Shutdown
from chandy.runtime.spark.slot import SlotBootstrap, SlotStartupError, SlotSupervisor
from tests.test_spark_executor import pid_alive


@pytest.fixture
def control_server() -> Iterator[socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    yield server
    close_listener(server)


def supervisor_for(driver_address: str, secret: bytes) -> tuple[SlotSupervisor, socket.socket]:
    listener, address = bind_data_listener("127.0.0.1")
    bootstrap = SlotBootstrap("job", 1, driver_address, secret, None, pool_id="pool-1")
    return SlotSupervisor(0, bootstrap, "127.0.0.1", listener, address, {0: address}), listener


def test_a_killed_slot_process_is_forked_again_and_registers_with_the_next_incarnation(
    control_server: socket.socket,
) -> None:
    secret = new_secret()
    host, port = control_server.getsockname()
    supervisor, listener = supervisor_for(f"{host}:{port}", secret)
    outcome: list[BaseException | None] = []

    def supervise() -> None:
        try:
            supervisor.run()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=supervise, daemon=True)
    thread.start()
    accepted: queue.Queue[FramedSocket] = queue.Queue()
    acceptor = AuthenticatingAcceptor(
        control_server, secret, "control", lambda connection, _: accepted.put(connection)
    ).start()
    opened: list[FramedSocket] = []
    try:
        first = accepted.get(timeout=60)
        opened.append(first)
        registered = first.recv_message()
        assert isinstance(registered, RegisterSlot)
        assert (registered.incarnation, registered.pool_id) == (0, "pool-1")
        assert registered.supervisor_pid == os.getpid() != registered.pid
        os.kill(registered.pid, signal.SIGKILL)

        second = accepted.get(timeout=60)
        opened.append(second)
        again = second.recv_message()
        assert isinstance(again, RegisterSlot)
        assert again.incarnation == 1 and again.pid != registered.pid
        assert again.data_address == registered.data_address  # the port its peers know
        assert not pid_alive(registered.pid)

        second.send_message(Shutdown("the test is over"))
        thread.join(30)
        assert not thread.is_alive()
        assert outcome == [None]  # told to stop: the Spark task ends normally
        assert not pid_alive(again.pid)
    finally:
        acceptor.close()
        for connection in opened:
            connection.close()
        listener.close()


def test_a_slot_process_that_cannot_start_fails_the_spark_task_with_the_reason() -> None:
    with socket.create_server(("127.0.0.1", 0)) as unused:
        nobody = f"127.0.0.1:{unused.getsockname()[1]}"
    supervisor, listener = supervisor_for(nobody, new_secret())  # no driver listens there
    try:
        with pytest.raises(SlotStartupError, match="could not start: ConnectionRefusedError"):
            supervisor.run()
    finally:
        listener.close()
