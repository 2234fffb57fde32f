"""Groups' Python and CLI surface (issue 45): ``set_group_limit``, ``pause_group``, ``resume_group``,
``group``, ``groups``; ``echomq group list|limit|pause|resume`` and the groups in ``inspect``.

Each call is one EMQ.GROUPLIMIT (``groups`` one snapshot: the index, the ring and every group
in one MULTI); the sync and asyncio clients share one surface; bad arguments raise before
anything is sent.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import redis

import echomq
import echomq.asyncio as aemq
from echomq.cli import main
from echomq.testing import EmbeddedServer, queue_problems

from ..helpers import digest

pytestmark = [pytest.mark.backends]

G = echomq.GroupInfo


def test_set_group_limit_pause_and_resume_answer_the_group_after_the_call(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue_many("q", [(f"a{i}", b"") for i in range(3)], group="a")
    assert client.group("q", "a") == G("a", waiting=3, active=0, max_active=None, paused=False)
    assert client.set_group_limit("q", "a", max_active=1) == G("a", 3, 0, 1, False)
    assert len(client.claim_many("q", 30_000, 10)) == 1  # the cap holds
    assert client.pause_group("q", "a") == G("a", 2, 1, 1, True)
    assert client.resume_group("q", "a") == G("a", 2, 1, 1, False)
    assert client.set_group_limit("q", "a", max_active=None) == G("a", 2, 1, None, False)
    assert len(client.claim_many("q", 30_000, 10)) == 2
    assert queue_problems(r, "q") == []


@pytest.mark.parametrize(
    ("group", "max_active", "error"),
    [
        ("a b", 1, ValueError),
        ("", 1, ValueError),
        (b"a", 1, TypeError),
        ("a", 0, ValueError),
        ("a", 1_000_000_001, ValueError),
        ("a", True, TypeError),
        ("a", 1.5, TypeError),
    ],
)
def test_bad_arguments_raise_before_anything_is_sent(
    r: redis.Redis, client: echomq.Client, group: object, max_active: object, error: type[Exception]
) -> None:
    before = digest(r)
    with pytest.raises(error, match=r"group|max_active"):
        client.set_group_limit("q", group, max_active=max_active)  # type: ignore[arg-type]
    with pytest.raises((ValueError, TypeError)):
        client.pause_group("q", "no spaces")
    assert digest(r) == before


def test_groups_lists_every_group_with_work_a_cap_or_a_pause(
    r: redis.Redis, client: echomq.Client
) -> None:
    assert client.groups("q") == []
    client.enqueue_many("q", [("a0", b""), ("a1", b"")], group="a")
    client.enqueue("q", b"", "b0", group="b")
    client.enqueue("q", b"", "plain")
    client.set_group_limit("q", "c", max_active=4)  # a setting alone
    client.pause_group("q", "a")
    jobs = client.claim_many("q", 30_000, 10)
    assert sorted(j.id for j in jobs) == ["b0", "plain"]  # a is paused
    assert client.groups("q") == [
        G("a", waiting=2, active=0, max_active=None, paused=True),  # out of the ring, still listed
        G("b", waiting=0, active=1, max_active=None, paused=False),  # only active: listed
        G("c", waiting=0, active=0, max_active=4, paused=False),
    ]
    assert client.counts("q").pending == 2  # the paused group's jobs count
    for j in jobs:
        client.complete("q", j.id, j.token)
    assert [g.name for g in client.groups("q")] == ["a", "c"]  # b left nothing behind
    assert queue_problems(r, "q") == []


def test_the_asyncio_client_has_the_same_surface(
    r: redis.Redis, server: EmbeddedServer, backend: str
) -> None:
    async def run() -> list[echomq.GroupInfo]:
        aclient = aemq.Client.from_url(server.url, backend=backend)
        try:
            await aclient.enqueue_many("q", [("a0", b""), ("a1", b"")], group="a")
            assert await aclient.set_group_limit("q", "a", max_active=1) == G("a", 2, 0, 1, False)
            assert await aclient.pause_group("q", "a") == G("a", 2, 0, 1, True)
            assert await aclient.claim("q", 30_000) is None
            assert await aclient.resume_group("q", "a") == G("a", 2, 0, 1, False)
            assert await aclient.group("q", "a") == G("a", 2, 0, 1, False)
            with pytest.raises(ValueError, match="max_active"):
                await aclient.set_group_limit("q", "a", max_active=0)
            return await aclient.groups("q")
        finally:
            await aclient.aclose()

    assert asyncio.run(run()) == [G("a", 2, 0, 1, False)]
    assert queue_problems(r, "q") == []


def test_the_cli_lists_caps_pauses_and_resumes_a_group(
    r: redis.Redis, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    def cli(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["--url", server.url, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    assert cli("group", "list", "q") == (0, "no groups in 'q'\n", "")
    echomq.Client(server.client()).enqueue_many("q", [("a0", b""), ("a1", b"")], group="tenant-1")
    code, out, _ = cli("group", "limit", "q", "tenant-1", "--max", "1")
    assert (code, out) == (0, "group tenant-1: 0 active of max 1, 2 waiting\n")
    code, out, _ = cli("group", "pause", "q", "tenant-1")
    assert (code, out) == (0, "group tenant-1: 0 active of max 1, 2 waiting, paused\n")
    code, out, _ = cli("group", "list", "q")
    assert code == 0 and out.splitlines()[0].split() == ["GROUP", "WAITING", "ACTIVE", "MAX", "PAUSED"]
    assert out.splitlines()[2].split() == ["tenant-1", "2", "0", "1", "yes"]
    code, out, _ = cli("group", "list", "q", "--json")
    listed = {"name": "tenant-1", "waiting": 2, "active": 0, "max_active": 1, "paused": True}
    assert json.loads(out) == [listed]
    code, out, _ = cli("inspect", "q")
    assert code == 0 and "groups" in out and "tenant-1" in out
    code, out, _ = cli("group", "resume", "q", "tenant-1")
    assert out == "group tenant-1: 0 active of max 1, 2 waiting\n"
    code, out, _ = cli("group", "limit", "q", "tenant-1", "--no-max")
    assert out == "group tenant-1: 0 active (no cap), 2 waiting\n"
    code, out, _ = cli("group", "limit", "q", "tenant-1")
    assert (code, out) == (0, "group tenant-1: 0 active (no cap), 2 waiting\n")
    code, _, err = cli("group", "limit", "q", "tenant-1", "--max", "1", "--no-max")
    assert code == 1 and "give one" in err
    code, _, err = cli("group", "pause", "q", "no spaces")
    assert code == 1 and "group must be" in err
    assert queue_problems(r, "q") == []
