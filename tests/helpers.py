"""Small helpers shared by the tests (no fixtures here: see conftest.py)."""

from __future__ import annotations

import json
import re
import socket
from collections import defaultdict
from typing import Any

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


def counter(token: str) -> int:
    """The claim's number in a token ("<attempts>-<hex>"): a later claim has a larger one."""
    return int(token.split("-")[0])


def check_resumes(
    events: list[dict[str, Any]], rows: dict[str, dict[bytes, bytes]], steps: int | None = None
) -> int:
    """Every claim resumed from a state at or after the last one confirmed before it, never a stale one.

    For the chaos tests (issue 16).  ``events`` are the workers' history:
    ``start`` (job, token, the step it resumed from and the token that stored
    it, or None) and ``confirmed`` (job, token, step).  A state is (the
    writer claim's counter, step); states order by writer, then step.  Claim
    k must resume from a state written by an earlier claim and no older than
    any confirmed by claims before k.  And once claim j took the job, only j
    (or a later claim) may change its state: every claim j between the
    writer w and k saw exactly the state k got (a stale holder's write, w's
    landing after j's claim, would show as a newer step of w's).  The state a
    done job ends with passes the same checks, names the claim that stored it
    (``checkpoint_attempt``), and with ``steps`` is the last step (when no
    fault can keep a checkpoint from being confirmed).  Returns how many
    claims resumed mid-job.
    """
    confirmed: dict[str, list[tuple[int, int]]] = defaultdict(list)
    seen: dict[str, dict[int, tuple[int, int]]] = defaultdict(dict)  # job -> claim -> the state it got
    for e in events:
        if e["event"] == "confirmed":
            confirmed[e["job"]].append((counter(e["token"]), e["step"]))
        elif e["event"] == "start":
            got = (counter(e["writer"]), e["step"]) if e["writer"] is not None else (0, 0)
            seen[e["job"]][counter(e["token"])] = got

    def check(job: str, k: int, got: tuple[int, int]) -> None:
        floor = max((c for c in confirmed[job] if c[0] < k), default=(0, 0))
        assert got[0] < k, f"{job}: claim {k} resumed from a state of claim {got[0]}"
        assert got >= floor, f"{job}: claim {k} resumed from {got}, older than the confirmed {floor}"
        for j, state in seen[job].items():
            if got[0] < j < k:
                assert state == got, f"{job}: claim {j} saw {state}, then claim {k} got {got}: a stale write"

    resumed = 0
    for job, claims in seen.items():
        for k, got in claims.items():
            check(job, k, got)
            resumed += got[1] > 0
    for job, row in rows.items():
        if row.get(b"state") == b"done" and b"checkpoint" in row:
            state = json.loads(row[b"checkpoint"])
            writer = counter(state["data"]["token"])
            assert row[b"checkpoint_attempt"] == str(writer).encode(), (job, row)
            check(job, int(row[b"attempts"]) + 1, (writer, state["step"]))
            assert steps is None or state["step"] == steps, (job, row)
        elif row.get(b"state") == b"done":
            assert steps is None, f"{job} is done without a stored state: {row}"
    return resumed


# -- the v3 keyspace: where a job waits (docs/reference/keyspace.md) ------------------------

SEQ_LIMIT = 2**42  # <base>priority's scores: (level + 1024) * 2^42 + seq


def put_waiting(
    r: redis.Redis,
    queue: str,
    job_id: str | bytes,
    *,
    priority: int = 0,
    due: int | None = None,
    head: bool = False,
    **row: object,
) -> QueueKeys:
    """A waiting job as ENQUEUE (``head``: a RELEASE or a sweep's recovery) leaves it: its row, and
    its id in its lane -- ``pending``'s tail (or head), ``priority`` at the next seq (seq 0 at the
    head: below every seq a verb gives a job put back), or ``delayed`` until ``due``."""
    keys = queue_keys(queue)
    fields: dict[str, object] = {"state": "pending", **row}
    if priority:
        fields["priority"] = priority
    r.hset(keys.job(job_id), mapping=fields)  # type: ignore[arg-type]
    if due is not None:
        r.zadd(keys.delayed, {job_id: due})
    elif priority:
        seq = 0 if head else int(r.hincrby(keys.meta, "seq", 1))
        r.zadd(keys.priority, {job_id: (priority + 1024) * SEQ_LIMIT + seq})
    elif head:
        r.lpush(keys.pending, job_id)
    else:
        r.rpush(keys.pending, job_id)
    return keys


def entries(r: redis.Redis, keys: QueueKeys) -> list[bytes]:
    """``pending``'s entries, head first, tombstones included."""
    return [bytes(e) for e in r.lrange(keys.pending, 0, -1)]


def waiting(r: redis.Redis, keys: QueueKeys) -> list[bytes]:
    """The ids a claim would take, in its order: the levels below 0, ``pending``'s live entries, the
    levels above 0 (delayed jobs are not there: ``delayed(r, keys)``)."""
    scored = [(m, s) for m, s in r.zrange(keys.priority, 0, -1, withscores=True)]
    below = [bytes(m) for m, s in scored if s < 1024 * SEQ_LIMIT]
    above = [bytes(m) for m, s in scored if s >= 1024 * SEQ_LIMIT]
    live, seen = [], set()
    for entry in entries(r, keys):
        state, level = r.hmget(keys.job(entry), "state", "priority")
        is_delayed = r.zscore(keys.delayed, entry) is not None
        if state == b"pending" and level is None and not is_delayed and entry not in seen:
            live.append(entry)
            seen.add(entry)
    return below + live + above


def delayed(r: redis.Redis, keys: QueueKeys) -> dict[bytes, float]:
    """The delayed jobs and their due times."""
    return {bytes(m): float(s) for m, s in r.zrange(keys.delayed, 0, -1, withscores=True)}


def queued(r: redis.Redis, keys: QueueKeys) -> int:
    """How many jobs wait (claimable or delayed): ``pending``'s entries less its tombstones, plus
    ``priority`` and ``delayed``."""
    stale = int(r.hget(keys.meta, "stale") or 0) if r.type(keys.meta) == b"hash" else 0
    length = int(r.llen(keys.pending)) if r.type(keys.pending) == b"list" else 0
    return length - stale + int(r.zcard(keys.priority)) + int(r.zcard(keys.delayed))
