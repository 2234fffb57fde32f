"""The code examples of README.md and docs/: found, and compared with what they print.

Every fenced block of the documentation is an example of one kind:

- ```` ```python ````: run as a script of its own (a fresh interpreter, the
  suite's engine); when a ```` ```text title="Output" ```` block follows it
  (blank lines between at most), that is what it must print.
- ```` ```console ````: a terminal session, ``$ `` lines run one by one
  (``redis-cli`` against the suite's server, ``echomq`` with ``$ECHOMQ_URL``
  pointing at it), each followed by what it prints.
- ```` ```sh ````: commands to copy (installing, starting servers): checked by
  ``bash -n``, and every ``echomq ...`` line must parse with the CLI's parser.
- ```` ```yaml ````: must parse.

A python or console block that cannot run as written (it serves forever, needs
a Redis Cluster, binds a fixed port) says so on the line before it:
``<!-- not run: <why> -->``.  It is still checked: python by ``mypy --strict``
(every python block is), console by parsing each ``echomq`` line.

Output is compared line by line, exactly, except for what differs from run to
run, which is recognised by its shape: a fencing token (``<claim>-<16 hex>``:
any token of the same claim number; the documentation's token, in a later
command, stands for the one the server handed out), a duration or time in ms
(``<n> ms``), an age (``<x> s ago``, ``5m 03s ago``...), a local time
(``2026-12-01 09:30:00 +0100``), an epoch time in ms (13 digits).  Lines
with such a part are compared with runs of spaces as one (columns widen
with their values).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NOT_RUN = re.compile(r"^<!-- not run: (.+?) -->$")
OUTPUT_INFO = 'text title="Output"'
FENCE = re.compile(r"^```(.*)$")


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    info: str  # the whole info string, e.g. 'text title="Output"'
    code: str
    not_run: str | None = None  # the reason, when marked
    output: str | None = None  # the Output block after a python block

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.not_run is None


def pages() -> list[Path]:
    """README.md and every page of docs/ (not the hooks, nor docs/notes/: raw text for pages, not pages)."""
    found = sorted(p for p in DOCS.rglob("*.md") if not {"hooks", "notes"} & set(p.relative_to(DOCS).parts))
    return [ROOT / "README.md", *found]


def reference_text() -> str:
    """The reference pages (docs/reference/, the command pages included), where every command's
    contract is documented: reply rows, error texts word for word, the ACL recipes."""
    return "\n".join(p.read_text() for p in sorted((DOCS / "reference").rglob("*.md")))


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        info = match.group(1).strip()
        end = i + 1
        while end < len(lines) and lines[end] != "```":
            end += 1
        if end == len(lines):
            raise AssertionError(f"{path.relative_to(ROOT)}:{i + 1}: a code block is never closed")
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marked = NOT_RUN.match(before.strip())
        block = Block(
            path=path,
            line=i + 1,
            language=info.split()[0] if info else "",
            info=info,
            code="\n".join(lines[i + 1 : end]) + "\n",
            not_run=marked.group(1) if marked else None,
        )
        if info == OUTPUT_INFO:
            previous = found[-1] if found else None
            closed = previous.line + previous.code.count("\n") if previous else 0  # its closing fence's index
            gap = lines[closed + 1 : i] if previous else []
            if previous is None or previous.language != "python" or any(s.strip() for s in gap):
                raise AssertionError(f"{block.where}: an Output block must follow a python block directly")
            previous.output = block.code
        found.append(block)
        i = end + 1
    return found


def all_blocks(language: str | None = None) -> list[Block]:
    return [b for p in pages() for b in blocks(p) if language is None or b.language == language]


# -- comparing output --------------------------------------------------------------------

TOKEN = re.compile(r"\b([0-9]+)-[0-9a-f]{16}\b")
AGE = r"(?:[0-9]+(?:\.[0-9]+)? s|[0-9]+m [0-9]{2}s|[0-9]+h [0-9]{2}m|[0-9]+d [0-9]+h) ago"
LOCAL_TIME = r"[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2} [+-][0-9]{4}"
VARIABLE = re.compile(
    r"(?P<token>\b[0-9]+-[0-9a-f]{16}\b)"
    r"|(?P<ms>\b[0-9]+ ms\b)"
    rf"|(?P<ago>\b{AGE}\b)"
    rf"|(?P<local>\b{LOCAL_TIME}\b)"
    r"|(?P<epoch>\b1[0-9]{12}\b)"
)


def line_pattern(want: str) -> re.Pattern[str] | None:
    """A regex for a documented line with parts that vary between runs, or None (compare exactly)."""
    if VARIABLE.search(want) is None:
        return None
    out, last = [], 0
    for match in VARIABLE.finditer(want):
        out.append(_literal(want[last : match.start()]))
        kind = match.lastgroup
        if kind == "token":
            claim = TOKEN.match(match.group()).group(1)  # type: ignore[union-attr]
            out.append(rf"(?P<t{len(out)}>{claim}-[0-9a-f]{{16}})")
        elif kind == "ms":
            out.append(r"-?[0-9]+ ms")
        elif kind == "ago":
            out.append(AGE)
        elif kind == "local":
            out.append(LOCAL_TIME)
        else:
            out.append(r"[0-9]{13}")
        last = match.end()
    out.append(_literal(want[last:]))
    return re.compile("".join(out))


def _literal(text: str) -> str:
    return " +".join(re.escape(part) for part in re.split(r" +", text))


def compare(expected: str, actual: str, tokens: dict[str, str], where: str) -> None:
    """Assert that `actual` is what `expected` documents; learn the tokens it shows."""
    want_lines, got_lines = expected.splitlines(), actual.splitlines()
    assert len(want_lines) == len(got_lines), f"{where}: documented\n{expected}\nprinted\n{actual}"
    for want, got in zip(want_lines, got_lines, strict=True):
        pattern = line_pattern(want.rstrip())
        if pattern is None:
            assert got == want, f"{where}: documented {want!r}, printed {got!r}"
            continue
        match = pattern.fullmatch(got.rstrip())  # the pattern's own trailing spaces are rstripped too
        assert match, f"{where}: documented {want!r}, printed {got!r}"
        shown = [m.group() for m in TOKEN.finditer(want)]
        for doc_token, real in zip(shown, (v for k, v in match.groupdict().items() if k.startswith("t")),
                                   strict=True):  # fmt: skip
            if doc_token in tokens:
                assert tokens[doc_token] == real, f"{where}: {doc_token} stands for {tokens[doc_token]}"
            else:
                assert real not in tokens.values(), f"{where}: two claims handed out one token"
                tokens[doc_token] = real
