"""Hostile packages, third pass (issue 30, the tester's second round): compressed streams and member trees.

* An archive of hundreds of thousands of empty compressed streams (600,000 empty
  gzip members are 12 MB) cost 14 s before any limit applied: every stream after
  the first must now be paid for by what the streams decompress to
  (``archive.FREE_STREAMS`` plus one per ``archive.BYTES_PER_STREAM``).
* 9,999 members each 52 directories deep made half a million directories: the
  files and directories the members make are at most ``archive.MAX_ENTRIES``
  (directories only implied by a path count) and no path is deeper than
  ``archive.MAX_DEPTH``, both from the headers, before anything is written.
* A 60 KB value was quoted whole in MAN001: quoted values are shortened.

Limits are asserted by their figures; the bombs' wall time is in
``benchmarks/bench_hostile.py`` (not asserted here: the machine is shared).
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from calctl import textsafe
from calctl.errors import PackageFormatError
from calctl.package import archive
from calctl.package.model import MANIFEST
from calctl.package.validate import SizeLimits
from tests.conftest import Cli
from tests.unit.validate.test_validate_costs import BOMB_RSS_MB, lay007, measured
from tests.unit.validate.validate_factory import copy_package, edit_manifest, reseal, validate_json

_COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gz": lambda b: gzip.compress(b, mtime=0),
    "bz2": bz2.compress,
    "xz": lzma.compress,
}
_KIND = {"gz": "gzip", "bz2": "bzip2", "xz": "xz"}


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _streams(plain: bytes, kind: str, piece: int) -> bytes:
    """``plain`` compressed as one stream per ``piece`` bytes (what pbzip2 and concatenated .gz files do)."""
    comp = _COMPRESS[kind]
    return b"".join(comp(plain[i : i + piece]) for i in range(0, len(plain), piece))


# ---------------------------------------------------------------------------
# Compressed streams


@pytest.mark.parametrize("kind", ["gz", "bz2", "xz"])
@pytest.mark.parametrize("where", ["alone", "between headers"])
def test_hundreds_of_thousands_of_empty_streams_are_refused_at_the_stream_limit(
    tmp_path: Path, kind: str, where: str
) -> None:
    empty = _COMPRESS[kind](b"")
    count = 12_000_000 // len(empty)  # the tester's 12 MB file
    if where == "alone":
        data = empty * count
    else:
        blocks = _tar([("pkg/a", b"x" * 100), ("pkg/b", b"y" * 100)])
        data = _COMPRESS[kind](blocks[:1024]) + empty * count + _COMPRESS[kind](blocks[1024:])
    pkg = tmp_path / f"empty.tar.{kind}"
    pkg.write_bytes(data)
    r, _seconds, rss = measured("validate", pkg, "--format", "json")
    assert r.returncode == 1, r.stderr[-2000:]
    message = lay007(json.loads(r.stdout))
    assert str(pkg) in message and f"{_KIND[kind]} archive holds more than {archive.FREE_STREAMS} compressed" in message
    assert f"plus one per {archive.BYTES_PER_STREAM} bytes decompressed" in message, message
    assert rss < BOMB_RSS_MB, rss


def _xz_of_empty_blocks(n: int, payload: bytes) -> bytes:
    """One xz stream: ``n`` empty LZMA2 blocks whose declared dictionaries alternate (64 / 96 MiB: the decoder
    reallocates for each), then one block holding ``payload`` (stored uncompressed). A hostile tester's bomb."""
    import struct
    import zlib

    def crc(b: bytes) -> bytes:
        return struct.pack("<I", zlib.crc32(b) & 0xFFFFFFFF)

    def varint(v: int) -> bytes:
        out = b""
        while True:
            low, v = v & 0x7F, v >> 7
            if not v:
                return out + bytes([low])
            out += bytes([low | 0x80])

    def block(data: bytes, prop: int) -> tuple[bytes, int, int]:
        head = bytes([2, 0x00, 0x21, 0x01, prop]) + b"\0" * 3
        head += crc(head)
        body = b"".join(
            bytes([1 if i == 0 else 2]) + struct.pack(">H", len(data[i : i + 65536]) - 1) + data[i : i + 65536]
            for i in range(0, len(data), 65536)
        )
        body += b"\0"
        return head + body + b"\0" * ((-len(body)) % 4), len(head) + len(body), len(data)

    a, b = block(b"", 28), block(b"", 29)
    blocks = [a if i % 2 else b for i in range(n)] + [block(payload, 20)]
    index = b"\0" + varint(len(blocks)) + b"".join(varint(u) + varint(size) for _, u, size in blocks)
    index += b"\0" * ((-len(index)) % 4)
    index += crc(index)
    footer = struct.pack("<I", len(index) // 4 - 1) + b"\0\0"
    return b"".join(
        [b"\xfd7zXZ\x00\x00\x00", crc(b"\x00\x00"), *(blk for blk, _, _ in blocks), index, crc(footer), footer, b"YZ"]
    )


def test_decompression_that_produces_nothing_for_its_cpu_is_a_bomb(tmp_path: Path) -> None:
    """Many empty xz blocks in one stream (the stream cap does not see blocks): after
    ``DECOMPRESS_FREE_CPU_S`` of decompression a decompressor must have produced ``MIN_DECOMPRESS_RATE`` bytes per
    CPU second. The real figure is 1 s; the check itself is shown here on CPU the host cannot fake away: a run of
    the bomb with the allowance at 0 s is refused, the same archive without the empty blocks is read whole."""
    plain = _tar([("pkg/a", b"x" * 100)])
    bomb = tmp_path / "bomb.tar.xz"
    bomb.write_bytes(_xz_of_empty_blocks(20_000, plain))
    assert lzma.decompress(bomb.read_bytes()) == plain  # a valid xz file: the decoder itself accepts it
    import unittest.mock as mock

    with mock.patch.object(archive, "DECOMPRESS_FREE_CPU_S", 0.0), pytest.raises(PackageFormatError) as caught:
        archive.extract_package(bomb, tmp_path / "bomb")
    assert "decompression bomb" in str(caught.value) and str(archive.MIN_DECOMPRESS_RATE) in str(caught.value)
    good = tmp_path / "good.tar.xz"
    good.write_bytes(_xz_of_empty_blocks(0, plain))
    with mock.patch.object(archive, "DECOMPRESS_FREE_CPU_S", 0.0):
        root = archive.extract_package(good, tmp_path / "good")
    assert (root / "a").read_bytes() == b"x" * 100


def test_the_stream_limit_is_charged_before_each_stream_is_started(tmp_path: Path) -> None:
    """The refusal comes at stream FREE_STREAMS + 1: no further stream is decompressed (the work is the limit)."""
    started: list[int] = []
    real = archive._Inflater._next_stream

    def counting(self: archive._Inflater) -> bool:
        started.append(self.streams)
        return real(self)

    pkg = tmp_path / "empty.tar.gz"
    pkg.write_bytes(gzip.compress(b"", mtime=0) * 100_000)
    (tmp_path / "out").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(archive._Inflater, "_next_stream", counting)
        with pytest.raises(PackageFormatError, match=f"more than {archive.FREE_STREAMS} compressed streams"):
            archive.extract_package(pkg, tmp_path / "out")
    assert len(started) == archive.FREE_STREAMS + 1


@pytest.mark.parametrize("kind", ["gz", "bz2", "xz"])
def test_a_package_of_many_real_streams_still_extracts(tmp_path: Path, cli: Cli, kind: str) -> None:
    """pbzip2 writes one stream per 900 KB block, ``cat a.gz b.gz`` two members: each decompresses to far more
    than BYTES_PER_STREAM, so the limit is never near. Zero padding between gzip members and xz streams is valid."""
    plain = tmp_path / "pkg.tar"
    archive.write_tar(copy_package(tmp_path), plain)
    data = plain.read_bytes()
    piece = archive.BYTES_PER_STREAM + 1000
    assert len(data) // piece > archive.FREE_STREAMS  # more streams than the free ones: each paid for
    packed = _streams(data, kind, piece)
    if kind != "bz2":
        packed = b"".join(_COMPRESS[kind](data[i : i + piece]) + b"\0" * 8 for i in range(0, len(data), piece))
    target = tmp_path / f"pkg.tar.{kind}"
    target.write_bytes(packed)
    code, doc = validate_json(cli, target)
    assert code == 0, [c for c in doc["checks"] if c["status"] == "fail"]


@pytest.mark.parametrize(
    ("kind", "tail", "refused"),
    [("gz", b"garbage!", True), ("bz2", b"garbage!", False), ("xz", b"garbage!", False), ("gz", b"\0" * 7, False)],
)
def test_bytes_after_the_last_stream(tmp_path: Path, kind: str, tail: bytes, refused: bool) -> None:
    """As gzip, bzip2 and xz themselves: gzip refuses trailing garbage; bzip2 and xz ignore it; zeros are padding.

    The garbage sits before the tar's end-of-archive blocks, so the reader does reach it."""
    data = _tar([("pkg/a", b"x" * 100)])
    first, rest = data[:1024], data[1024:]
    pkg = tmp_path / f"tail.tar.{kind}"
    pkg.write_bytes(_COMPRESS[kind](first) + tail + _COMPRESS[kind](rest))
    (tmp_path / "out").mkdir()
    if refused:
        with pytest.raises(PackageFormatError, match="not a gzip stream where stream 2 should begin"):
            archive.extract_package(pkg, tmp_path / "out")
    else:
        # bzip2/xz end at the garbage, where the tar ends too (after member a, without its end-of-archive blocks,
        # which tarfile accepts); zero padding is skipped and the archive reads whole.
        archive.extract_package(pkg, tmp_path / "out")
        assert (tmp_path / "out" / "pkg" / "a").read_bytes() == b"x" * 100


def test_a_stream_cut_short_is_a_refusal_not_an_interrupt(tmp_path: Path) -> None:
    data = bz2.compress(_tar([("pkg/a", b"x" * 5000)]))
    pkg = tmp_path / "cut.tar.bz2"
    pkg.write_bytes(data[: len(data) // 2])
    (tmp_path / "out").mkdir()
    with pytest.raises(PackageFormatError) as err:
        archive.extract_package(pkg, tmp_path / "out")
    assert str(pkg) in str(err.value)


# ---------------------------------------------------------------------------
# The tree the members make


def test_the_entry_limit_is_the_directory_walks(tmp_path: Path) -> None:
    assert archive.MAX_ENTRIES == archive.MAX_MEMBERS == SizeLimits().max_files == 10_000
    assert archive.MAX_DEPTH == 32


def test_members_each_in_their_own_deep_chain_are_refused_at_the_entry_limit(tmp_path: Path) -> None:
    """The tester's 9,999 members nested 52 deep, at 20 deep (within the depth limit): ~200,000 directories."""
    depth = 20
    names = ["pkg/" + "/".join(f"d{i}_{k}" for k in range(depth)) + "/f" for i in range(9_999)]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", format=tarfile.PAX_FORMAT) as tf:
        for name in names:
            tf.addfile(tarfile.TarInfo(name))
    pkg = tmp_path / "deep.tar.xz"
    pkg.write_bytes(buf.getvalue())
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(PackageFormatError) as err:
        archive.extract_package(pkg, out)
    message = str(err.value)
    assert f"makes more than {archive.MAX_ENTRIES} files and directories" in message, message
    # refused at the member that passed the limit: 10,000 // (depth + 1) members in
    assert f"'pkg/d{archive.MAX_ENTRIES // (depth + 1)}_0/" in message, message
    assert not any(out.iterdir()), "nothing is written before every header passed"


def test_a_member_deeper_than_the_limit_is_refused_from_its_header(tmp_path: Path) -> None:
    name = "pkg/" + "d/" * archive.MAX_DEPTH + "f"
    pkg = tmp_path / "deep.tar"
    pkg.write_bytes(_tar([(name, b"")]))
    (tmp_path / "out").mkdir()
    with pytest.raises(PackageFormatError, match=rf"is {archive.MAX_DEPTH + 2} levels deep \(at most 32\)"):
        archive.extract_package(pkg, tmp_path / "out")
    ok = tmp_path / "ok.tar"
    ok.write_bytes(_tar([("pkg/" + "d/" * (archive.MAX_DEPTH - 2) + "f", b"z")]))
    (tmp_path / "out2").mkdir()
    root = archive.extract_package(ok, tmp_path / "out2")
    assert (root / ("d/" * (archive.MAX_DEPTH - 2) + "f")).read_bytes() == b"z"


def test_entries_count_implied_directories_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archive, "MAX_ENTRIES", 40)
    shared = tmp_path / "shared.tar"  # 39 files in one directory: 40 entries below pkg/
    shared.write_bytes(_tar([(f"pkg/d/f{i}", b"") for i in range(39)]))
    (tmp_path / "a").mkdir()
    archive.extract_package(shared, tmp_path / "a")
    spread = tmp_path / "spread.tar"  # 21 files in 21 directories: 42 entries
    spread.write_bytes(_tar([(f"pkg/d{i}/f", b"") for i in range(21)]))
    (tmp_path / "b").mkdir()
    with pytest.raises(PackageFormatError, match=r"more than 40 files and directories.*at member 'pkg/d20/f'"):
        archive.extract_package(spread, tmp_path / "b")


def test_pass_two_writes_each_member_from_where_pass_one_found_it(tmp_path: Path) -> None:
    """Members with PAX headers, empty members and directories, compressed and plain: the bytes come out right."""
    members = [(f"pkg/{'é' * 60}/{i}", bytes([i]) * (i * 700)) for i in range(12)] + [("pkg/empty", b"")]
    plain = _tar(members)
    for name, data in (("p.tar", plain), ("p.tar.gz", gzip.compress(plain)), ("p.tar.xz", _streams(plain, "xz", 3000))):
        (tmp_path / name).write_bytes(data)
        out = tmp_path / f"out-{name}"
        out.mkdir()
        root = archive.extract_package(tmp_path / name, out)
        for member, content in members:
            assert (root.parent / member).read_bytes() == content, (name, member)


# ---------------------------------------------------------------------------
# Quoted values


def test_shorten_keeps_head_tail_and_length() -> None:
    value = "v" * 60_000
    short = textsafe.shorten(f"{value!r} is too long")
    assert short.endswith("' (60000 characters) is too long") and "…" in short
    assert len(short) < textsafe.MAX_QUOTED + 60
    assert textsafe.shorten("the package's files don't " + "x" * 400) == "the package's files don't " + "x" * 400
    assert textsafe.shorten(repr("a" * textsafe.MAX_QUOTED)) == repr("a" * textsafe.MAX_QUOTED)
    assert textsafe.clip("f" * 5000).endswith("(5000 characters)") and len(textsafe.clip("f" * 5000)) < 1100


def test_a_60_kb_value_is_quoted_shortened_in_every_finding_and_error(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path)

    def edit(doc: dict) -> None:
        doc["package"]["version"] = "v" * 60_000
        doc["models"][0]["params"]["tensors"][0]["file"] = "f" * 60_000

    edit_manifest(root, edit)
    reseal(root, reserved_info=False, provenance=False)
    code, doc = validate_json(cli, root)
    assert code == 1
    man001 = [c for c in doc["checks"] if c["id"] == "MAN001" and c["status"] == "fail"]
    assert man001 and all(len(c["message"]) < 400 for c in man001), [len(c["message"]) for c in man001]
    assert any("(60000 characters) is too long" in c["message"] for c in man001), man001
    for c in doc["checks"]:
        for key in ("message", "file", "field", "expected", "found"):
            assert len(c[key] or "") < 2000, (c["id"], key, len(c[key]))
    for command in ("validate", "inspect", "verify", "budget"):
        r = cli(command, root)
        longest = max(map(len, (r.out + r.err).splitlines()))
        assert longest < 2000, (command, longest)
    assert (root / MANIFEST).stat().st_size > 120_000


def test_an_xz_stream_declaring_a_huge_dictionary_is_refused_before_it_is_allocated(tmp_path: Path) -> None:
    data = lzma.compress(
        _tar([("pkg/a", b"0123456789")]),
        filters=[{"id": lzma.FILTER_LZMA2, "dict_size": 1536 * 1024**2, "mode": lzma.MODE_FAST, "mf": lzma.MF_HC3}],
    )
    pkg = tmp_path / "dict.tar.xz"
    pkg.write_bytes(data)
    (tmp_path / "out").mkdir()
    with pytest.raises(PackageFormatError, match=f"more than the {archive.MAX_XZ_MEMORY} bytes of memory"):
        archive.extract_package(pkg, tmp_path / "out")
    assert archive.MAX_XZ_MEMORY == 128 * 1024**2


def test_validate_md_names_every_limit_with_its_figure() -> None:
    """Every ``MAX_*`` ceiling of the modules that read a package is in docs/validate.md's Limits table."""
    import re

    from calctl.package import npy, reader, schemas, yamlsafe
    from calctl.package.rules import context
    from calctl.signing import seal

    limits = (Path(__file__).resolve().parents[3] / "docs" / "validate.md").read_text().split("## Limits")[1]
    limits = limits.split("\n## ")[0]
    missing = []
    for module in (archive, yamlsafe, seal, textsafe, context, reader, npy, schemas):
        names = [n for n in vars(module) if re.fullmatch(r"MAX_[A-Z_]+", n)]
        names += [n for n in ("FREE_STREAMS", "BYTES_PER_STREAM", "EXPANSION_SLACK_BYTES") if n in vars(module)]
        missing += [f"{module.__name__}.{n}" for n in names if n not in limits]
    assert not missing, missing
    for figure in ("10,000", "32 components", "64 (`archive.FREE_STREAMS`)", "16 KiB", "128 MiB", "256 characters"):
        assert figure in limits, figure


def _pax_record(key: str, value: str) -> bytes:
    body = f" {key}={value}\n".encode()
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n += 1
    return str(n).encode() + body


def test_pax_records_are_counted_before_tarfile_parses_them(tmp_path: Path) -> None:
    """64 PAX headers of just under 1 MiB of 6-byte records each (an 11 KB .tar.bz2): 30 s of tarfile's
    record-by-record parsing, within every byte limit. The records are counted first, from the bytes."""
    record = _pax_record("x", "y")
    payload = record * (archive.MAX_PAX_RECORDS // 2)
    assert len(payload) < archive.MAX_EXTENDED_HEADER_BYTES
    out = bytearray()
    for i in range(3):
        header = tarfile.TarInfo("././@PaxHeader")
        header.type = tarfile.XHDTYPE
        header.size = len(payload)
        out += header.tobuf(format=tarfile.USTAR_FORMAT) + payload + b"\0" * (-len(payload) % 512)
        out += tarfile.TarInfo(f"pkg/f{i}").tobuf(format=tarfile.USTAR_FORMAT)
    pkg = tmp_path / "pax.tar.bz2"
    pkg.write_bytes(bz2.compress(bytes(out) + b"\0" * 1024))
    (tmp_path / "out").mkdir()
    with pytest.raises(PackageFormatError, match=f"more than {archive.MAX_PAX_RECORDS} records in all") as err:
        archive.extract_package(pkg, tmp_path / "out")
    assert str(pkg) in str(err.value)
    assert archive.MAX_PAX_RECORDS == 100_000


def _npy(shape: str, *, version: int = 1, declared: int | None = None) -> bytes:
    import struct

    header = ("{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }").encode()
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    size = len(header) if declared is None else declared
    length = struct.pack("<H", size) if version == 1 else struct.pack("<I", size)
    return b"\x93NUMPY" + bytes([version, 0]) + length + header


def test_an_npy_header_is_judged_by_what_the_file_can_hold_before_numpy_allocates(tmp_path: Path) -> None:
    from calctl.package import npy

    huge = tmp_path / "huge.npy"
    huge.write_bytes(_npy("(20000000000,)") + bytes(1000))  # numpy allocated 74.5 GiB for it
    with pytest.raises(ValueError, match=r"declares shape \(20000000000,\) of <f4 \(80000000000 bytes\), but the file"):
        npy.load(huge)
    long_header = tmp_path / "long.npy"
    with open(long_header, "wb") as fh:  # numpy read the 2 GiB header whole before checking its length
        fh.write(_npy("(1,)", version=2, declared=2**31))
        fh.truncate(2**31 + 4096)
    with pytest.raises(ValueError, match=f"declares 2147483648 bytes, over the {npy.MAX_HEADER_BYTES} byte limit"):
        npy.load(long_header)
    ok = tmp_path / "ok.npy"
    ok.write_bytes(_npy("(3,)") + bytes(12))
    assert npy.load(ok).shape == (3,)


@pytest.mark.parametrize(("char", "code"), [("\u202e", "U+202E"), ("\u200b", "U+200B"), ("\u2066", "U+2066")])
def test_a_file_name_with_a_bidi_or_invisible_character_fails_lay002(
    tmp_path: Path, cli: Cli, char: str, code: str
) -> None:
    """``evil\\u202eexe.txt`` is listed as ``eviltxt.exe``: LAY002 names the character, and nothing prints it raw."""
    root = copy_package(tmp_path)
    (root / f"evil{char}exe.txt").write_bytes(b"")
    code_, doc = validate_json(cli, root)
    lay002 = [c for c in doc["checks"] if c["id"] == "LAY002" and c["status"] == "fail"]
    assert code_ == 1 and any(code in c["message"] and "bidirectional or invisible" in c["message"] for c in lay002)
    for command in ("validate", "verify"):
        r = cli(command, root)
        assert char not in r.out + r.err and "evil\\u" in r.out, (command, r.out[-1500:])


def test_a_negative_base256_size_is_a_refusal_naming_the_member(tmp_path: Path) -> None:
    header = bytearray(tarfile.TarInfo("pkg/neg").tobuf(format=tarfile.GNU_FORMAT))
    header[124:136] = b"\xff" + (256**11 - 2**40).to_bytes(11, "big")  # base-256: -2**40
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    pkg = tmp_path / "neg.tar"
    pkg.write_bytes(bytes(header) + b"\0" * 1024)
    (tmp_path / "out").mkdir()
    with pytest.raises(PackageFormatError, match=r"'pkg/neg' declares a negative size \(-1099511627776\)"):
        archive.extract_package(pkg, tmp_path / "out")


def test_a_megabyte_link_target_or_name_is_quoted_shortened(tmp_path: Path) -> None:
    link = tarfile.TarInfo("pkg/l")
    link.type = tarfile.SYMTYPE
    link.linkname = "x" * 1_000_000
    absolute = tarfile.TarInfo("/" + "y" * 900_000)
    for name, info in (("link.tar", link), ("abs.tar", absolute)):
        pkg = tmp_path / name
        pkg.write_bytes(info.tobuf(format=tarfile.GNU_FORMAT) + b"\0" * 1024)
        (tmp_path / name).with_suffix(".out").mkdir()
        with pytest.raises(PackageFormatError) as err:
            archive.extract_package(pkg, pkg.with_suffix(".out"))
        assert len(str(err.value)) < 500 and "characters)" in str(err.value), str(err.value)[:600]


def test_schema_violations_are_capped_per_document_and_json_values_counted(tmp_path: Path, cli: Cli) -> None:
    """A 13 MB compatibility.json of a million bad entries made a million COMP001 findings (148 s, 4.5 GB); a
    valid one of 1.5 million entries took 7.5 s to schema-check. Both now stop at a limit, which is named."""
    from calctl.package import reader, schemas

    root = copy_package(tmp_path, "single")
    compat = root / "compatibility.json"
    doc = json.loads(compat.read_text())
    doc["device"]["kinds"] = ["nope"] * (schemas.MAX_SCHEMA_ERRORS + 50)
    compat.write_text(json.dumps(doc))
    reseal(root, reserved_info=False)
    _code, report = validate_json(cli, root)
    comp001 = [c for c in report["checks"] if c["id"] == "COMP001" and c["status"] == "fail"]
    assert len(comp001) == schemas.MAX_SCHEMA_ERRORS + 1, len(comp001)
    assert f"more than {schemas.MAX_SCHEMA_ERRORS} schema violations" in comp001[-1]["message"]
    doc["device"]["kinds"] = ["mock"] * reader.MAX_JSON_VALUES
    compat.write_text(json.dumps(doc))
    reseal(root, reserved_info=False)
    _code, report = validate_json(cli, root)
    comp001 = [c for c in report["checks"] if c["id"] == "COMP001" and c["status"] == "fail"]
    assert [c["message"] for c in comp001] == [
        f"more than {reader.MAX_JSON_VALUES} JSON values (a compatibility or provenance document is far smaller)"
    ], comp001


def test_a_tokenizer_config_with_a_5000_digit_integer_is_a_finding_not_a_crash(tmp_path: Path, cli: Cli) -> None:
    root = copy_package(tmp_path, "single")
    (root / "tokenizer/model-a/tokenizer_config.json").write_text('{"model_max_length": ' + "9" * 5000 + "}")
    reseal(root, reserved_info=False)
    _code, report = validate_json(cli, root)
    tok = [c for c in report["checks"] if c["id"].startswith("TOK") and c["status"] in ("fail", "error")]
    assert tok and all(c["status"] == "fail" and "not valid JSON" in c["message"] for c in tok), tok
