"""A labgrid lab on loopback: a coordinator, exporters of mock Calculet boards, and an sshd for "remote" boards.

Used by tests/integration/test_lab.py (docs/lab.md, "Tested").

* :func:`sshd` runs Debian's ``/usr/sbin/sshd`` as a non-daemon child on a free loopback port with a throwaway
  host key and an authorized key, everything in a private directory, and writes an ``ssh_config`` naming the
  host ``calctl-lab-sshd`` plus ``ssh``/``scp`` wrappers that use it (labgrid calls ``ssh`` from PATH and reads
  the user's ``~/.ssh/config``; the wrappers keep the test out of ``~/.ssh``);
* :class:`Lab` starts ``labgrid-coordinator`` on a free port (its state files in its own directory) and
  ``labgrid-exporter`` processes from resource configs, tags the places the exporters create, and stops
  everything on every path (each child leads its own process group).

Nothing here talks to anything but 127.0.0.1 and nothing is written outside the given directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.integration.multiboard_harness import free_port, stop_process
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
SSH_HOST = "calctl-lab-sshd"
SSHD = "/usr/sbin/sshd"


def labgrid_bin(name: str) -> str | None:
    """A labgrid console script of this interpreter's environment (or on PATH)."""
    here = Path(sys.executable).parent / name
    return str(here) if here.is_file() else shutil.which(name)


def sshd_missing() -> str | None:
    """Why an sshd cannot run here, or None."""
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is not installed (Debian's openssh-server; .ci/run installs it)"
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (openssh-client)"
    if os.geteuid() == 0 and not Path("/run/sshd").is_dir():
        return "sshd run as root needs its privilege separation directory /run/sshd (.ci/run's install_sshd makes it)"
    return None


def calctl_command(env: dict[str, str] | None = None) -> str:
    """How a board's host starts this checkout's calctl (the resource's ``calctl`` field)."""
    pairs = {"PYTHONPATH": str(REPO), **(env or {})}
    return "env " + " ".join(f"{k}={v}" for k, v in pairs.items()) + f" {sys.executable} -m calctl"


@dataclass
class Sshd:
    proc: subprocess.Popen[bytes]
    port: int
    bin_dir: Path  # holds the ssh and scp wrappers: put it first on PATH
    config: Path


@contextlib.contextmanager
def sshd(root: Path) -> Iterator[Sshd]:
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    host_key, user_key = root / "host_ed25519", root / "user_ed25519"
    for key in (host_key, user_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (root / "authorized_keys").write_text(user_key.with_suffix(".pub").read_text())
    os.chmod(root / "authorized_keys", 0o600)
    port = free_port()
    user = os.environ.get("USER") or ("root" if os.geteuid() == 0 else "nobody")
    (root / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nPidFile {root / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {root / 'authorized_keys'}\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
        "PrintMotd no\nLogLevel ERROR\nMaxSessions 64\nMaxStartups 64\n"
    )
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key.with_suffix('.pub').read_text()}")
    config = root / "ssh_config"
    config.write_text(
        f"Host {SSH_HOST}\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {user_key}\n"
        f"  IdentitiesOnly yes\n  UserKnownHostsFile {root / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
        "  BatchMode yes\n  ControlMaster no\n"
    )
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for tool in ("ssh", "scp"):
        real = shutil.which(tool)
        wrapper = bin_dir / tool
        wrapper.write_text(f'#!/bin/sh\nexec {real} -F {config} "$@"\n')
        wrapper.chmod(0o755)
    log = open(root / "sshd.log", "wb")  # noqa: SIM115  # closed with the process below
    proc = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(root / "sshd_config")],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_until(
            lambda: _accepts(port) or _exited(proc, root / "sshd.log"),
            what=f"sshd listening on 127.0.0.1:{port}",
            interval=0.05,
        )
        probe = subprocess.run(
            [str(bin_dir / "ssh"), SSH_HOST, "echo ok"], capture_output=True, text=True, timeout=60, check=False
        )
        assert probe.stdout.strip() == "ok", f"ssh to the test sshd failed: {probe.stderr}"
        yield Sshd(proc, port, bin_dir, config)
    finally:
        stop_process(proc)
        log.close()


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _exited(proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"exited {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
    return False


@dataclass
class Lab:
    """A coordinator and its exporters (by name); ``env`` is what a client process needs (LG_COORDINATOR, PATH)."""

    root: Path
    address: str
    coordinator: subprocess.Popen[bytes]
    exporters: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def start_exporter(self, name: str, resources: str) -> None:
        config = self.root / f"{name}.yaml"
        config.write_text(resources)
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115  # inherited by the child, closed here
        exporter = labgrid_bin("labgrid-exporter")
        assert exporter is not None
        self.exporters[name] = subprocess.Popen(
            [exporter, "-c", self.address, "-n", name, str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.root,
            start_new_session=True,
        )
        log.close()

    def client(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        client = labgrid_bin("labgrid-client")
        assert client is not None
        return subprocess.run(
            [client, "-x", self.address, *args], capture_output=True, text=True, env=self.env, timeout=120, check=check
        )

    def wait_resources(self, paths: list[str]) -> None:
        """Until the coordinator lists every ``exporter/group/cls`` of ``paths`` (the exporters have registered)."""

        def listed() -> bool:
            out = self.client("resources", check=False).stdout.split()
            return all(p in out for p in paths)

        wait_until(listed, what=f"resources {paths} exported", timeout=120, interval=0.5)

    def add_place(self, name: str, match: str, tags: list[str]) -> None:
        """A place, as docs/lab.md creates one: its match and its tags."""
        self.client("-p", name, "create")
        self.client("-p", name, "add-match", match)
        self.client("-p", name, "set-tags", *tags)

    def kill_exporter(self, name: str) -> None:
        proc = self.exporters[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    def stop(self) -> None:
        for proc in self.exporters.values():
            stop_process(proc)
        stop_process(self.coordinator)


@contextlib.contextmanager
def lab(root: Path, env: dict[str, str]) -> Iterator[Lab]:
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    address = f"127.0.0.1:{port}"
    coordinator = labgrid_bin("labgrid-coordinator")
    assert coordinator is not None
    log = open(root / "coordinator.log", "ab")  # noqa: SIM115  # inherited by the child, closed here
    proc = subprocess.Popen(
        [coordinator, "-l", address],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=root,
        env=env,
        start_new_session=True,
    )
    log.close()
    the_lab = Lab(root, address, proc, env={**env, "LG_COORDINATOR": address})
    try:
        wait_until(
            lambda: _accepts(port) or _exited(proc, root / "coordinator.log"),
            what=f"labgrid-coordinator on {address}",
            timeout=60,
            interval=0.05,
        )
        yield the_lab
    finally:
        the_lab.stop()


def wait_for_line(path: Path, needle: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 300) -> None:
    """Until ``path`` holds ``needle`` (a board's log once its command is under way)."""

    def seen() -> bool:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process ended (exit {proc.returncode}) before {path} said {needle!r}")
        return path.is_file() and needle in path.read_text(errors="replace")

    wait_until(seen, what=f"{needle!r} in {path}", timeout=timeout, interval=0.1)


def elapsed(t0: float) -> float:
    return time.monotonic() - t0
