"""The cooperative cancel token."""

from __future__ import annotations

import threading
import time

import pytest

from echomq import Cancellation, Cancelled, CancelToken, EchoMQError


def test_fresh_token_is_not_cancelled() -> None:
    token = CancelToken()
    assert token.check() is None
    assert not token.cancelled
    token.raise_if_cancelled()  # does not raise


def test_cancel_is_seen_with_its_reason() -> None:
    token = CancelToken()
    assert token.cancel("shutdown") is True
    c = token.check()
    assert isinstance(c, Cancellation) and c.reason == "shutdown"
    assert token.cancelled


def test_cancelled_without_reason_is_truthy() -> None:
    token = CancelToken()
    token.cancel()
    c = token.check()
    assert c is not None and c.reason is None
    assert bool(c) is True


def test_cancel_is_sticky_and_first_reason_wins() -> None:
    token = CancelToken()
    token.cancel("first")
    assert token.cancel("second") is False
    for _ in range(3):  # unlike the seed's mailbox, checking does not consume it
        c = token.check()
        assert c is not None and c.reason == "first"


def test_raise_if_cancelled_carries_the_reason() -> None:
    token = CancelToken()
    token.cancel("lease lost")
    with pytest.raises(Cancelled) as info:
        token.raise_if_cancelled()
    assert info.value.reason == "lease lost"
    assert isinstance(info.value, EchoMQError)
    assert "lease lost" in str(info.value)


def test_tokens_are_independent() -> None:
    a, b = CancelToken(), CancelToken()
    a.cancel("only a")
    assert b.check() is None
    b.raise_if_cancelled()


def test_cancel_from_another_thread_stops_a_checking_loop() -> None:
    token = CancelToken()
    iterations = 0
    stopped_with: list[str | None] = []

    def handler() -> None:
        nonlocal iterations
        while True:
            c = token.check()
            if c:
                stopped_with.append(c.reason)
                return
            iterations += 1

    worker = threading.Thread(target=handler)
    worker.start()
    time.sleep(0.05)
    token.cancel("from main")
    worker.join(timeout=5)
    assert not worker.is_alive()
    assert stopped_with == ["from main"] and iterations > 0


def test_raising_handler_in_another_thread() -> None:
    token = CancelToken()
    caught: list[Cancelled] = []

    def handler() -> None:
        try:
            while True:
                token.raise_if_cancelled()
                time.sleep(0.001)
        except Cancelled as exc:
            caught.append(exc)

    worker = threading.Thread(target=handler)
    worker.start()
    token.cancel("stop")
    worker.join(timeout=5)
    assert [c.reason for c in caught] == ["stop"]


def test_concurrent_cancels_keep_exactly_one_reason() -> None:
    token = CancelToken()
    barrier = threading.Barrier(8)
    winners: list[int] = []

    def canceller(n: int) -> None:
        barrier.wait()
        if token.cancel(f"r{n}"):
            winners.append(n)

    threads = [threading.Thread(target=canceller, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    c = token.check()
    assert c is not None and c.reason == f"r{winners[0]}"


def test_sleep_wakes_early_on_cancel() -> None:
    token = CancelToken()
    threading.Timer(0.05, token.cancel, args=("wake",)).start()
    started = time.monotonic()
    c = token.sleep(30)
    assert c is not None and c.reason == "wake"
    assert time.monotonic() - started < 20  # woke by cancel, not by the 30 s timeout


def test_sleep_returns_none_when_not_cancelled() -> None:
    assert CancelToken().sleep(0.01) is None
