"""bench/stream_fanout's websocket counter: argv `host port path count out-path`; `count` raw-socket
websocket clients on `path` that count the frames the server delivers; prints `ready`, counts until
a line arrives on stdin, then writes the counts to `out-path` as JSON.

A light client: raw sockets, the handshake by hand, frames counted from their headers (server frames
are unmasked), positions found by a byte search, pings answered. It measures what the server
delivers; a websocket library parsing every frame would be the bottleneck here."""

import asyncio
import base64
import json
import os
import struct
import sys
import time


def main(argv: list[str]) -> None:
    host, port, path, count, out = argv[0], int(argv[1]), argv[2], int(argv[3]), argv[4]
    frames = [0] * count
    positions = [0] * count
    codes = [None] * count
    samples = []

    async def one(i):
        reader, writer = await asyncio.open_connection(host, port)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: {host}:{port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            "",
            "",
        ]
        writer.write("\r\n".join(lines).encode())
        head = await reader.readuntil(b"\r\n\r\n")
        assert b" 101 " in head.split(b"\r\n", 1)[0], head
        return reader, writer

    async def read(i, reader, writer):
        buf = b""
        try:
            while True:
                chunk = await reader.read(1 << 18)
                if not chunk:
                    return
                buf += chunk
                at, n = 0, len(buf)
                while n - at >= 2:
                    b0, b1 = buf[at], buf[at + 1] & 0x7F
                    head = 2
                    if b1 == 126:
                        if n - at < 4:
                            break
                        b1, head = struct.unpack_from("!H", buf, at + 2)[0], 4
                    elif b1 == 127:
                        if n - at < 10:
                            break
                        b1, head = struct.unpack_from("!Q", buf, at + 2)[0], 10
                    if n - at < head + b1:
                        break
                    opcode = b0 & 0x0F
                    if opcode == 1:
                        frames[i] += 1
                        if buf.find(b"outboundAccountPosition", at + head, at + head + b1) >= 0:
                            positions[i] += 1
                    elif opcode == 8:
                        codes[i] = struct.unpack_from("!H", buf, at + head)[0] if b1 >= 2 else 1005
                        return
                    elif opcode == 9:  # ping: a masked pong with a zero mask
                        writer.write(bytes((0x8A, 0x80 | b1)) + b"\0\0\0\0" + buf[at + head : at + head + b1])
                    at += head + b1
                buf = buf[at:]
        except (ConnectionError, OSError):
            pass
        finally:
            if codes[i] is None:
                codes[i] = 1006

    async def count_frames():
        conns = [await one(i) for i in range(count)]
        tasks = [asyncio.create_task(read(i, r, w)) for i, (r, w) in enumerate(conns)]
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        stop = asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        while not stop.done():
            samples.append((time.time(), sum(frames)))
            await asyncio.sleep(0.1)
        for task in tasks:
            task.cancel()
        with open(out, "w") as f:
            json.dump({"samples": samples, "frames": frames, "positions": positions, "codes": codes}, f)

    asyncio.run(count_frames())


if __name__ == "__main__":
    main(sys.argv[1:])
