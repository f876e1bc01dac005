"""The host harness (:mod:`benchmarks.support.hosts`) does what the host scenarios rely on:
each host is its own network stack on a bridge, with addresses from 198.18.0.0/15 only;
a killed host has no process left; a host cut off is unreachable and reachable again once
healed; two hosts cut apart reach everyone but each other; everything the harness made is
gone when it closes, also after a failure; the sweep removes what a dead run left, and
nothing else.

Needs Linux, root and ``ip``: elsewhere these tests skip with the reason, in CI they run.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys

import pytest

from benchmarks.support import hosts as harness
from benchmarks.support.hosts import NETWORK, Hosts, HostsError, ip, sweep, unavailable
from benchmarks.support.waiting import wait_for_sync
from tests.support.env import in_ci

REASON = unavailable()
pytestmark = pytest.mark.skipif(
    REASON is not None and not in_ci(), reason=f"host harness: {REASON}"
)

#: A TCP client run inside a host: connects to ADDRESS:PORT within TIMEOUT seconds and
#: prints "connected" or the error's name.
CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))\n"
    "    print('connected')\n"
    "except OSError as exc:\n"
    "    print(type(exc).__name__)\n"
)
#: A TCP server run inside a host: listens on ADDRESS:PORT and accepts forever.
SERVE = (
    "import socket, sys\n"
    "s = socket.create_server((sys.argv[1], int(sys.argv[2])))\n"
    "print('listening', flush=True)\n"
    "while True:\n"
    "    s.accept()\n"
)
PORT = 18_786


def connect(host: harness.Host, address: str, timeout: float = 1.0) -> str:
    """What a TCP connection from inside ``host`` to ``address`` gives."""
    argv = ["ip", "netns", "exec", host.namespace, sys.executable, "-c", CONNECT]
    done = subprocess.run(
        [*argv, address, str(PORT), str(timeout)], capture_output=True, text=True, timeout=30
    )
    return done.stdout.strip() or done.stderr.strip()


def serve(host: harness.Host) -> subprocess.Popen[bytes]:
    process = host.run([sys.executable, "-c", SERVE, host.address, str(PORT)])
    wait_for_sync(lambda: "listening" in host.log.read_text(), f"a server on {host.name}")
    return process


def root_addresses() -> set[str]:
    out = set()
    for entry in json.loads(ip("-j", "addr", "show")):
        out.update(info["local"] for info in entry.get("addr_info", ()))
    return out


def our_names(stem: str) -> list[str]:
    namespaces = [line.split()[0] for line in ip("netns", "list").splitlines() if line]
    links = [link["ifname"] for link in json.loads(ip("-j", "link", "show"))]
    return [n for n in namespaces + links if n.startswith(stem)]


def test_hosts_are_network_stacks_on_a_bridge_in_the_benchmarking_range() -> None:
    before = root_addresses()
    with Hosts(3) as hosts:
        assert ipaddress.ip_address(hosts.address) in NETWORK
        assert hosts.subnet.subnet_of(NETWORK)
        # The root namespace gained the bridge's address and nothing else of this
        # subnet; another process of the suite may make a harness of its own meanwhile,
        # whose bridge is in the benchmarking range too, never outside it.
        gained = root_addresses() - before
        assert {a for a in gained if ipaddress.ip_address(a) in hosts.subnet} == {hosts.address}
        assert all(ipaddress.ip_address(a) in NETWORK for a in gained), gained
        for host in hosts:
            inside = json.loads(ip("-n", host.namespace, "-j", "addr", "show"))
            addresses = {i["local"] for e in inside for i in e.get("addr_info", ())}
            assert addresses == {"127.0.0.1", "::1", host.address}
            assert ipaddress.ip_address(host.address) in hosts.subnet
        assert len({h.address for h in hosts}) == 3
        serve(hosts[0])
        assert connect(hosts[1], hosts[0].address) == "connected"
        assert connect(hosts[2], hosts[0].address) == "connected"
        # The host is a stack of its own: its address is not the root namespace's.
        assert hosts[0].address not in root_addresses()


def test_a_killed_host_has_no_process_left() -> None:
    with Hosts(2) as hosts:
        victim, other = hosts
        # A process with a child of its own, and a second one: all must die at once.
        family = "import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\ntime.sleep(600)\n"
        started = [victim.run([sys.executable, "-c", family]) for _ in range(2)]
        survivor = other.run([sys.executable, "-c", "import time; time.sleep(600)"])
        wait_for_sync(lambda: len(victim.pids()) == 4, "four processes in the host")
        killed = victim.kill()
        assert len(killed) == 4
        assert victim.pids() == []
        assert [p.returncode for p in started] == [-9, -9]
        assert survivor.poll() is None and other.pids() == [survivor.pid]


def test_a_host_cut_off_is_unreachable_until_healed() -> None:
    with Hosts(2) as hosts:
        a, b = hosts
        server = serve(a)
        a.cut_off()
        # Silent: the connection attempt times out (nothing answers, not even a reset).
        assert connect(b, a.address) == "TimeoutError"
        assert server.poll() is None  # alive, only unreachable
        a.heal()
        wait_for_sync(lambda: connect(b, a.address) == "connected", "a reachable again")


def test_two_hosts_cut_apart_reach_everyone_but_each_other() -> None:
    with Hosts(3) as hosts:
        a, b, c = hosts
        for host in hosts:
            serve(host)
        hosts.cut_apart(a, b)
        assert connect(a, b.address) == "TimeoutError"
        assert connect(b, a.address) == "TimeoutError"
        assert connect(a, c.address) == connect(b, c.address) == "connected"
        assert connect(c, a.address) == connect(c, b.address) == "connected"
        hosts.join_apart(a, b)
        wait_for_sync(lambda: connect(a, b.address) == "connected", "a reaches b again")
        assert connect(b, a.address) == "connected"


def test_everything_made_is_removed_also_when_the_code_using_it_fails() -> None:
    with pytest.raises(ZeroDivisionError), Hosts(2) as hosts:
        stem = hosts.stem
        hosts[0].run([sys.executable, "-c", "import time; time.sleep(600)"])
        hosts.add()
        hosts.cut_apart(hosts[0], hosts[1])
        hosts[1].cut_off()
        pids = hosts[0].pids()
        assert len(our_names(stem)) == 1 + 2 * 3  # bridge; per host a namespace, a veth
        raise ZeroDivisionError  # the code using the hosts fails
    assert our_names(stem) == []
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not hosts.logs.exists()


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_the_sweep_removes_what_a_dead_run_left_and_nothing_else() -> None:
    dead = f"{harness.PREFIX}{_dead_pid()}z"
    unrelated = "amm-rules-test-unrelated"
    live = Hosts(1)
    try:
        with live:
            # A dead run's bridge, veth and namespace with a process still inside.
            ip("link", "add", f"{dead}-br", "type", "bridge")
            ip("netns", "add", f"{dead}-h1")
            ip(
                "link",
                "add",
                f"{dead}-1",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                f"{dead}-h1",
            )
            left = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    f"{dead}-h1",
                    sys.executable,
                    "-c",
                    "import time; time.sleep(600)",
                ]
            )
            wait_for_sync(lambda: harness.namespace_pids(f"{dead}-h1"), "the leftover process")
            ip("netns", "add", unrelated)
            removed = sweep()
            assert sorted(removed) == sorted([f"{dead}-h1", f"{dead}-1", f"{dead}-br"])
            assert our_names(dead) == []
            assert left.wait(timeout=10) == -9
            # A live run's names and a name without the prefix are left alone.
            assert len(our_names(live.stem)) == 3
            assert unrelated in ip("netns", "list")
    finally:
        ip("netns", "del", unrelated, check=False)
        for name in (f"{dead}-br", f"{dead}-1"):
            ip("link", "del", name, check=False)
        ip("netns", "del", f"{dead}-h1", check=False)


def test_ip_errors_say_what_failed() -> None:
    with pytest.raises(HostsError, match=r"^ip link set amrh-no-such-link up: "):
        ip("link", "set", "amrh-no-such-link", "up")


def test_processes_a_host_starts_run_inside_it() -> None:
    with Hosts(1) as hosts:
        (host,) = hosts
        process = host.run([sys.executable, "-c", "import time; time.sleep(600)"])
        wait_for_sync(lambda: host.pids() == [process.pid], "the process in the host")
        assert os.readlink(f"/proc/{process.pid}/ns/net") != os.readlink("/proc/self/ns/net")


def test_without_root_or_ip_the_reason_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert unavailable() == "network namespaces need root"
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(harness.shutil, "which", lambda name: None)
    assert unavailable() == "the ip command (iproute2) is not installed"
    monkeypatch.setattr(harness.sys, "platform", "darwin")
    assert unavailable() == "network namespaces need Linux, not darwin"
