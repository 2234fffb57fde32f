"""``python -m echomq``: the demo and the module path."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m echomq", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="run the lifecycle demo on a server of its own")
    sub.add_parser("module-path", help="print the path of emq.so for --loadmodule")
    args = parser.parse_args(argv)

    if args.command == "demo":
        from .demo import run

        run()
    else:
        from .server import module_path

        try:
            print(module_path())
        except FileNotFoundError as exc:
            print(f"echomq: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
