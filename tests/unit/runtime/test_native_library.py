"""Loading the CalRT shim: missing, unloadable, incomplete or incompatible libraries are exit 3 with
the path and the symbol named; vendor gaps (per-chip memory, chip reset) surface as None / NotSupported."""

from __future__ import annotations

from pathlib import Path

import pytest

from calctl.errors import ExitCode
from calctl.runtime import open_runtime
from calctl.runtime._native import lib as L
from calctl.runtime.errors import LibraryError, NotSupported, RuntimeStatus
from tests.unit.runtime.runtime_helpers import stub_set_fault


def test_no_library_named() -> None:
    with pytest.raises(LibraryError, match="no CalRT library") as exc:
        open_runtime("calrt")
    said = str(exc.value) + (exc.value.hint or "")
    assert exc.value.exit_code == ExitCode.DEVICE
    assert "--calrt-lib" in said and "CALRT_LIBRARY" in said and "device build-reference" in said


def test_library_from_the_environment(calrt_stub: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALRT_LIBRARY", str(calrt_stub))
    with open_runtime("calrt") as rt:
        assert rt.versions().firmware == "stub"


def test_missing_and_unloadable_files(tmp_path: Path) -> None:
    with pytest.raises(LibraryError, match=f"{tmp_path / 'nope.so'}: no such file"):
        open_runtime("calrt", calrt_lib=tmp_path / "nope.so")
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not an ELF")
    with pytest.raises(LibraryError, match=f"{junk}: cannot load"):
        open_runtime("calrt", calrt_lib=junk)


def test_a_library_path_that_is_not_a_file_says_what_it_is(tmp_path: Path) -> None:
    """A FIFO (never opened: dlopen would block), a directory or a symlink loop was "no such file"."""
    import os

    fifo, loop = tmp_path / "fifo.so", tmp_path / "loop.so"
    os.mkfifo(fifo)
    loop.symlink_to(loop)
    for path, words in (
        (fifo, "is a FIFO, not a regular file"),
        (tmp_path, "is a directory"),
        (loop, "cannot be inspected"),
    ):
        with pytest.raises(LibraryError, match=words):
            open_runtime("calrt", calrt_lib=path)


def test_missing_symbol_is_named(calrt_stub_without_kv_free: Path) -> None:
    with pytest.raises(LibraryError) as exc:
        open_runtime("calrt", calrt_lib=calrt_stub_without_kv_free)
    assert str(calrt_stub_without_kv_free) in str(exc.value) and "missing symbol calrt_kv_free" in str(exc.value)
    assert exc.value.status == RuntimeStatus.LIBRARY


def test_incompatible_abi_major(calrt_stub: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALRT_STUB_ABI_MAJOR", "2")
    with pytest.raises(LibraryError, match=r"C ABI 2\.0 is incompatible; calctl needs 1\.x"):
        open_runtime("calrt", calrt_lib=calrt_stub)


def test_every_abi_function_has_argtypes_and_restype(calrt_stub: Path) -> None:
    lib = L.load_library(calrt_stub)
    for name, (restype, argtypes) in L.SIGNATURES.items():
        fn = getattr(lib.fn, name)
        fn = getattr(fn, "__wrapped__", fn)  # behind the call log, when one is on in this process
        assert fn.restype is restype and fn.argtypes == argtypes, name
    from calctl.runtime._native.build import SOURCE_DIR  # calrt.h ships in the package

    header = (SOURCE_DIR / "calrt.h").read_text()
    declared = {
        line.split("(")[0].split()[-1].lstrip("*")
        for line in header.splitlines()
        if line.startswith(("calrt_status calrt_", "const char *calrt_"))
    }
    assert declared == set(L.SIGNATURES)  # the ctypes table is exactly the header's ABI


def test_per_chip_memory_gap_is_none_never_zero(calrt_stub: Path) -> None:
    with open_runtime("calrt", calrt_lib=calrt_stub) as rt:
        stub_set_fault(rt, "no_chip_memory")
        mem = rt.memory_usage()
        assert [m.used_bytes for m in mem] == [None, None]
        assert [m.total_bytes for m in mem] == [16 << 30, 16 << 30]


def test_runtime_without_chip_reset(calrt_stub: Path) -> None:
    with open_runtime("calrt", calrt_lib=calrt_stub) as rt:
        stub_set_fault(rt, "no_chip_reset")
        with pytest.raises(NotSupported) as exc:
            rt.reset("chip", chip=0)
        assert exc.value.status == RuntimeStatus.NOT_SUPPORTED and "not supported" in str(exc.value)
        rt.reset("board")


def test_env_fault_switches(calrt_stub: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALRT_STUB_FAULTS", "no_chip_memory=1")
    with open_runtime("calrt", calrt_lib=calrt_stub) as rt:
        assert rt.memory_usage()[0].used_bytes is None
