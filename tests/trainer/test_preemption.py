from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from qosflow_trainer import EXIT_CHECKPOINTED, install_checkpoint_handler


@pytest.fixture(autouse=True)
def _restore_sigterm() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_sigterm_saves_then_exits_with_75() -> None:
    saved: list[str] = []
    handler = install_checkpoint_handler(lambda: saved.append("ckpt"))
    with pytest.raises(SystemExit) as exc:
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pthread_sigmask(signal.SIG_BLOCK, [])  # a bytecode boundary for the handler
    assert exc.value.code == EXIT_CHECKPOINTED == 75
    assert saved == ["ckpt"] and handler.requested
    handler.uninstall()


def test_signal_inside_critical_block_waits_for_the_block_end() -> None:
    events: list[str] = []
    handler = install_checkpoint_handler(lambda: events.append("save"))
    with pytest.raises(SystemExit), handler.critical():
        with handler.critical():  # nesting holds it too
            os.kill(os.getpid(), signal.SIGTERM)
            events.append("inner step done")
        events.append("outer step done")
    assert events == ["inner step done", "outer step done", "save"]
    handler.uninstall()


def test_custom_exit_code_and_uninstall_restores_previous_handler() -> None:
    marker = []

    def previous(signum: int, frame: object) -> None:
        marker.append(signum)

    signal.signal(signal.SIGTERM, previous)
    handler = install_checkpoint_handler(lambda: None, exit_code=3)
    with pytest.raises(SystemExit) as exc:
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert exc.value.code == 3
    handler.uninstall()
    assert signal.getsignal(signal.SIGTERM) is previous


def test_disarmed_handler_ignores_signals() -> None:
    saved: list[int] = []
    handler = install_checkpoint_handler(lambda: saved.append(1))
    handler.disarm()
    with handler.critical():
        os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert saved == [] and not handler.requested
    handler.uninstall()
