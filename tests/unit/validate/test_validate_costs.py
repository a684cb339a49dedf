"""Hostile packages, third pass: every cost an input can cause is bounded before the work it bounds.

Each attack is built here, in tmp_path (multi-stream compressed archives make a
"16 GiB" bomb of a few kilobytes in milliseconds: one compressed 64 MiB block of
zeros, repeated). The commands run in a subprocess that reports its own wall
time (from entering ``main``) and peak RSS, so the figures asserted are those of
the command, not of Python's start-up on a loaded machine. Limits are asserted
by their names in calctl, so a changed figure changes the test with it.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import signal
import struct
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from calctl.package import archive, yamlsafe
from calctl.package.model import MANIFEST
from calctl.package.rules import context
from calctl.signing import seal
from calctl.signing.files import CHECKSUMS
from tests.conftest import TEST_PUB, Cli
from tests.unit.validate.validate_factory import copy_package, edit_manifest, reseal, validate_json
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[3]
#: What "refused quickly" means for a bomb on this (shared, 2-core) machine: the issue's figures.
BOMB_SECONDS = 5.0
BOMB_RSS_MB = 300
#: A command that used to run for minutes is given this long before the test calls it a hang.
HANG_S = 90
#: SIGINT must end a long case within this (measured from the signal to the process's exit).
SIGINT_S = 1.0

# Peak RSS is this process's own VmHWM: ru_maxrss keeps the high-water mark of the process it was forked from
# across exec (Linux), so a child of a large pytest worker would report the worker's size, not its own.
_MEASURED = """
import sys, time
t0 = time.monotonic()
from calctl.cli.app import main
code = main(sys.argv[1:])
sys.stdout.flush()
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(f"MEASURED seconds={time.monotonic() - t0:.3f} rss_kb={hwm}", file=sys.stderr)
sys.exit(code)
"""


def measured(*args: Any, prelude: str = "") -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run calctl in a fresh interpreter; return (result, seconds inside main, peak RSS in MB)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("CALCTL_TRUSTED_KEYS", None)
    r = subprocess.run(
        [sys.executable, "-c", prelude + _MEASURED, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=env,
    )
    text = r.stdout + r.stderr
    assert "Traceback" not in text and "internal error" not in text, text[-3000:]
    line = next(x for x in r.stderr.splitlines() if x.startswith("MEASURED"))
    fields = dict(kv.split("=") for kv in line.split()[1:])
    return r, float(fields["seconds"]), int(fields["rss_kb"]) / 1024


def _header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.type = kind
    return info.tobuf(format=tarfile.GNU_FORMAT)


_COMPRESS: dict[str, Callable[[bytes], bytes]] = {"bz2": bz2.compress, "gz": gzip.compress, "xz": lzma.compress}


def bomb(path: Path, kind: str, header: bytes, gib: int) -> Path:
    """``header`` followed by ``gib`` GiB of zeros, as a multi-stream archive of a few KB."""
    block = _COMPRESS[kind](bytes(64 * 1024**2))
    path.write_bytes(_COMPRESS[kind](header) + block * (gib * 16))
    return path


def lay007(doc: dict[str, Any]) -> str:
    msgs = [c["message"] for c in doc["checks"] if c["id"] == "LAY007" and c["status"] == "fail"]
    assert msgs, doc["checks"][:3]
    return msgs[0]


# ---------------------------------------------------------------------------
# 1. Archives: declared sizes and extended headers are checked before a byte is decompressed or buffered


@pytest.mark.parametrize(("kind", "gib"), [("bz2", 2), ("bz2", 16), ("gz", 16), ("xz", 16)])
def test_member_declaring_gigabytes_is_refused_from_its_header(tmp_path: Path, kind: str, gib: int) -> None:
    pkg = bomb(tmp_path / f"bomb.tar.{kind}", kind, _header("pkg/blob.bin", gib * 1024**3), gib)
    assert pkg.stat().st_size * archive.MAX_EXPANSION + archive.EXPANSION_SLACK_BYTES < gib * 1024**3
    r, seconds, rss = measured("validate", pkg, "--format", "json")
    assert r.returncode == 1
    message = lay007(json.loads(r.stdout))
    limit = archive.MAX_EXPANSION * pkg.stat().st_size + archive.EXPANSION_SLACK_BYTES
    assert f"declare {gib * 1024**3} bytes" in message and f"over the limit of {limit} bytes" in message, message
    assert rss < BOMB_RSS_MB, (seconds, rss)  # the wall time: benchmarks/bench_hostile.py


@pytest.mark.parametrize(
    ("kind", "header", "what"),
    [
        ("bz2", tarfile.XHDTYPE, "PAX"),
        ("gz", tarfile.XGLTYPE, "PAX"),
        ("xz", tarfile.GNUTYPE_LONGNAME, "GNU long-name/long-link"),
        ("bz2", tarfile.GNUTYPE_LONGLINK, "GNU long-name/long-link"),
    ],
)
def test_extended_header_of_a_gibibyte_is_refused_before_it_is_buffered(
    tmp_path: Path, kind: str, header: bytes, what: str
) -> None:
    pkg = bomb(tmp_path / f"pax.tar.{kind}", kind, _header("././@PaxHeader", 1024**3, header), 1)
    r, seconds, rss = measured("validate", pkg, "--format", "json")
    assert r.returncode == 1
    message = lay007(json.loads(r.stdout))
    assert f"{what} header of {1024**3} bytes" in message, message
    assert f"over the {archive.MAX_EXTENDED_HEADER_BYTES} byte limit" in message, message
    assert rss < BOMB_RSS_MB, (seconds, rss)  # the wall time: benchmarks/bench_hostile.py


def test_is_tar_reads_one_header_not_a_whole_pax_header(tmp_path: Path) -> None:
    pkg = bomb(tmp_path / "pax.tar.bz2", "bz2", _header("././@PaxHeader", 1024**3, tarfile.XHDTYPE), 1)
    with pytest.MonkeyPatch.context() as mp:  # nothing is decompressed: the magic says it is an archive
        mp.setattr(archive, "_Inflater", None)
        assert archive.is_tar(pkg)
    (tmp_path / "not.tar").write_bytes(b"x" * 600)
    assert not archive.is_tar(tmp_path / "not.tar")


def test_a_chain_of_extended_headers_is_bounded(tmp_path: Path) -> None:
    one = _header("././@PaxHeader", 1024, tarfile.XHDTYPE) + b"\0" * 1024
    data = one * (archive.MAX_EXTENDED_HEADERS_IN_A_ROW + 1) + _header("pkg/a", 0) + b"\0" * 1024
    pkg = tmp_path / "chain.tar"
    pkg.write_bytes(data)
    with pytest.raises(archive.PackageFormatError, match=f"more than {archive.MAX_EXTENDED_HEADERS_IN_A_ROW}"):
        archive.extract_package(pkg, tmp_path / "out")


def test_extraction_time_is_checked_inside_one_members_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One 60 MiB member (within the byte budget): the deadline is checked every READ_CHUNK, not per member."""
    pkg = bomb(tmp_path / "slow.tar.bz2", "bz2", b"", 0)
    member = _header("pkg/blob.bin", 60 * 1024**2)
    pkg.write_bytes(bz2.compress(member) + bz2.compress(bytes(60 * 1024**2)) + bz2.compress(bytes(1024)))
    monkeypatch.setattr(archive, "MAX_EXTRACT_SECONDS", 0.05)
    produced: list[int] = []
    real = archive._Inflater.read

    def read(self: archive._Inflater, n: int) -> bytes:
        produced.append(self.produced)
        return real(self, n)

    monkeypatch.setattr(archive._Inflater, "read", read)
    clock = iter(range(10**6))  # every look at the clock is 10 ms later: the deadline passes after 5 of them
    monkeypatch.setattr(archive.time, "monotonic", lambda: next(clock) / 100)
    (tmp_path / "out").mkdir()
    with pytest.raises(archive.PackageFormatError, match=r"longer than the 0\.05 s limit"):
        archive.extract_package(pkg, tmp_path / "out")
    # Stopped a few pieces into the one member, not after it (the deadline is checked inside its read).
    assert max(produced) <= 8 * archive.READ_CHUNK < 60 * 1024**2, max(produced)
    assert not any((tmp_path / "out").rglob("*")), "nothing is written before every header passed"


def test_a_real_compressed_package_still_extracts_in_two_forward_passes(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)
    plain = tmp_path / "pkg.tar"
    archive.write_tar(root, plain)
    for kind in ("gz", "bz2", "xz"):
        packed = tmp_path / f"pkg.tar.{kind}"
        packed.write_bytes(_COMPRESS[kind](plain.read_bytes()))
        code, doc = validate_json(cli, packed)
        assert code == 0, [c for c in doc["checks"] if c["status"] == "fail"]


# ---------------------------------------------------------------------------
# 3. Only a signal is an interrupt


def _cut_tgz(tmp_path: Path) -> Path:
    plain = tmp_path / "p.tar"
    archive.write_tar(copy_package(tmp_path), plain)
    cut = tmp_path / "cut.tgz"
    cut.write_bytes(gzip.compress(plain.read_bytes())[:40])  # inside the first 512-byte header
    return cut


def test_tgz_cut_inside_its_first_header_is_a_refusal_naming_the_file(tmp_path: Path) -> None:
    cut = _cut_tgz(tmp_path)
    r, _, _ = measured("validate", cut, "--format", "json")
    assert r.returncode == 1, r.stderr
    message = lay007(json.loads(r.stdout))
    assert "cut.tgz" in message and "corrupt gzip tar archive" in message and "first header" in message
    for command in ("verify", "inspect", "budget", "run-golden"):
        r, _, _ = measured(command, cut, "--trusted-key", TEST_PUB)
        assert r.returncode == 1, (command, r.returncode, r.stderr)
        assert "interrupted" not in r.stderr and "cut.tgz" in r.stdout + r.stderr, (command, r.stderr)


def test_a_library_eoferror_is_an_internal_error_not_an_interrupt(monkeypatch: pytest.MonkeyPatch, cli: Cli) -> None:
    from calctl.package import validate as validate_module

    def eof(*_a: Any, **_k: Any) -> None:
        raise EOFError("Compressed file ended before the end-of-stream marker was reached")

    monkeypatch.setattr(validate_module, "validate", eof)
    r = cli("validate", REPO / "fixtures" / "packages" / "single")
    assert r.code == 70 and "interrupted" not in r.err, (r.code, r.err)  # a bug, never the usage code
    assert "internal error (a calctl bug): EOFError: Compressed file ended" in r.err


@pytest.mark.parametrize(
    ("tolerance", "vacuous"),
    [
        ({"rtol": 1e300, "atol": 1e300}, True),
        ({"rtol": 0.0, "atol": 1e6}, True),
        ({"rtol": 1.0, "atol": 0.0}, True),
        ({"rtol": 1e-4, "atol": 1e-4}, False),
    ],
)
def test_a_vacuous_tolerance_fails_gold007(
    tmp_path: Path, cli: Cli, tolerance: dict[str, float], vacuous: bool
) -> None:
    root = copy_package(tmp_path)

    def set_tolerance(doc: dict[str, Any]) -> None:
        for m in doc["models"]:
            m["golden"]["tolerance"].update(tolerance)

    edit_manifest(root, set_tolerance)
    reseal(root)
    code, doc = validate_json(cli, root)
    failing = {c["id"] for c in doc["checks"] if c["status"] == "fail"}
    assert failing == ({"GOLD007"} if vacuous else set()), failing
    assert code == (1 if vacuous else 0)
    if vacuous:
        message = next(c["message"] for c in doc["checks"] if c["id"] == "GOLD007")
        assert "vacuous" in message and "span only" in message


# ---------------------------------------------------------------------------
# 1. YAML, ELF, checksums and findings


def test_manifest_of_two_million_nodes_is_refused_in_seconds(tmp_path: Path) -> None:
    root = copy_package(tmp_path)
    flow = "flows: [" + ",".join(["1"] * 2_000_000) + "]\n"
    assert len(flow) < yamlsafe.DEFAULT_MAX_BYTES
    (root / MANIFEST).write_text(flow)
    r, seconds, rss = measured("validate", root, "--format", "json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    man = next(c for c in doc["checks"] if c["id"] == "MAN001" and c["status"] == "fail")
    assert f"more than {yamlsafe.MAX_NODES} YAML nodes" in man["message"], man
    assert rss < BOMB_RSS_MB, (seconds, rss)  # the wall time: benchmarks/bench_hostile.py


def test_yaml_node_and_time_limits_hold_in_the_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    small = "[" + ",".join(["1"] * (yamlsafe.MAX_NODES - 1)) + "]"
    assert len(yamlsafe.loads(small, source="m")) == yamlsafe.MAX_NODES - 1
    with pytest.raises(yamlsafe.PackageFormatError, match=f"more than {yamlsafe.MAX_NODES} YAML nodes"):
        yamlsafe.loads("[" + ",".join(["1"] * yamlsafe.MAX_NODES) + "]", source="m")
    monkeypatch.setattr(yamlsafe, "MAX_PARSE_SECONDS", 0.0)
    with pytest.raises(yamlsafe.PackageFormatError, match="more than the 0 s of CPU time"):
        yamlsafe.loads("[" + ",".join(["1"] * 5000) + "]", source="m")


def test_the_yaml_time_limit_is_the_parsing_threads_cpu_time_not_the_wall_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A loaded host stretches the wall clock, not the parser's work: beside 8 CPU burners and the suite, the 11 ms
    parse of the sample manifest once overran 10 s of wall clock and a healthy package failed validation. Here the
    wall clock jumps 100 s at every reading and the document still parses."""
    import itertools
    import time

    ticks = itertools.count(start=time.monotonic(), step=100.0)
    monkeypatch.setattr(yamlsafe.time, "monotonic", lambda: next(ticks))
    doc = "[" + ",".join(["1"] * 5000) + "]"
    assert len(yamlsafe.loads(doc, source="m")) == 5000


def _elf_pn_xnum(path: Path) -> None:
    """e_phnum = PN_XNUM, e_phoff = 0, section 0's sh_info = 2**32 - 1: 4.3 billion program headers."""
    b = bytearray(path.read_bytes())
    assert b[:4] == b"\x7fELF" and b[4] == 2 and b[5] == 1  # ELF64 little-endian
    shoff = struct.unpack_from("<Q", b, 0x28)[0]
    struct.pack_into("<Q", b, 0x20, 0)  # e_phoff
    struct.pack_into("<H", b, 0x38, 0xFFFF)  # e_phnum
    struct.pack_into("<I", b, shoff + 44, 0xFFFFFFFF)  # section 0 sh_info
    path.write_bytes(bytes(b))


def test_elf_with_pn_xnum_and_four_billion_segments_fails_elf001_at_once(tmp_path: Path) -> None:
    root = copy_package(tmp_path)
    elf = root / "model-a/prefill/ccu0_chip0.elf"
    _elf_pn_xnum(elf)
    reseal(root)
    r, seconds, rss = measured("validate", root, "--trusted-key", TEST_PUB, "--format", "json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    elf001 = [c for c in doc["checks"] if c["id"] == "ELF001" and c["status"] == "fail"]
    assert any(
        c["field"] == "/e_phnum" and c["found"] == str(0xFFFFFFFF) and str(context.MAX_PROGRAM_HEADERS) in c["expected"]
        for c in elf001
    ), elf001
    assert rss < BOMB_RSS_MB, (seconds, rss)  # the wall time: benchmarks/bench_hostile.py


def test_checksums_listing_more_entries_than_a_package_holds_is_one_finding(tmp_path: Path) -> None:
    root = copy_package(tmp_path)
    lines = "".join(f"{'0' * 64}  missing/{i:06d}.bin\n" for i in range(100_000))
    (root / CHECKSUMS).write_text((root / CHECKSUMS).read_text() + lines)
    r, _seconds, _ = measured("validate", root, "--trusted-key", TEST_PUB)
    assert r.returncode == 1
    assert f"more than the {seal.MAX_CHECKSUM_ENTRIES} files a package may hold" in r.stdout
    assert seal.MAX_CHECKSUM_ENTRIES == archive.MAX_MEMBERS


def test_findings_per_rule_are_capped_in_the_table_and_counted_in_json(tmp_path: Path, cli: Cli) -> None:
    from calctl.cli.validate_cmds import MAX_SHOWN_PER_RULE

    root = copy_package(tmp_path)
    extra = root / "model-a" / "extra"
    extra.mkdir()
    for i in range(300):
        (extra / f"f{i:03d}.bin").write_bytes(b"x")
    code, doc = validate_json(cli, root)
    hash002 = [c for c in doc["checks"] if c["id"] == "HASH002" and c["status"] == "fail"]
    assert code == 1 and len(hash002) == 300 and doc["errors"] >= 300
    r = cli("validate", root, "--trusted-key", TEST_PUB)
    assert r.code == 1
    shown = [line for line in r.out.splitlines() if line.strip().startswith("FAIL HASH002")]
    assert len(shown) == MAX_SHOWN_PER_RULE
    assert f"... and {300 - MAX_SHOWN_PER_RULE} more HASH002 entries" in r.out
    r = cli("verify", root, "--trusted-key", TEST_PUB)
    assert r.code == 1 and "... and 280 more hash findings" in r.out


def test_a_directory_of_too_many_entries_is_walked_no_further_than_the_limit(tmp_path: Path, cli: Cli) -> None:
    from calctl.package.validate import SizeLimits, ValidationPolicy, validate

    root = copy_package(tmp_path)
    for i in range(200):
        (root / f"junk{i:03d}").write_bytes(b"")
    report = validate(root, ValidationPolicy(limits=SizeLimits(max_files=50)))
    lay005 = [c for c in report.checks if c.id == "LAY005" and c.status.value == "fail"]
    assert any("the walk stopped there" in c.message and c.found == "more than 50" for c in lay005), lay005
    assert sum(1 for c in report.checks if c.id == "LAY006") <= 52


# ---------------------------------------------------------------------------
# SIGINT ends each long case within a second


def _interrupt_after(args: list[str], prelude: str, wait_s: float) -> tuple[float, subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("CALCTL_TRUSTED_KEYS", None)
    code = prelude + "\nfrom calctl.cli.app import main\nimport sys\nsys.exit(main(sys.argv[1:]))\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        time.sleep(wait_s)
        assert proc.poll() is None, f"the case ended before the signal: {proc.communicate()}"
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        _out, err = proc.communicate(timeout=HANG_S)
        return time.monotonic() - t0, proc, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("case", ["archive", "yaml", "hashing"])
def test_sigint_ends_each_long_case_within_a_second(tmp_path: Path, case: str) -> None:
    if case == "archive":  # a bomb the (raised) limits allow: 16 GiB of bz2 to decompress
        pkg = bomb(tmp_path / "big.tar.bz2", "bz2", _header("pkg/blob.bin", 16 * 1024**3), 16)
        prelude = "import calctl.package.archive as a\na.MAX_EXPANSION = 10**9\n"
    elif case == "yaml":  # a manifest the (raised) node limit allows: two million nodes
        pkg = copy_package(tmp_path)
        (pkg / MANIFEST).write_text("flows: [" + ",".join(["1"] * 2_000_000) + "]\n")
        prelude = "import calctl.package.yamlsafe as y\ny.MAX_NODES = 10**9\ny.MAX_PARSE_SECONDS = 1e9\n"
    else:  # hashing a 64 GiB (sparse) file listed in checksums.sha256, on several threads
        pkg = copy_package(tmp_path)
        with open(pkg / "model-a" / "big.bin", "wb") as fh:
            fh.truncate(64 * 1024**3)
        (pkg / CHECKSUMS).write_text((pkg / CHECKSUMS).read_text() + f"{'0' * 64}  model-a/big.bin\n")
        prelude = ""
    seconds, proc, err = _interrupt_after(["validate", str(pkg), "--jobs", "2"], prelude, wait_s=4.0)
    assert proc.returncode == 130, (proc.returncode, err[-2000:])  # Typer maps the KeyboardInterrupt to 130
    assert "Traceback" not in err and "internal error" not in err, err[-2000:]
    # How long from the signal to the exit (well under SIGINT_S): benchmarks/bench_hostile.py, not asserted on a
    # shared machine; that it ends at all, with 130, is.
    assert seconds < HANG_S, f"{case}: {seconds:.2f} s from SIGINT to exit"


def test_an_overlong_checksums_line_is_refused_before_it_is_parsed() -> None:
    from calctl.errors import PackageFormatError
    from calctl.signing.seal import MAX_CHECKSUM_LINE, parse_checksums

    data = b"a" * 64 + b"  " + b"x/" * 4_000_000 + b"\n"
    with pytest.raises(PackageFormatError) as err:
        parse_checksums(data)
    message = str(err.value)
    assert f"line 1 is {len(data) - 1:,} bytes, longer than the {MAX_CHECKSUM_LINE:,}" in message
    assert len(message) < 300  # the line itself is never quoted


def test_sigterm_ends_validate_with_130_and_removes_the_extracted_tree(tmp_path: Path) -> None:
    """SIGTERM is an interrupt like SIGINT for every command: exit 130 after the clean-up (it was 143, and the
    temporary extraction directory was left behind)."""
    # A long extraction the (raised) limits allow: 16 GiB of bz2 to decompress. (It was 400,000 empty gzip
    # members, which the stream limit now refuses at once.)
    slow = bomb(tmp_path / "slow.tar.bz2", "bz2", _header("pkg/blob.bin", 16 * 1024**3), 16)
    prelude = "import calctl.package.archive as a\na.MAX_EXPANSION = 10**9\n"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(scratch)}
    code = prelude + "from calctl.cli.app import main\nimport sys\nsys.exit(main(sys.argv[1:]))\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "validate", str(slow)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    wait_until(
        lambda: list(scratch.glob("calctl-pkg-*")) or proc.poll() is not None,
        what="validate to start extracting into its scratch folder",
        timeout=HANG_S,
        interval=0.05,
    )
    assert proc.poll() is None, "the archive was read before the signal could be sent"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert "Traceback" not in err
    assert not list(scratch.glob("calctl-pkg-*"))
