"""The programs bench/stream_fanout runs in processes of their own (`python -c`): SETUP (the demo
world's accounts and listenKeys), POSTER (postings at a rate, each stamped with its commit time) and
COUNTER (a light raw-frame websocket client that counts what the server delivered)."""

SETUP = """
import json, sys
import django
django.setup()
from accounts import services
from streams.services import listen_key_start

out = []
for i in range(int(sys.argv[1])):
    user = services.user_create(email=f"fanout-bench-{i}@bench.example", password=None)
    out.append([user.pk, listen_key_start(account=user)])
print(json.dumps(out))
"""

POSTER = """
import json, sys, time
from decimal import Decimal
import django
django.setup()
from accounts import ledger
from accounts.models import SystemRole
from accounts.ledger.models import BalanceChange
from streams import relay

account = int(sys.argv[1])
rate, seconds, warmup = float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
tag, out_path = sys.argv[5], sys.argv[6]
committed = []
# First among the after-commit listeners: the clock right after COMMIT, before the relay publishes.
ledger.after_commit_listeners.insert(0, lambda result: committed.append(time.time()))
world = ledger.system_account_id(SystemRole.WORLD)
amount = Decimal("0.001")
sys.stdout.write("ready\\n")
sys.stdout.flush()
sys.stdin.readline()  # every poster and client is ready
records = []
start = time.time()
end = start + warmup + seconds
i = 0
while time.time() < end:  # paced at `rate`; a poster that falls behind posts back to back
    pause = start + i / rate - time.time()
    if pause > 0:
        time.sleep(pause)
    result = ledger.post(legs=ledger.move(world, account, "BTC", amount), kind="CHAIN_DEPOSIT",
                         reference=f"fanout-bench:{tag}:{i}")
    after = next(b for b in result.balances if b.account_id == account)
    records.append([after.seq, str(after.free), committed[-1], committed[-1] < start + warmup])
    i += 1
relay.drain(10)  # a worker stays alive: its relay publishes its last postings
with open(out_path, "w") as f:
    json.dump({"records": records, "started": start}, f)
"""

# A light websocket client: raw sockets, the handshake by hand, frames counted from their headers
# (server frames are unmasked), positions found by a byte search, pings answered. It measures what
# the server delivers; a websocket library parsing every frame would be the bottleneck here.
COUNTER = """
import asyncio, base64, json, os, struct, sys, time

host, port, path, count, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
frames = [0] * count
positions = [0] * count
codes = [None] * count
samples = []

async def one(i):
    reader, writer = await asyncio.open_connection(host, port)
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Upgrade: websocket", "Connection: Upgrade",
             f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13", "", ""]
    writer.write("\\r\\n".join(lines).encode())
    head = await reader.readuntil(b"\\r\\n\\r\\n")
    assert b" 101 " in head.split(b"\\r\\n", 1)[0], head
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
                    writer.write(bytes((0x8A, 0x80 | b1)) + b"\\0\\0\\0\\0" + buf[at + head : at + head + b1])
                at += head + b1
            buf = buf[at:]
    except (ConnectionError, OSError):
        pass
    finally:
        if codes[i] is None:
            codes[i] = 1006

async def main():
    conns = [await one(i) for i in range(count)]
    tasks = [asyncio.create_task(read(i, r, w)) for i, (r, w) in enumerate(conns)]
    sys.stdout.write("ready\\n")
    sys.stdout.flush()
    stop = asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    while not stop.done():
        samples.append((time.time(), sum(frames)))
        await asyncio.sleep(0.1)
    for task in tasks:
        task.cancel()
    with open(out, "w") as f:
        json.dump({"samples": samples, "frames": frames, "positions": positions, "codes": codes}, f)

asyncio.run(main())
"""
