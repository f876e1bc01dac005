"""Hosts as Linux network namespaces: real failure domains on one machine.

Each :class:`Host` is a network namespace (``ip netns``) joined by a veth pair to a bridge
that :class:`Hosts` creates in the root namespace. Every address comes from the
benchmarking range 198.18.0.0/15 (RFC 2544): a free ``/24`` of it per run, the bridge on
``.1`` (where a scheduler in the root namespace listens), host ``i`` on ``.(10 + i)``.
Worker processes (``dask worker`` with nannies) run inside a host's namespace through
``ip netns exec``, so each host has its own network stack and ``worker.host`` really
differs between hosts.

The faults of a failure domain:

- :meth:`Host.kill`: SIGKILL to every process in the host's namespace at once (``ip netns
  pids``), as when a machine loses power: no process gets to say goodbye;
- :meth:`Host.cut_off` / :meth:`Host.heal`: the root side of the host's veth goes down
  and up again: its processes live on, unreachable, and their connections stall (no
  reset reaches anyone) until the link comes back;
- :meth:`Hosts.cut_apart` / :meth:`Hosts.join_apart`: two hosts no longer reach each
  other, while both still reach the scheduler and every other host. This kernel offers
  no packet filter to do it with (no ``iptables`` or ``nft`` program, and its traffic
  control has neither the ``flower`` classifier nor the ``gact`` drop action), so each
  of the two namespaces gets a permanent neighbour entry that maps the other's address
  to a hardware address no interface has: frames for the other host are flooded by the
  bridge and dropped by every port, silently, like a firewall's DROP (a ``blackhole``
  or ``unreachable`` route would instead fail the sender at once).

Latency, loss and reordering (``netem``) are not available in this kernel: the harness
does not offer them rather than imitate them.

Everything a :class:`Hosts` makes it removes when it closes, also when the code using it
failed: the processes in its namespaces (by their PIDs), the namespaces (and with them
their ends of the veth pairs), the root ends and the bridge. Names carry the harness's
prefix and the PID of the process that made them (``amrh<pid><letter>-br``, ``-<i>`` for a
veth, ``-h<i>`` for a namespace); :func:`sweep` removes what a run that died left behind,
by that prefix, and only where the PID is no longer alive, so that concurrent runs on
one machine leave each other alone.

Needs Linux, root and ``ip`` (iproute2): :func:`unavailable` says why not. Uses the
standard library only. Neighbours: :mod:`benchmarks.support.host_scenarios` runs a
cluster on these hosts; ``tests/engine/policy/test_hosts.py`` and ``benchmarks/hosts.py`` use both.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

#: The prefix of every name the harness gives (namespaces, links).
PREFIX = "amrh"
#: The benchmarking range (RFC 2544): never routed on the internet, never a private range.
NETWORK = ipaddress.ip_network("198.18.0.0/15")
#: A hardware address no interface has (locally administered): where a cut-apart host's
#: frames for the other host go, to be dropped.
NOWHERE_MAC = "02:00:5e:ff:ff:fe"
#: Seconds an ``ip`` command may take.
IP_TIMEOUT = 10.0
#: Seconds the processes of a killed host may take to be gone.
KILL_TIMEOUT = 10.0

_NAME = re.compile(rf"^{PREFIX}(\d+)([a-z])-")
_made: list[str] = []  # letters of this process's open instances: names stay unique


class HostsError(RuntimeError):
    """An ``ip`` command failed, or what the harness made could not be removed."""


def unavailable() -> str | None:
    """Why hosts cannot be made here (not Linux, not root, no ``ip``), or None."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, not {sys.platform}"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    try:
        ip("netns", "list")
    except HostsError as exc:
        return f"ip netns does not work here: {exc}"
    return None


def ip(*args: str, check: bool = True) -> str:
    """Run ``ip ARGS``; its output. A failure raises :class:`HostsError` with ip's words."""
    try:
        done = subprocess.run(
            ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HostsError(f"ip {' '.join(args)}: {exc}") from exc
    if check and done.returncode != 0:
        raise HostsError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def namespace_pids(namespace: str) -> list[int]:
    """PIDs of the processes inside a network namespace (none if it is gone)."""
    out = ip("netns", "pids", namespace, check=False)
    return [int(p) for p in out.split()]


def kill_namespace(namespace: str) -> list[int]:
    """SIGKILL every process in ``namespace``, one call after the other (no process runs
    in between long enough to react); the PIDs signalled."""
    pids = namespace_pids(namespace)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def _wait_gone(namespace: str, timeout: float = KILL_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while pids := namespace_pids(namespace):
        if time.monotonic() > deadline:
            raise HostsError(f"processes {pids} in {namespace} outlived SIGKILL by {timeout} s")
        time.sleep(0.01)


class Host:
    """One host: a network namespace with an address, and the processes started in it."""

    def __init__(self, hosts: Hosts, index: int):
        self.hosts = hosts
        self.index = index
        #: What the scenarios call it (``h1``, ``h2``, ...); the workers' name prefix.
        self.name = f"h{index}"
        self.namespace = f"{hosts.stem}-h{index}"
        #: The root namespace's end of the veth pair (a port of the bridge).
        self.veth = f"{hosts.stem}-{index}"
        self.address = str(hosts.subnet.network_address + 10 + index)
        #: The processes started here (``dask worker`` and whatever it starts).
        self.processes: list[subprocess.Popen[bytes]] = []
        self.log = hosts.logs / f"{self.name}.log"
        #: Whether the host is cut off (its veth down).
        self.is_cut = False
        #: How many times workers were started here.
        self.starts = 0

    def __repr__(self) -> str:
        state = "cut off" if self.is_cut else "connected"
        return f"<Host {self.name} {self.address} {state}, {len(self.pids())} processes>"

    def _create(self) -> None:
        ns = self.namespace
        ip("netns", "add", ns)
        ip("link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        # No IPv6 link-local addresses: the hosts' only addresses are the harness's own.
        ip("link", "set", self.veth, "addrgenmode", "none")
        ip("-n", ns, "link", "set", "eth0", "addrgenmode", "none")
        ip("link", "set", self.veth, "master", self.hosts.bridge, "up")
        prefix = self.hosts.subnet.prefixlen
        ip("-n", ns, "addr", "add", f"{self.address}/{prefix}", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")

    # -- processes ----------------------------------------------------------------------

    def run(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside the host's namespace; output goes to its log."""
        with self.log.open("ab") as log:
            process = subprocess.Popen(
                ["ip", "netns", "exec", self.namespace, *argv],
                env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def start_workers(
        self,
        scheduler: str,
        nworkers: int = 2,
        *,
        nthreads: int = 1,
        memory_limit: str = "1 GiB",
        env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """``dask worker`` with ``nworkers`` nannies in this host, listening on the host's
        address, named ``<host>.<n>-<i>`` for the ``n``-th start in the host (worker names
        are unique in a cluster)."""
        self.starts += 1
        argv = [
            sys.executable,
            "-m",
            "distributed.cli.dask_worker",
            scheduler,
            "--nworkers",
            str(nworkers),
            "--nthreads",
            str(nthreads),
            "--host",
            self.address,
            "--name",
            f"{self.name}.{self.starts}",
            "--memory-limit",
            memory_limit,
            "--no-dashboard",
            "--death-timeout",
            "60",
        ]
        return self.run(argv, env)

    def pids(self) -> list[int]:
        """PIDs of every process in the host's namespace now."""
        return namespace_pids(self.namespace)

    def kill(self) -> list[int]:
        """Kill the host: SIGKILL to every process in it at once; returns when they are
        gone. The PIDs killed."""
        pids = kill_namespace(self.namespace)
        self.reap()
        _wait_gone(self.namespace)
        logger.info("killed host %s: processes %s", self.name, pids)
        return pids

    def reap(self) -> None:
        """Collect the exit status of the processes started here that ended."""
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=KILL_TIMEOUT)
        self.processes = [p for p in self.processes if p.returncode is None]

    def log_tail(self, lines: int = 20) -> str:
        """The last lines its processes wrote (for a failure's message)."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- the network ----------------------------------------------------------------------

    def cut_off(self) -> None:
        """Cut the host off the network: its veth goes down; its processes live on."""
        ip("link", "set", self.veth, "down")
        self.is_cut = True
        logger.info("cut off host %s", self.name)

    def heal(self) -> None:
        """Bring the host's veth up again."""
        ip("link", "set", self.veth, "up")
        self.is_cut = False
        logger.info("healed host %s", self.name)

    def _refuse(self, other: Host) -> None:
        ip(
            "-n",
            self.namespace,
            "neigh",
            "replace",
            other.address,
            "lladdr",
            NOWHERE_MAC,
            "dev",
            "eth0",
            "nud",
            "permanent",
        )

    def _accept(self, other: Host) -> None:
        ip("-n", self.namespace, "neigh", "del", other.address, "dev", "eth0", check=False)


class Hosts:
    """A bridge in the root namespace and ``n`` hosts on it; a context manager that
    removes all of it at the end, whatever happened in between (see the module).

    ``hosts[i]`` is host ``h{i + 1}``; :meth:`add` makes one more (a host joining).
    """

    def __init__(self, n: int = 3):
        letter = next((c for c in "abcdefghijklmnopqrstuvwxyz" if c not in _made), None)
        if letter is None:
            raise HostsError(f"26 instances of Hosts open in this process: {_made}")
        _made.append(letter)
        self._letter = letter
        #: The stem of every name of this instance: prefix, PID, letter.
        self.stem = f"{PREFIX}{os.getpid()}{letter}"
        self.bridge = f"{self.stem}-br"
        self.n = n
        self.hosts: list[Host] = []
        self.apart: set[frozenset[str]] = set()
        self.subnet = ipaddress.ip_network("198.18.0.0/24")
        self.logs = Path(tempfile.mkdtemp(prefix=f"{self.stem}-"))
        self._open = False

    # -- making ---------------------------------------------------------------------------

    def __enter__(self) -> Hosts:
        try:
            self._make_bridge()
            for _ in range(self.n):
                self.add()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        problems = self.close()
        if problems and exc[0] is None:
            raise HostsError("; ".join(problems))

    def _make_bridge(self) -> None:
        # Choosing a free /24 and taking it is one step for concurrent runs.
        lock = Path(tempfile.gettempdir()) / f"{PREFIX}-subnets.lock"
        with lock.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            self.subnet = _free_subnet()
            ip("link", "add", self.bridge, "type", "bridge")
            self._open = True
            ip("link", "set", self.bridge, "addrgenmode", "none")
            address = f"{self.subnet.network_address + 1}/{self.subnet.prefixlen}"
            ip("addr", "add", address, "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    @property
    def address(self) -> str:
        """The bridge's address in the root namespace: where a scheduler listens."""
        return str(self.subnet.network_address + 1)

    def add(self) -> Host:
        """A new host on the bridge (a machine joining the cluster)."""
        host = Host(self, len(self.hosts) + 1)
        self.hosts.append(host)
        host._create()
        return host

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def host_of(self, address: str) -> Host | None:
        """The host an address (``tcp://198.18.x.y:port`` or a bare IP) belongs to."""
        bare = address.split("://")[-1].rsplit(":", 1)[0]
        return next((h for h in self.hosts if h.address == bare), None)

    # -- faults between two hosts ---------------------------------------------------------

    def cut_apart(self, a: Host, b: Host) -> None:
        """``a`` and ``b`` no longer reach each other (both still reach everyone else)."""
        a._refuse(b)
        b._refuse(a)
        self.apart.add(frozenset((a.name, b.name)))
        logger.info("cut apart hosts %s and %s", a.name, b.name)

    def join_apart(self, a: Host, b: Host) -> None:
        """Undo :meth:`cut_apart`: each learns the other's hardware address again."""
        a._accept(b)
        b._accept(a)
        self.apart.discard(frozenset((a.name, b.name)))
        logger.info("joined hosts %s and %s again", a.name, b.name)

    # -- removing -------------------------------------------------------------------------

    def close(self) -> list[str]:
        """Kill every process in the hosts, remove the namespaces, the veths and the
        bridge. Never raises: returns what could not be removed (also logged)."""
        problems: list[str] = []
        for host in self.hosts:
            try:
                kill_namespace(host.namespace)
                host.reap()
                _wait_gone(host.namespace)
            except HostsError as exc:
                problems.append(str(exc))
        for host in self.hosts:
            # The root end first: deleting it removes the pair at once (a namespace's
            # devices go when the kernel gets round to destroying it).
            for argv in (("link", "del", host.veth), ("netns", "del", host.namespace)):
                if _exists(argv):
                    _try(argv, problems)
        if self._open and _exists(("link", "del", self.bridge)):
            _try(("link", "del", self.bridge), problems)
        self._open = False
        shutil.rmtree(self.logs, ignore_errors=True)
        if not problems and self._letter in _made:
            _made.remove(self._letter)  # its names are free again
        for problem in problems:
            logger.error("hosts: %s", problem)
        return problems


def _exists(argv: Sequence[str]) -> bool:
    kind, _, name = argv
    if kind == "netns":
        return name in _namespaces()
    return name in _links()


def _try(argv: Sequence[str], problems: list[str]) -> None:
    try:
        ip(*argv)
    except HostsError as exc:
        problems.append(str(exc))


def _namespaces() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def _links() -> list[str]:
    return [link["ifname"] for link in json.loads(ip("-j", "link", "show") or "[]")]


def _free_subnet() -> ipaddress.IPv4Network:
    """The first /24 of :data:`NETWORK` that no address or route of the root namespace
    touches."""
    used = []
    for entry in json.loads(ip("-j", "-4", "addr", "show") or "[]"):
        for info in entry.get("addr_info", ()):
            used.append(ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", False))
    for route in json.loads(ip("-j", "-4", "route", "show", "table", "all") or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(dst, False))
    for subnet in NETWORK.subnets(new_prefix=24):
        if not any(subnet.overlaps(u) for u in used):
            return subnet
    raise HostsError(f"no free /24 left in {NETWORK}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _dead(name: str) -> bool:
    """Whether ``name`` is the harness's and the process that made it is gone."""
    match = _NAME.match(name)
    return match is not None and not _alive(int(match.group(1)))


def sweep() -> list[str]:
    """Remove what harness runs that died left behind: namespaces (and their processes)
    and links named with :data:`PREFIX` whose PID is no longer alive. Never touches a
    name without the prefix, nor one of a live run. Returns the names removed."""
    if unavailable() is not None:
        return []
    removed: list[str] = []
    dead_namespaces = [n for n in _namespaces() if _dead(n)]
    for namespace in dead_namespaces:
        kill_namespace(namespace)
        _wait_gone(namespace)
    # Veths, then bridges, then namespaces: deleting a veth's root end removes the pair
    # at once, while a namespace's devices go when the kernel destroys it, later.
    for name in sorted((n for n in _links() if _dead(n)), key=lambda n: n.endswith("-br")):
        ip("link", "del", name, check=False)
        removed.append(name)
    for namespace in dead_namespaces:
        ip("netns", "del", namespace, check=False)
        removed.append(namespace)
    if removed:
        logger.warning("hosts: removed leftovers of an earlier run: %s", removed)
    return removed
