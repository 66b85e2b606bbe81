"""supervisord's event listener that prints every program's output as `HH:MM:SS name | line` (what
the stack's log and `make run`'s console show; supervisord itself writes a program's output without
its name). Started by supervisord from harness/supervisor.py as a plain script (stdlib only):
the events come on stdin, the protocol's answers go to stdout, the lines to stderr, which supervisord
sends to its own standard output.

    python harness/loglines.py WIDTH
"""

from __future__ import annotations

import sys
import time


def _headers(line: bytes) -> dict[str, str]:
    return dict(part.split(":", 1) for part in line.decode().split())


def main() -> None:
    width = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    events, answers, out = sys.stdin.buffer, sys.stdout.buffer, sys.stderr
    partial: dict[str, str] = {}  # a program's last line, not yet ended
    while True:
        answers.write(b"READY\n")
        answers.flush()
        header = events.readline()
        if not header:
            return
        payload = events.read(int(_headers(header)["len"]))
        meta, _, data = payload.partition(b"\n")
        name = _headers(meta).get("processname", "?")
        text = partial.pop(name, "") + data.decode("utf-8", "replace")
        *lines, rest = text.split("\n")
        if rest:
            partial[name] = rest
        stamp = time.strftime("%H:%M:%S")
        out.write("".join(f"{stamp} {name:<{width}} | {line}\n" for line in lines))
        out.flush()
        answers.write(b"RESULT 2\nOK")
        answers.flush()


if __name__ == "__main__":
    main()
