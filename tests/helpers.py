"""Small helpers shared by the tests (no fixtures here: see conftest.py)."""

from __future__ import annotations

import re
import socket

import redis

from echomq.keyspace import QueueKeys, queue_keys


def now_ms(r: redis.Redis) -> int:
    """The server's clock, as the module reads it."""
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


# A fencing token as CLAIM hands it out: the row's new `attempts`, a dash,
# and 16 lowercase hex digits of fresh randomness.
TOKEN_RE = re.compile(r"(0|[1-9][0-9]*)-[0-9a-f]{16}")


def assert_token(token: bytes | str, attempts: int | None = None) -> str:
    """``token`` is a claim's token (for claim number ``attempts``, when given); returns it as str."""
    text = token.decode() if isinstance(token, bytes) else token
    match = TOKEN_RE.fullmatch(text)
    assert match, f"{text!r} is not a fencing token <attempts>-<16 hex>"
    if attempts is not None:
        assert int(match.group(1)) == attempts, f"{text!r} is not the token of claim {attempts}"
    return text


def forged_token(token: str) -> str:
    """The same claim number with another random part: what a holder the server forgot
    (a failover lost its claim) could hold.  The fence must refuse it."""
    counter, random_part = token.split("-", 1)
    flipped = "".join("0123456789abcdef"[(int(c, 16) + 1) % 16] for c in random_part)
    return f"{counter}-{flipped}"


def digest(r: redis.Redis) -> str:
    value = r.execute_command("DEBUG", "DIGEST")
    return value.decode() if isinstance(value, bytes) else str(value)


def put_active(
    r: redis.Redis, queue: str, job_id: str | bytes, attempts: int | None, deadline: int, **row: object
) -> QueueKeys:
    """A claimed job: its row and its lease.

    ``attempts`` is written both as the claim count and as the holder's
    token (the string of it): a hand-made row whose token is "3" is fenced
    exactly like one a claim made, so the tests can name tokens simply.
    """
    keys = queue_keys(queue)
    fields: dict[str, object] = {"state": "active", **row}
    if attempts is not None:
        fields["attempts"] = attempts
        fields.setdefault("token", attempts)
    r.hset(keys.job(job_id), mapping=fields)  # type: ignore[arg-type]
    r.zadd(keys.active, {job_id: deadline})
    return keys


def emq_configs(r: redis.Redis) -> dict[str, str]:
    """CONFIG GET emq.*, as text."""
    got = r.config_get("emq.*")
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else str(v))
        for k, v in got.items()
    }


def extend_args(keys: QueueKeys, job_id: str | bytes, token: object, lease: object) -> list[object]:
    return ["EMQ.EXTEND", keys.active, keys.job(job_id), job_id, token, lease]


def sweep_args(keys: QueueKeys, max_stalled: object = 1, limit: object = 100) -> list[object]:
    return ["EMQ.SWEEP", keys.active, keys.pending, keys.dead, keys.base, max_stalled, limit]


def cluster_args() -> list[str]:
    """Server options for a one-node cluster.  The cluster bus port is chosen
    here: by default it is the client port + 10000, which a free port picked
    above 55535 cannot have."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        bus = int(s.getsockname()[1])
    return ["--cluster-enabled", "yes", "--cluster-port", str(bus)]
