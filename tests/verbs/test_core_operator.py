"""The operator verbs' decisions in the C core (emq_core.c), called in-process
through cffi, against Python references (issue 13)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from .test_core_cffi import CORE, EDGE_NUMBERS, MAX_EXACT, Core, core, ref_parse_ll  # noqa: F401

RETENTION_VALUE = "ERR a retention must be -1 (keep forever) or an integer from 0 to 9007199254740992 (ms)"
STATES = [b"dead", b"cancelled", b"pending", b"active", b"done", b"", b"Dead", b"dead ", b"deadx", b"cancel"]
numberish = st.sampled_from(EDGE_NUMBERS) | st.integers(-(2**60), 2**60).map(lambda n: str(n).encode())


def parse(core: Core, fn: str, data: bytes) -> tuple[str | None, int]:  # noqa: F811
    out = core.ffi.new("long long *", -7)
    err = core._err(getattr(core.lib, fn)(core._buf(data, b"9"), len(data), out))
    return err, int(out[0])


def state_call(core: Core, fn: str, state: bytes | None, *before: int) -> int:  # noqa: F811
    data = state if state is not None else b""
    buf = core._buf(data, b"x") if state is not None else core.ffi.NULL
    return int(getattr(core.lib, fn)(*before, buf, len(data)))


@CORE
@given(data=numberish | st.sampled_from([str(MAX_EXACT).encode(), str(MAX_EXACT + 1).encode(), b"-1", b"-2"]))
def test_retention_argument(core: Core, data: bytes) -> None:  # noqa: F811
    value = ref_parse_ll(data)
    err, out = parse(core, "emq_parse_retention_arg", data)
    if value is not None and -1 <= value <= MAX_EXACT:
        assert (err, out) == (None, value)
    else:
        assert (err, out) == (RETENTION_VALUE, -7)


@CORE
@given(data=numberish)
def test_until(core: Core, data: bytes) -> None:  # noqa: F811
    value = ref_parse_ll(data)
    err, out = parse(core, "emq_parse_until", data)
    refused = ("ERR UNTIL must be an integer (server ms)", -7)
    assert (err, out) == ((None, value) if value is not None else refused)


def test_which_states_retry_purge_and_forget_take(core: Core) -> None:  # noqa: F811
    for state in [*STATES, None]:
        err = core._err(state_call(core, "emq_retry_check", state))
        if state in (b"dead", b"cancelled"):
            assert err is None
        elif state in (b"pending", b"active", b"done"):
            assert err == f"EMQSTATE the job is {state.decode()}: only a dead or cancelled job can be retried"
        else:
            assert err == "EMQSTATE the job has no known state: only a dead or cancelled job can be retried"
        assert state_call(core, "emq_purge_deletes_row", state, 1) == (state == b"dead")
        assert state_call(core, "emq_purge_deletes_row", None, 0) == 1  # the row is gone already
        assert state_call(core, "emq_forget_deletes_row", state) == (state in (b"done", b"cancelled"))
