"""A raw RESP connection: the exact bytes of each reply (RESP2 or RESP3), and a parser.

redis-py turns replies into Python values, which hides differences a client
could still see (a null bulk string and a null array are both None).  The
backends differential compares the bytes themselves.
"""

from __future__ import annotations

import socket
from typing import Any


def encode(*args: Any) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, int):
            arg = str(arg).encode()
        elif isinstance(arg, str):
            arg = arg.encode("utf-8", "surrogateescape")
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


class RawConnection:
    """One socket to a server; ``call(*args)`` answers the reply's bytes, whole."""

    def __init__(self, host: str, port: int, protocol: int = 2) -> None:
        self.sock = socket.create_connection((host, port), timeout=30)
        self.buf = b""
        if protocol == 3:
            reply = self.call("HELLO", "3")
            assert reply.startswith((b"%", b"*")), reply

    def close(self) -> None:
        self.sock.close()

    def _fill(self) -> None:
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buf += data

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._fill()
        end = self.buf.index(b"\r\n") + 2
        line, self.buf = self.buf[:end], self.buf[end:]
        return line

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def reply(self) -> bytes:
        line = self._line()
        kind = line[:1]
        if kind in b"$=!":  # bulk, verbatim, bulk error
            n = int(line[1:-2])
            return line if n < 0 else line + self._exactly(n + 2)
        if kind in b"*~>%|":  # array, set, push, map, attribute
            n = int(line[1:-2])
            if n < 0:
                return line
            if kind in b"%|":
                n *= 2
            return line + b"".join(self.reply() for _ in range(n))
        return line  # + - : _ , # (

    def call(self, *args: Any) -> bytes:
        self.sock.sendall(encode(*args))
        return self.reply()


class ReplyError(Exception):
    """An error reply, parsed."""


def parse(data: bytes) -> Any:
    """Reply bytes as Python values (errors as ReplyError instances, nulls as None)."""
    value, rest = _parse(data)
    assert rest == b"", rest
    return value


def _parse(data: bytes) -> tuple[Any, bytes]:
    end = data.index(b"\r\n")
    kind, body, rest = data[:1], data[1:end], data[end + 2 :]
    if kind == b"+":
        return body, rest
    if kind == b"-":
        return ReplyError(body.decode(errors="replace")), rest
    if kind == b":":
        return int(body), rest
    if kind == b"_":
        return None, rest
    if kind in b"$=":
        n = int(body)
        if n < 0:
            return None, rest
        return rest[:n], rest[n + 2 :]
    if kind in b"*~":
        n = int(body)
        if n < 0:
            return None, rest
        items = []
        for _ in range(n):
            item, rest = _parse(rest)
            items.append(item)
        return items, rest
    if kind == b"%":
        out = {}
        for _ in range(int(body)):
            k, rest = _parse(rest)
            v, rest = _parse(rest)
            out[k] = v
        return out, rest
    raise ValueError(f"reply type {kind!r} not handled")
