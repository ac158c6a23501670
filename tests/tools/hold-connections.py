#!/usr/bin/env python3
"""Long-lived TCP connections that each send a request every interval, for the routed-fabric
benchmark (`cargo xtask bench bgp`).

Each connection talks to a lab pod's line echo server (tests/src/cluster.rs, Pod::serve): it
reads the greeting, then writes a line every interval and waits for its echo. A connection
that is reset or closed ends ("reset"); a request not answered within the timeout counts as
failed, and the connection goes on waiting. Runs until SIGTERM or the duration, then prints one
JSON object per port: connections opened, reset, requests sent, answered and failed, and the
longest wait for an answer any connection saw (the outage as a flow sees it).

    hold-connections.py VIP PORT[,PORT...] CONNECTIONS_PER_PORT INTERVAL_MS DURATION_S
"""

import asyncio
import json
import signal
import socket
import sys
import time


async def one(vip, port, interval, stats, stop, timeout):
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(vip, port), 5)
        await asyncio.wait_for(reader.readline(), 5)
    except Exception:
        stats["refused"] += 1
        return
    stats["opened"] += 1
    sent_at = None
    n = 0
    try:
        while not stop.is_set():
            n += 1
            sent_at = time.monotonic()
            writer.write(b"r%d\n" % n)
            stats["sent"] += 1
            while True:
                try:
                    line = await asyncio.wait_for(reader.readline(), timeout)
                    break
                except asyncio.TimeoutError:
                    stats["failed"] += 1
                    if stop.is_set():
                        return
            if not line:
                stats["reset"] += 1
                return
            waited = time.monotonic() - sent_at
            stats["answered"] += 1
            stats["max_wait_ms"] = max(stats["max_wait_ms"], waited * 1000)
            if waited > 0.1:
                stats["slow"] += 1
            await asyncio.sleep(max(0, interval - waited))
    except (ConnectionResetError, BrokenPipeError, OSError):
        stats["reset"] += 1
    finally:
        writer.close()


async def main():
    vip, ports, per_port, interval_ms, duration = sys.argv[1:6]
    ports = [int(p) for p in ports.split(",")]
    per_port, interval, duration = int(per_port), int(interval_ms) / 1000, float(duration)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    stats = {
        p: {"port": p, "opened": 0, "refused": 0, "reset": 0, "sent": 0, "answered": 0, "failed": 0, "slow": 0, "max_wait_ms": 0.0}
        for p in ports
    }
    tasks = []
    for i in range(per_port):
        for p in ports:
            tasks.append(asyncio.create_task(one(vip, p, interval, stats[p], stop, 1.0)))
        if i % 50 == 49:
            await asyncio.sleep(0.05)
    # Ready once every connection has its greeting (or failed to).
    while sum(s["opened"] + s["refused"] for s in stats.values()) < per_port * len(ports):
        await asyncio.sleep(0.05)
    print("ready", flush=True)
    # Only what happens from here on is measured.
    for s in stats.values():
        for k in ("sent", "answered", "failed", "slow"):
            s[k] = 0
        s["max_wait_ms"] = 0.0
    try:
        await asyncio.wait_for(stop.wait(), duration)
    except asyncio.TimeoutError:
        stop.set()
    await asyncio.sleep(1.2)
    for t in tasks:
        t.cancel()
    print(json.dumps(list(stats.values())), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
