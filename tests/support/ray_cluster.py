"""A two-node Ray cluster on 127.0.0.1 for one command, then gone (tests/sweep/test_ray_cluster.py).

    python tests/support/ray_cluster.py NODES_JSON -- COMMAND... {address} ...

starts a head node (``ray start --head``) and a second node (``ray start --address``), one CPU
each, waits until both are alive, writes their node ids and addresses to NODES_JSON, runs
COMMAND with ``{address}`` replaced by the head's address, stops both nodes and exits with
COMMAND's exit code.

Ray replaces 127.0.0.1 by the machine's outward address on Linux, so the caller runs this in
a network namespace of its own whose only interface is loopback (``unshare --net``): there
the outward address *is* 127.0.0.1 and no packet can leave. With a PID namespace as well
(``unshare --pid --fork --kill-child``) this script is its init: when it exits, for any
reason, the kernel ends every Ray process it started. It also stops them itself (SIGKILL to
each node's ``ray start --block``, whose processes share its fate).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NODE_CPUS = 1
START_TIMEOUT_S = 180.0


def loopback_up() -> None:
    """Bring up ``lo`` (a new network namespace starts with it down)."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, siocgifflags, request))[1]
        if not flags & iff_up:
            fcntl.ioctl(sock, siocsifflags, struct.pack("16sh", b"lo", flags | iff_up))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ray(*args: str, log: Path) -> subprocess.Popen[bytes]:
    ray = Path(sys.executable).with_name("ray")
    command = [
        str(ray),
        "start",
        *args,
        f"--num-cpus={NODE_CPUS}",
        "--disable-usage-stats",
        "--block",
    ]
    with log.open("ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


def wait_for_nodes(address: str, count: int, nodes: list[subprocess.Popen[bytes]]) -> list[dict]:
    """The alive nodes once ``count`` are, as {node_id, address}."""
    import ray

    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        for proc in nodes:
            if proc.poll() is not None:
                raise RuntimeError(f"a Ray node exited with {proc.returncode} while starting")
        try:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
    try:
        while True:
            alive = [n for n in ray.nodes() if n.get("Alive")]
            if len(alive) >= count:
                return [{"node_id": n["NodeID"], "address": n["NodeManagerAddress"]} for n in alive]
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(alive)} of {count} Ray nodes alive")
            time.sleep(0.5)
    finally:
        ray.shutdown()


def main(argv: list[str]) -> int:
    out_file, sep, *command = argv
    assert sep == "--" and command, __doc__
    loopback_up()
    work = Path(tempfile.mkdtemp(prefix="hfray-"))  # short: Ray's socket paths fit 107 bytes
    os.environ["HOME"] = str(work)  # Ray's per-user files (auth token) stay in here
    port = free_port()
    address = f"127.0.0.1:{port}"
    log = Path(out_file).with_suffix(".log")
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        nodes.append(
            _ray(
                "--head",
                f"--port={port}",
                "--include-dashboard=false",
                f"--temp-dir={work / 'r'}",
                log=log,
            )
        )
        nodes.append(_ray(f"--address={address}", log=log))
        alive = wait_for_nodes(address, 2, nodes)
        Path(out_file).write_text(json.dumps({"address": address, "nodes": alive}))
        return subprocess.run([part.replace("{address}", address) for part in command]).returncode
    finally:
        for proc in reversed(nodes):  # SIGKILL: SIGTERM drains a node for up to 30 s
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)
            proc.wait()
        _reap_orphans()  # Ray's processes, dying with their node, still write their logs
        shutil.rmtree(work, ignore_errors=True)


def _reap_orphans(timeout: float = 30.0) -> None:
    """As the PID namespace's init, wait for the orphans it inherited (Ray's processes) to
    exit, up to ``timeout``; outside one, for this script's own children."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
