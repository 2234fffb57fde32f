"""The C core (module/emq_core.c) called in-process through cffi.

emq.so exports the core's functions and needs nothing from a server to run
them (the module API reaches it as function pointers filled at load time),
so ABI mode opens the very .so the server loads.  The declarations come from
emq_core.h itself, so a changed signature breaks here, not silently.

Each property compares the C verdict with an independent Python reference:
Redis's integer syntax, exact doubles, Redis Cluster's hash-tag rule (redis-py's
own key_slot), and, where a server is the authority, a real server's INCRBY
and HINCRBY.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from ..conftest import ROOT, ServerFactory
from ..examples import reference_text
from ..helpers import cluster_args

pytestmark = pytest.mark.once

cffi = pytest.importorskip("cffi", reason="cffi is in the [test] extra: pip install -e '.[test]'")

HEADER = ROOT / "module" / "emq_core.h"
REFERENCE = reference_text()  # docs/reference/: every error text, word for word

LLONG_MIN, LLONG_MAX = -(2**63), 2**63 - 1
MAX_EXACT = 2**53

NOT_INTEGER = "ERR lease-ms is not an integer"
LEASE_TOO_SMALL = "ERR lease-ms must be at least 1"
LEASE_TOO_LARGE = "ERR lease-ms is too large: the deadline would not be an exact score"
STALLED_NOT_INTEGER = "ERR a swept job row has a 'stalled' field that is not an integer"
COUNT_NOT_INTEGER = "ERR the metrics:failed 'count' field is not an integer"
OVERFLOW = "ERR increment or decrement would overflow"

CORE = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SERVER = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def header_declarations(text: str) -> str:
    """The exported prototypes of emq_core.h, as cffi's cdef wants them."""
    decls = re.findall(r"^EMQ_EXPORT\s+([^;]*;)", text, re.MULTILINE)
    assert len(decls) >= 8, "emq_core.h lost its EMQ_EXPORT prototypes"
    return "\n".join(" ".join(d.split()) for d in decls)


class Core:
    """Thin Python calls over the exported C functions (bytes in, verdicts out)."""

    def __init__(self, path: Path) -> None:
        self.ffi = cffi.FFI()
        self.ffi.cdef(header_declarations(HEADER.read_text()))
        self.lib: Any = self.ffi.dlopen(str(path))

    def _buf(self, data: bytes, trailing: bytes) -> Any:
        # The C side gets exactly len(data) bytes to look at, followed by
        # bytes that would change the verdict if it read past its length.
        return self.ffi.new("char[]", data + trailing)

    def _err(self, code: int) -> str | None:
        """The error text of a core verdict (EMQ_OK is 0: no error)."""
        if code == 0:
            return None
        text = self.lib.emq_error_text(code)
        assert text != self.ffi.NULL, f"error code {code} has no text in the core's table"
        return str(self.ffi.string(text).decode())

    def parse_ll(self, data: bytes, trailing: bytes = b"") -> int | None:
        out = self.ffi.new("long long *", 12345)
        rc = self.lib.emq_parse_ll(self._buf(data, trailing), len(data), out)
        if rc != 0:
            assert rc == -1 and out[0] == 12345, "a refused parse wrote its output"
            return None
        return int(out[0])

    def lease_deadline(self, now: int, lease: bytes) -> tuple[str | None, int]:
        out = self.ffi.new("long long *", -7)
        err = self._err(self.lib.emq_lease_deadline(now, self._buf(lease, b"9"), len(lease), out))
        return err, int(out[0])

    # The core's EmqCountArg: which count is parsed (it names itself in the error).
    COUNT_ARGS: ClassVar[dict[str, int]] = {"max-stalled": 0, "limit": 1, "max-attempts": 2}

    def parse_count(self, what: str, data: bytes) -> tuple[str | None, int]:
        out = self.ffi.new("long long *", -7)
        which = self.COUNT_ARGS[what]
        err = self._err(self.lib.emq_parse_count(which, self._buf(data, b"0"), len(data), out))
        return err, int(out[0])

    def key_is(self, key: bytes, base: bytes, suffix: bytes) -> bool:
        return bool(
            self.lib.emq_key_is(self._buf(key, b"x"), len(key), self._buf(base, b"x"), len(base), suffix)
        )

    def base_has_hash_tag(self, base: bytes) -> bool:
        # The byte after the base is a '}': a core that looked past len would see a tag.
        return bool(self.lib.emq_base_has_hash_tag(self._buf(base, b"}"), len(base)))

    def next_stalled(self, cur: bytes | None) -> tuple[str | None, int]:
        out = self.ffi.new("long long *", -7)
        data = cur or b""
        err = self._err(self.lib.emq_next_stalled(self._buf(data, b"1"), len(data), cur is not None, out))
        return err, int(out[0])

    def add_failed(self, cur: bytes | None, deaths: int) -> tuple[str | None, int]:
        out = self.ffi.new("long long *", -7)
        data = cur or b""
        err = self._err(
            self.lib.emq_add_failed(self._buf(data, b"1"), len(data), cur is not None, deaths, out)
        )
        return err, int(out[0])


@pytest.fixture(scope="session")
def core(module_so: Path) -> Core:
    return Core(module_so)


@pytest.fixture(scope="session")
def authority(server_factory: ServerFactory) -> Iterator[redis.Redis]:
    """A real server: the authority on what Redis itself calls an integer."""
    conn = server_factory().client()
    yield conn
    conn.close()


# -- references ----------------------------------------------------------------

CANONICAL = re.compile(rb"-?[1-9][0-9]*|0")


def ref_parse_ll(data: bytes) -> int | None:
    """Canonical base-10 int64: optional '-', no leading zeros, no '+', no spaces."""
    if not CANONICAL.fullmatch(data):
        return None
    value = int(data)
    return value if LLONG_MIN <= value <= LLONG_MAX else None


def hash_input(key: bytes) -> bytes:
    """The bytes Redis Cluster hashes for a key (the hash-tag rule)."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


# -- strategies ----------------------------------------------------------------

EDGE_NUMBERS = [
    b"",
    b"0",
    b"-0",
    b"00",
    b"01",
    b"-01",
    b"+1",
    b" 1",
    b"1 ",
    b"1.5",
    b"1e3",
    b"0x10",
    b"nan",
    b"inf",
    b"-inf",
    b"-",
    b"--1",
    b"1-",
    b"\x001",
    b"1\x00",
    b"9223372036854775807",
    b"9223372036854775808",
    b"-9223372036854775808",
    b"-9223372036854775809",
    b"99999999999999999999",
    b"-99999999999999999999",
    b"18446744073709551616",
    b"000000000000000000001",
]
near_int64 = st.integers(min_value=LLONG_MIN - 10**4, max_value=LLONG_MIN + 10**4) | st.integers(
    min_value=LLONG_MAX - 10**4, max_value=LLONG_MAX + 10**4
)
numberish = st.one_of(
    st.sampled_from(EDGE_NUMBERS),
    st.integers().map(lambda n: str(n).encode()),
    near_int64.map(lambda n: str(n).encode()),
    st.text(alphabet="-+0123456789 .ex", max_size=24).map(str.encode),
    st.binary(max_size=24),
)


# -- emq_parse_ll ----------------------------------------------------------------


def test_header_declares_what_the_library_exports(core: Core) -> None:
    for name in re.findall(r"\b(emq_\w+)\(", header_declarations(HEADER.read_text())):
        assert getattr(core.lib, name) is not None


@CORE
@given(data=numberish, trailing=st.sampled_from([b"", b"0", b"9", b"x"]))
def test_parse_ll_is_canonical_int64(core: Core, data: bytes, trailing: bytes) -> None:
    assert core.parse_ll(data, trailing) == ref_parse_ll(data)


@CORE
@given(value=st.integers(min_value=LLONG_MIN, max_value=LLONG_MAX))
def test_parse_ll_reads_back_every_int64(core: Core, value: int) -> None:
    assert core.parse_ll(str(value).encode()) == value


@SERVER
@given(data=numberish.filter(lambda b: b"\x00" not in b or len(b) < 30))
@example(data=b"-9223372036854775808")
@example(data=b"9223372036854775808")
@example(data=b"-0")
def test_parse_ll_agrees_with_the_server(core: Core, authority: redis.Redis, data: bytes) -> None:
    # INCRBY on 0 refuses exactly the increments that are not integers to Redis.
    authority.set("n", 0)
    try:
        server: int | None = int(authority.incrby("n", data))
    except redis.ResponseError as exc:
        assert "not an integer" in str(exc)
        server = None
    assert core.parse_ll(data) == server


# -- emq_lease_deadline ----------------------------------------------------------

now_ms = st.integers(min_value=0, max_value=MAX_EXACT)
lease_text = st.one_of(
    numberish,
    st.integers(min_value=-5, max_value=MAX_EXACT + 5).map(lambda n: str(n).encode()),
)


@CORE
@given(now=now_ms, lease=lease_text)
@example(now=0, lease=str(MAX_EXACT).encode())
@example(now=0, lease=str(MAX_EXACT + 1).encode())
@example(now=MAX_EXACT, lease=b"1")
@example(now=MAX_EXACT - 1, lease=b"1")
@example(now=1_700_000_000_000, lease=b"9223372036854775807")
def test_lease_deadline(core: Core, now: int, lease: bytes) -> None:
    err, deadline = core.lease_deadline(now, lease)
    value = ref_parse_ll(lease)
    if value is None:
        assert err == NOT_INTEGER
    elif value < 1:
        assert err == LEASE_TOO_SMALL
    elif now + value > MAX_EXACT:
        assert err == LEASE_TOO_LARGE
    else:
        assert err is None
        assert deadline == now + value
        # The score the server stores is a double: it must hold the deadline exactly.
        assert float(deadline) == deadline and int(float(deadline)) == deadline
        return
    assert deadline == -7, "a refused lease wrote a deadline"


@CORE
@given(now=now_ms, lease=st.integers(min_value=1, max_value=MAX_EXACT))
def test_every_accepted_lease_round_trips_through_a_double(core: Core, now: int, lease: int) -> None:
    err, deadline = core.lease_deadline(now, str(lease).encode())
    assert (err is None) == (now + lease <= MAX_EXACT)
    if err is None:
        assert deadline == now + lease and int(float(deadline)) == deadline


def test_lease_refusals_are_the_documented_ones() -> None:
    for message in (NOT_INTEGER, LEASE_TOO_SMALL, "ERR lease-ms is too large"):
        assert f"-{message}" in REFERENCE, f"docs/reference/ does not document {message!r}"


def test_a_clock_outside_the_exact_range_refuses_every_lease(core: Core) -> None:
    assert core.lease_deadline(-1, b"1")[0] == LEASE_TOO_LARGE
    assert core.lease_deadline(MAX_EXACT + 1, b"1")[0] == LEASE_TOO_LARGE
    assert core.lease_deadline(LLONG_MAX, b"9223372036854775807")[0] == LEASE_TOO_LARGE


# -- emq_parse_count -------------------------------------------------------------


@CORE
@given(what=st.sampled_from(["max-stalled", "limit", "max-attempts"]), data=numberish)
def test_parse_count(core: Core, what: str, data: bytes) -> None:
    err, out = core.parse_count(what, data)
    value = ref_parse_ll(data)
    if value is not None and value >= 1:
        assert (err, out) == (None, value)
    else:
        assert (err, out) == (f"ERR {what} must be an integer >= 1", -7)
        assert f"-{err}" in REFERENCE


# -- emq_key_is and emq_base_has_hash_tag ----------------------------------------

key_bytes = st.binary(max_size=12) | st.text(alphabet="{}ab:", max_size=12).map(str.encode)
SUFFIXES = [b"active", b"pending", b"dead", b"job:", b"metrics:failed", b""]


@CORE
@given(key=key_bytes, base=key_bytes, suffix=st.sampled_from(SUFFIXES))
def test_key_is(core: Core, key: bytes, base: bytes, suffix: bytes) -> None:
    assert core.key_is(key, base, suffix) == (key == base + suffix)
    assert core.key_is(base + suffix, base, suffix)


@CORE
@given(base=key_bytes, suffix=key_bytes)
@example(base=b"emq:{q}:", suffix=b"job:}{")
@example(base=b"{}", suffix=b"a}")
@example(base=b"{", suffix=b"x}")
@example(base=b"a}{b}", suffix=b"")
@example(base=b"}{", suffix=b"}")
def test_base_has_hash_tag_is_the_cluster_rule(core: Core, base: bytes, suffix: bytes) -> None:
    has_tag = core.base_has_hash_tag(base)
    # Two suffixes that would each close a brace the base left open: the
    # base pins the slot exactly when they hash the same.
    assert has_tag == (hash_input(base + b"a}") == hash_input(base + b"b}"))
    if has_tag:
        # ... and then every key that starts with base is in base's slot,
        # whatever follows (a job id may contain braces too).
        assert key_slot(base + suffix) == key_slot(base + b"active") == key_slot(base)
        assert hash_input(base + suffix) == hash_input(base)


@pytest.fixture(scope="session")
def cluster_node(server_factory: ServerFactory) -> Iterator[redis.Redis]:
    """A cluster-enabled server: CLUSTER KEYSLOT is the authority on slots."""
    conn = server_factory(cluster_args()).client()
    yield conn
    conn.close()


@SERVER
@given(base=key_bytes, suffix=key_bytes)
@example(base=b"emq:{q}:", suffix=b"job:}{")
@example(base=b"{}", suffix=b"a}")
def test_base_has_hash_tag_agrees_with_cluster_keyslot(
    core: Core, cluster_node: redis.Redis, base: bytes, suffix: bytes
) -> None:
    def slot(key: bytes) -> int:
        return int(cluster_node.execute_command("CLUSTER", "KEYSLOT", key))

    assert slot(base + suffix) == key_slot(base + suffix)  # the reference is the server's rule
    if core.base_has_hash_tag(base):
        assert slot(base + suffix) == slot(base + b"job:" + suffix) == slot(base)


def test_queue_bases_have_hash_tags(core: Core) -> None:
    assert core.base_has_hash_tag(b"emq:{mail}:")
    assert not core.base_has_hash_tag(b"emq:mail:")
    assert not core.base_has_hash_tag(b"emq:{}:")


# -- emq_next_stalled, emq_stall_is_dead and emq_add_failed ----------------------


@CORE
@given(cur=st.none() | numberish)
@example(cur=b"9223372036854775806")
@example(cur=b"9223372036854775807")
@example(cur=b"-9223372036854775808")
def test_next_stalled(core: Core, cur: bytes | None) -> None:
    err, out = core.next_stalled(cur)
    value = 0 if cur is None else ref_parse_ll(cur)
    if value is None:
        assert (err, out) == (STALLED_NOT_INTEGER, -7)
    elif value == LLONG_MAX:
        assert (err, out) == (OVERFLOW, -7)
    else:
        assert (err, out) == (None, value + 1)


@CORE
@given(cur=st.none() | numberish, deaths=st.integers(min_value=1, max_value=LLONG_MAX))
@example(cur=b"9223372036854775806", deaths=1)
@example(cur=b"9223372036854775807", deaths=1)
@example(cur=b"0", deaths=LLONG_MAX)
@example(cur=b"1", deaths=LLONG_MAX)
@example(cur=b"-9223372036854775808", deaths=LLONG_MAX)
def test_add_failed(core: Core, cur: bytes | None, deaths: int) -> None:
    err, out = core.add_failed(cur, deaths)
    value = 0 if cur is None else ref_parse_ll(cur)
    if value is None:
        assert (err, out) == (COUNT_NOT_INTEGER, -7)
    elif value + deaths > LLONG_MAX:
        assert (err, out) == (OVERFLOW, -7)
    else:
        assert (err, out) == (None, value + deaths)


@SERVER
@given(cur=st.none() | numberish, by=st.integers(min_value=1, max_value=LLONG_MAX))
@example(cur=b"9223372036854775807", by=1)
@example(cur=b"01", by=1)
def test_counters_agree_with_hincrby(core: Core, authority: redis.Redis, cur: bytes | None, by: int) -> None:
    # The sweep promises "as HINCRBY would": a real server decides what is refused.
    authority.delete("row")
    if cur is not None:
        authority.hset("row", "f", cur)
    try:
        server: int | None = int(authority.hincrby("row", "f", by))
    except redis.ResponseError:
        server = None
    err, out = core.add_failed(cur, by)
    assert (None if err else out) == server
    if by == 1:
        err, out = core.next_stalled(cur)
        assert (None if err else out) == server


@CORE
@given(stalled=st.integers(LLONG_MIN, LLONG_MAX), max_stalled=st.integers(1, LLONG_MAX))
def test_stall_is_dead_at_the_threshold(core: Core, stalled: int, max_stalled: int) -> None:
    assert bool(core.lib.emq_stall_is_dead(stalled, max_stalled)) == (stalled >= max_stalled)


def test_sweep_refusals_are_documented() -> None:
    for message in (STALLED_NOT_INTEGER, COUNT_NOT_INTEGER, OVERFLOW):
        assert f"-{message}" in REFERENCE, f"docs/reference/ does not document {message!r}"


def test_references_catch_a_wrong_core() -> None:
    # The references themselves: canonical spellings only, and the cluster rule.
    assert [ref_parse_ll(s) for s in (b"0", b"-0", b"007", b"+1", b"-9223372036854775808")] == [
        0,
        None,
        None,
        None,
        LLONG_MIN,
    ]
    assert key_slot(b"123456789") == 0x31C3 % 16384  # the cluster spec's CRC16 check value
    assert hash_input(b"emq:{q}:job:1") == b"q" and hash_input(b"a{}b") == b"a{}b"


# -- v2: tokens, the <job> key, the error table -------------------------------------


@CORE
@given(attempts=st.integers(LLONG_MIN, LLONG_MAX), random8=st.binary(min_size=8, max_size=8))
@example(attempts=1, random8=b"\x00" * 8)
@example(attempts=LLONG_MIN, random8=b"\xff" * 8)
def test_format_token(core: Core, attempts: int, random8: bytes) -> None:
    """ "<attempts>-<16 lowercase hex>": the claim's number, then the 8 random bytes."""
    out = core.ffi.new("char[]", 64)
    n = core.lib.emq_format_token(attempts, core.ffi.new("unsigned char[]", random8), out)
    token = core.ffi.string(out).decode()
    assert token == f"{attempts}-{random8.hex()}" and n == len(token) <= 47


@CORE
@given(
    base=st.binary(max_size=8) | st.sampled_from([b"emq:{q}:", b""]),
    suffix=st.sampled_from([b"active", b"activ", b"pending", b""]) | st.binary(max_size=7),
    job_id=st.binary(max_size=6),
    other=st.binary(max_size=6),
    mid=st.sampled_from([b"job:", b"job", b"jobs:", b""]),
)
def test_job_key_matches(
    core: Core, base: bytes, suffix: bytes, job_id: bytes, other: bytes, mid: bytes
) -> None:
    active = base + suffix
    for job, id_ in ((base + mid + job_id, job_id), (base + mid + job_id, other)):
        expected = active.endswith(b"active") and job == active[: -len(b"active")] + b"job:" + id_
        verdict = core.lib.emq_job_key_matches(
            core._buf(active, b"x"), len(active), core._buf(job, b"x"), len(job),
            core._buf(id_, b"x"), len(id_),
        )  # fmt: skip
        assert bool(verdict) == expected, (active, job, id_)


# How the reference's tables (docs/reference/) name the errors whose text they shorten.
ABBREVIATED = {
    "WRONGTYPE ": "-WRONGTYPE ...",
    "NOPERM ": "-NOPERM ...",
    "EMQEXISTS ": "-EMQEXISTS ...",
    "ERR lease-ms is too large: ": "-ERR lease-ms is too large: ...",
    "ERR in cluster mode <base> must contain a hash tag": (
        "-ERR in cluster mode <base> must contain a hash tag ..."
    ),
}
NOT_ANSWERED_YET = {"EMQSTALE release token mismatch"}  # no verb is RELEASE yet


def test_every_error_of_the_core_table_is_documented(core: Core) -> None:
    texts = []
    code = 1
    while (text := core.lib.emq_error_text(code)) != core.ffi.NULL:
        texts.append(core.ffi.string(text).decode())
        code += 1
    assert len(texts) >= 30 and "TRYAGAIN a key of this queue is moving between cluster nodes; retry" in texts
    for text in texts:
        if text in NOT_ANSWERED_YET:
            continue
        words = next((w for prefix, w in ABBREVIATED.items() if text.startswith(prefix)), "-" + text)
        assert words in REFERENCE, f"docs/reference/ does not document {words!r}"


# -- issue 28: counts against the arguments, limits, request records ---------------------------

INT = st.integers(LLONG_MIN, LLONG_MAX)
NEAR = st.sampled_from([2**62 - 1, 2**62, 2**62 + 1, 2**63 - 1, 2**31 - 1, 2**31, 2**32 + 1, 100_000])


@CORE
@given(count=INT | NEAR, per=st.integers(1, 4), first=st.integers(0, 8), argc=st.integers(0, 2**31 - 1))
@example(count=2**62 + 1, per=2, first=4, argc=6)  # the issue's: 4 + 2 * count wrapped to 6
def test_count_fits_compares_without_overflow(
    core: Core, count: int, per: int, first: int, argc: int
) -> None:
    fits = count >= 0 and first + per * count <= argc  # Python's integers do not overflow
    assert bool(core.lib.emq_count_fits(count, per, first, argc)) == fits


@CORE
@given(data=st.binary(max_size=21) | st.integers(LLONG_MIN, LLONG_MAX).map(lambda v: str(v).encode()),
       top=st.integers(1, 100_000))  # fmt: skip
def test_limit_is_a_count_then_within_the_ceiling(core: Core, data: bytes, top: int) -> None:
    out = core.ffi.new("long long *", -7)
    err = core._err(core.lib.emq_parse_limit(core._buf(data, b"0"), len(data), top, out))
    value = core.parse_ll(data)
    if value is None or value < 1:
        assert err == "ERR limit must be an integer >= 1"
    elif value > top:
        assert err == "ERR limit exceeds the server's emq.max-limit"
    else:
        assert err is None and out[0] == value


def record(*items: bytes) -> bytes:
    return b"".join(b"%d:%s" % (len(i), i) for i in items)


def record_check(core: Core, rec: bytes) -> tuple[str | None, int]:
    pairs = core.ffi.new("long *", -7)
    # Past the record's end, bytes that would complete it: a check that read past its length would pass.
    err = core._err(core.lib.emq_claim_record_check(core._buf(rec, b"1:x"), len(rec), pairs))
    return err, int(pairs[0])


RECORD_ERROR = "ERR the record of this REQ request id is malformed or another call's"


@CORE
@given(pairs=st.lists(st.tuples(st.binary(max_size=20), st.binary(min_size=1, max_size=47)), min_size=1,
                      max_size=30))  # fmt: skip
def test_a_claims_record_is_accepted_as_written(core: Core, pairs: list[tuple[bytes, bytes]]) -> None:
    rec = record(*(x for pair in pairs for x in pair))
    assert record_check(core, rec) == (None, len(pairs))


@pytest.mark.parametrize(
    "rec",
    [b"", b"x", b"1", b"2", b"1:a", b"1:a1:", b"5:ab", b"99999999999999:a", b":a", b"1:a1:1x",
     record(b"a", b"t" * 48), record(*([b"a", b"1"] * 1001)), b"0:" * 2_000_000, record(b"a", b"1") + b"1:"],
)  # fmt: skip
def test_a_record_not_a_claims_is_refused(core: Core, rec: bytes) -> None:
    """Malformed, another call's (an enqueue's "1"), over 1000 pairs, or 4 MB of empty items:
    refused, whatever its size, before anything is made of it."""
    assert record_check(core, rec)[0] == RECORD_ERROR


def test_a_record_at_the_claim_ceiling_is_accepted(core: Core) -> None:
    assert record_check(core, record(*([b"a", b"1-0123456789abcdef"] * 1000))) == (None, 1000)


@given(count=st.integers(0, 10**18))
def test_an_enqueue_record_is_its_count(core: Core, count: int) -> None:
    out = core.ffi.new("char[24]")
    n = core.lib.emq_enqueue_record(count, out)
    assert core.ffi.unpack(out, n) == str(count).encode()


@given(v=st.integers(-(2**63), 2**63 - 1))
def test_a_formatted_long_long_is_its_decimal(core: Core, v: int) -> None:
    out = core.ffi.new("char[24]")
    assert core.ffi.unpack(out, core.lib.emq_format_ll(v, out)) == str(v).encode()


@pytest.mark.parametrize("v", [0, -1, 9, 10, -10, 2**53, 2**63 - 1, -(2**63)])
def test_the_long_long_edges_format_as_their_decimal(core: Core, v: int) -> None:
    out = core.ffi.new("char[24]")
    assert core.ffi.unpack(out, core.lib.emq_format_ll(v, out)) == str(v).encode()


# -- the seqs of <base>priority (emq_next_seq, emq_head_seq; docs/concepts/priorities.md) -----

TAIL_FIRST, SEQ_LIMIT = 2**32, 2**42


@pytest.mark.parametrize(
    ("seq", "lane_empty", "expected"),
    [
        (0, 0, TAIL_FIRST),  # a fresh queue
        (TAIL_FIRST - 1, 0, TAIL_FIRST),  # a counter of an older version: above its tails
        (TAIL_FIRST, 0, TAIL_FIRST + 1),
        (TAIL_FIRST + 41, 1, TAIL_FIRST),  # the lane emptied: no job to overtake
        (SEQ_LIMIT - 2, 0, SEQ_LIMIT - 1),
        (SEQ_LIMIT - 1, 0, TAIL_FIRST),  # the wrap
        (-5, 0, TAIL_FIRST),
    ],
)
def test_the_tail_counter(core: Core, seq: int, lane_empty: int, expected: int) -> None:
    assert core.lib.emq_next_seq(seq, lane_empty) == expected


@pytest.mark.parametrize(
    ("first", "has_first", "n", "expected"),
    [
        (0, 0, 1, [TAIL_FIRST - 1]),  # an empty level: just under the tails
        (0, 0, 3, [TAIL_FIRST - 3, TAIL_FIRST - 2, TAIL_FIRST - 1]),  # one call: in its order
        (TAIL_FIRST + 9, 1, 2, [TAIL_FIRST - 2, TAIL_FIRST - 1]),  # before the level's tails
        (100, 1, 3, [97, 98, 99]),  # before the heads put back by earlier calls
        (1, 1, 3, [0, 0, 0]),  # never below the level: ties at seq 0 (2^32 heads waiting)
    ],
)
def test_the_heads_seqs(core: Core, first: int, has_first: int, n: int, expected: list[int]) -> None:
    assert [core.lib.emq_head_seq(first, has_first, n, i) for i in range(n)] == expected


def test_a_priority_member_is_live_with_a_pending_row(core: Core) -> None:
    assert [core.lib.emq_member_live(e, p) for e, p in [(1, 1), (1, 0), (0, 0)]] == [1, 0, 0]
