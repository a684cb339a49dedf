"""The check of the optional enumeration calls (``calrt_ext_device_count`` / ``calrt_ext_device_name``,
docs/calrt-c-abi.md §11): what ``calctl device list`` and ``--boards all`` read when there is no boards file."""

from __future__ import annotations

import ctypes

from calctl.runtime.conformance.framework import Session, Unsupported, check, expect
from calctl.runtime.errors import RuntimeStatus

_PAD = 0xA5  # what an untouched buffer holds


@check(
    "enumeration",
    "the optional enumeration lists distinct printable names and refuses what it cannot answer",
    native_only=True,
    clauses=("ENUM-1",),
)
def _enumeration(s: Session) -> str:
    """Straight at the library (a plain dlopen): both calls or neither; the count; every name NUL-terminated,
    printable, distinct and within CALRT_EXT_ID_LEN; an index past the count, a NULL buffer and a buffer one
    byte short are INVALID_ARGUMENT with the buffer untouched."""
    from calctl.runtime._native import lib as L

    cdll = ctypes.CDLL(str(s.target.library))
    have = [n for n in L.ENUMERATION_CALLS if hasattr(cdll, n)]
    if not have:
        raise Unsupported(
            "the optional enumeration calls are not exported: the host's boards come from a boards file "
            "(docs/boards.md)"
        )
    expect(len(have) == 2, f"exports {have[0]} without the other enumeration call", call=have[0])
    count_fn, name_fn = cdll.calrt_ext_device_count, cdll.calrt_ext_device_name
    count_fn.restype, count_fn.argtypes = L.EXTENSIONS["calrt_ext_device_count"]
    name_fn.restype, name_fn.argtypes = L.EXTENSIONS["calrt_ext_device_name"]
    counts = []
    for _ in range(2):
        n = ctypes.c_uint32(0xFFFFFFFF)
        rc = int(count_fn(ctypes.byref(n)))
        expect(rc == RuntimeStatus.OK, "calrt_ext_device_count answers OK", call="calrt_ext_device_count", returned=rc)
        counts.append(n.value)
    expect(counts[0] == counts[1], "two calls of calrt_ext_device_count disagree", returned=counts)
    count = counts[0]
    expect(count <= L.MAX_ENUMERATED, f"{count} boards, more than {L.MAX_ENUMERATED}", returned=count)

    def name_of(index: int, length: int) -> tuple[int, bytes]:
        buf = ctypes.create_string_buffer(bytes([_PAD]) * L.EXT_ID_LEN, L.EXT_ID_LEN)
        return int(name_fn(index, buf, length)), buf.raw

    names: list[str] = []
    for i in range(count):
        rc, raw = name_of(i, L.EXT_ID_LEN)
        call = f"calrt_ext_device_name({i}, buf, {L.EXT_ID_LEN})"
        expect(rc == RuntimeStatus.OK, "an index below the count answers OK", call=call, returned=rc)
        expect(b"\0" in raw, "the name is NUL-terminated within CALRT_EXT_ID_LEN bytes", call=call)
        text = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
        expect(bool(text) and text.isprintable(), f"name {text!r}: empty or not printable", call=call)
        expect(text not in names, f"name {text!r} is listed twice", call=call, returned=names)
        names.append(text)
    untouched = bytes([_PAD]) * L.EXT_ID_LEN
    rc, raw = name_of(count, L.EXT_ID_LEN)
    call = f"calrt_ext_device_name({count}, buf, {L.EXT_ID_LEN})"
    expect(rc == RuntimeStatus.INVALID_ARGUMENT, "an index past the count is INVALID_ARGUMENT", call=call, returned=rc)
    expect(raw == untouched, "a refused call writes nothing", call=call)
    rc = int(name_fn(0, None, L.EXT_ID_LEN))
    expect(rc == RuntimeStatus.INVALID_ARGUMENT, "a NULL buffer is INVALID_ARGUMENT", call="calrt_ext_device_name")
    if names:
        short = len(names[0].encode())  # no room for the NUL
        rc, raw = name_of(0, short)
        call = f"calrt_ext_device_name(0, buf, {short})"
        expect(rc == RuntimeStatus.INVALID_ARGUMENT, "a name that does not fit is INVALID_ARGUMENT", call=call)
        expect(raw == untouched, "a refused call writes nothing", call=call)
    s.evidence["boards"] = names
    return f"{count} board(s): {', '.join(names) or 'none'}"
