"""MainThreadChecker: a bound checker refuses other threads; an unbound one accepts any."""

from __future__ import annotations

import threading

import pytest

from chandy.util.threads import MainThreadChecker, WrongThreadError


def _call_from_other_thread(checker: MainThreadChecker) -> BaseException | None:
    caught: list[BaseException] = []

    def call() -> None:
        try:
            checker.assert_main_thread()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            caught.append(exc)

    thread = threading.Thread(target=call, name="intruder")
    thread.start()
    thread.join()
    return caught[0] if caught else None


def test_a_bound_checker_refuses_another_thread_and_names_both() -> None:
    checker = MainThreadChecker("CheckpointCoordinator")
    checker.bind_to_current_thread()
    checker.assert_main_thread()
    error = _call_from_other_thread(checker)
    assert isinstance(error, WrongThreadError)
    assert "CheckpointCoordinator" in str(error) and "intruder" in str(error)
    assert threading.current_thread().name in str(error)


def test_an_unbound_or_released_checker_accepts_any_thread() -> None:
    checker = MainThreadChecker("JobMaster")
    assert _call_from_other_thread(checker) is None
    checker.bind_to_current_thread()
    checker.release()
    assert _call_from_other_thread(checker) is None


def test_is_main_thread_reports_without_raising() -> None:
    checker = MainThreadChecker("JobMaster")
    checker.bind_to_current_thread()
    assert checker.is_main_thread()
    with pytest.raises(WrongThreadError):
        checker._owner = threading.Thread(target=lambda: None)  # another owner
        checker.assert_main_thread()
