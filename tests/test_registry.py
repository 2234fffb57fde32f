"""The queue registry (issue 30; docs/reference/keyspace.md): every queue that ever had a job is
found, on both backends.

The first ENQUEUE or ENQUEUEMANY of a queue makes ``<base>queue`` (the server ms of that
enqueue, in the queue's slot: the same marker on a standalone server and in a cluster); the
OBLITERATE step that empties the queue deletes it.  ``client.queues()`` and the metrics exporter
find the markers with SCAN, so a queue that drained between two scans is still listed.
"""

from __future__ import annotations

import pytest
import redis

import echomq
from echomq import _protocol as proto
from echomq.keyspace import queue_keys
from echomq.metrics import QueueCollector

from .helpers import now_ms

pytestmark = pytest.mark.backends


def drain(client: echomq.Client, queue: str) -> None:
    while job := client.claim(queue, 60_000):
        client.complete(queue, job.id, job.token)


def test_a_queue_that_drained_is_still_listed(r: redis.Redis, client: echomq.Client) -> None:
    before = now_ms(r)
    client.enqueue("fast", b"x", "a")
    client.enqueue("fast", b"y", "b")
    client.enqueue_many("many", [b"1", b"2"])
    drain(client, "fast")
    drain(client, "many")
    client.retention("fast", done_ms=0)  # nothing of its jobs is left at all
    client.enqueue("fast", b"z", "c")
    drain(client, "fast")
    assert r.exists(queue_keys("fast").pending) == 0 and r.exists(queue_keys("fast").job("c")) == 0
    assert client.queues() == ["fast", "many"]
    marker = queue_keys("fast").base + "queue"
    assert before <= int(r.get(marker)) <= now_ms(r)  # the first enqueue's time, kept
    assert r.ttl(marker) == -1


def test_obliterate_takes_the_queue_out(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue("gone", b"x", "a")
    client.enqueue("kept", b"x", "a")
    assert client.queues() == ["gone", "kept"]
    client.obliterate("gone")
    assert client.queues() == ["kept"]
    assert not r.exists(queue_keys("gone").base + "queue")
    client.enqueue("gone", b"x", "b")  # a queue made again is listed again
    assert client.queues() == ["gone", "kept"]


def test_the_exporter_lists_a_queue_that_drained_before_its_first_scrape(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue("blink", b"x", "a")
    drain(client, "blink")
    collector = QueueCollector(client)
    assert collector.queues() == ["blink"]


def test_only_a_string_marker_names_a_queue(r: redis.Redis, client: echomq.Client) -> None:
    r.hset("emq:{odd}:queue", "f", "v")  # not the registry's: a hash
    r.set("emq:{fine}:queue", "1")
    assert client.queues() == ["fine"]
    assert proto.queue_of_key("emq:{fine}:queue") == "fine"
    assert proto.queue_of_key("emq:{fine}:queues") is None
