"""The Python surface: keyspace rules and the module-not-loaded error."""

from __future__ import annotations

import pytest

import echomq
from echomq import keyspace
from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory, needs

pytestmark = [pytest.mark.smoke, pytest.mark.memcheck]


def test_keyspace_names() -> None:
    keys = keyspace.queue_keys("mail")
    assert keys.base == "emq:{mail}:"
    assert keys.active == "emq:{mail}:active"
    assert (keys.pending, keys.dead) == ("emq:{mail}:pending", "emq:{mail}:dead")
    assert keys.metrics_failed == "emq:{mail}:metrics:failed"
    assert keys.job("42") == "emq:{mail}:job:42"
    assert keys.job(b"\xff") == b"emq:{mail}:job:\xff"


@pytest.mark.parametrize("name", ["a{b", "a}b", "{x}", ""])
def test_keyspace_refuses_names_that_break_the_hash_tag(name: str) -> None:
    with pytest.raises(ValueError):
        keyspace.queue_keys(name)


def test_client_refuses_bad_queue_before_sending(client: echomq.Client) -> None:
    with pytest.raises(ValueError):
        client.sweep("bad{name")
    with pytest.raises(ValueError):
        client.extend("bad}name", "j", token="1", lease_ms=10)


def test_module_not_loaded(server_factory: ServerFactory) -> None:
    """backend="module" insists on the module: a server without it is explained."""
    bare = server_factory(load_module=False)
    client = echomq.Client(bare.client(), backend="module")
    assert client.backend == "module"
    with pytest.raises(echomq.ModuleNotLoaded, match="--loadmodule"):
        client.sweep("mail")
    with pytest.raises(echomq.ModuleNotLoaded, match="--loadmodule") as info:
        client.extend("mail", "j", token="1", lease_ms=10)
    assert isinstance(info.value, echomq.EchoMQError)


@needs("script_flags", "the scripts backend needs Redis 7.0+ (script flags, Functions)")
def test_auto_picks_the_module_when_the_server_has_it_else_the_scripts(
    server: EmbeddedServer, server_factory: ServerFactory
) -> None:
    bare = server_factory(load_module=False)
    assert echomq.Client(server.client()).backend == "module"
    scripts = echomq.Client(bare.client())
    assert scripts.detect_backend() == "scripts" and scripts.backend == "scripts"
    assert scripts.sweep("mail") == echomq.SweepResult()
    job_id = scripts.enqueue("mail", b"x")
    job = scripts.claim("mail", lease_ms=1000)
    assert job is not None and job.id == job_id
    scripts.complete("mail", job.id, job.token)
    # Forced scripts on a server that has the module: they run beside it.
    forced = echomq.Client(server.client(), backend="scripts")
    assert forced.backend == "scripts" and forced.sweep("mail") == echomq.SweepResult()


def test_backend_is_checked(server: EmbeddedServer) -> None:
    with pytest.raises(ValueError, match="backend"):
        echomq.Client(server.client(), backend="lua")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_limit"):
        echomq.ScriptLimits(max_limit=0)


def test_from_url(server: EmbeddedServer) -> None:
    client = echomq.Client.from_url(server.url)
    assert client.sweep("fresh-queue") == echomq.SweepResult()


def test_module_is_listed(server: EmbeddedServer) -> None:
    # module_list(), not execute_command("MODULE", "LIST"): redis-py before 5.1 turns the
    # reply into dicts only for the former (RESP2 answers flat name/value lists)
    modules = server.client().module_list()
    assert b"emq" in [m[b"name"] for m in modules]


def test_command_flags_and_key_positions(server: EmbeddedServer) -> None:
    r = server.client()
    info = r.execute_command("COMMAND", "INFO", "emq.extend", "emq.sweep")
    extend, sweep = set(info["emq.extend"]["flags"]), set(info["emq.sweep"]["flags"])
    assert extend >= {"write", "fast"} and "denyoom" not in extend
    assert sweep >= {"write", "denyoom"} and "fast" not in sweep

    def getkeys(*args: str) -> list[str]:
        # str for RESP2 but bytes for RESP3 before redis-py 5.1: compare as text
        return [k.decode() if isinstance(k, bytes) else k for k in r.command_getkeys(*args)]

    assert getkeys("EMQ.EXTEND", "emq:{q}:active", "emq:{q}:job:1", "1", "1", "10") == [
        "emq:{q}:active",
        "emq:{q}:job:1",
    ]
    sweep_args = ("emq:{q}:active", "emq:{q}:pending", "emq:{q}:dead", "emq:{q}:", "1", "1")
    assert getkeys("EMQ.SWEEP", *sweep_args) == [
        "emq:{q}:active",
        "emq:{q}:pending",
        "emq:{q}:dead",
    ]
