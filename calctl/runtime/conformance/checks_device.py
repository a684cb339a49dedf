"""Checks of the library and the device: ABI version, status strings, versions, one device, configuration,
exact graph names."""

from __future__ import annotations

import ctypes
from typing import Any

from calctl.runtime.conformance.framework import (
    ExpectationFailed,
    Session,
    _returned,
    _unwrap,
    check,
    expect,
    expect_code,
    expect_raises,
    expect_status,
    golden_prompt,
    prefill_job,
    raw_call,
    raw_submit,
    write_prefill,
)
from calctl.runtime.errors import (
    AlreadyConfigured,
    DeviceBusy,
    DeviceInUse,
    NotConfigured,
    RuntimeStatus,
)


@check(
    "abi_version",
    "calrt_abi_version reports 1.x and every 1.0 symbol is exported",
    native_only=True,
    clauses=("LOAD-1",),
)
def _abi_version(s: Session) -> str:
    """Straight at the library (plain dlopen, not calctl's loader, which would refuse it before the check)."""
    from calctl.runtime._native import lib as L

    cdll = ctypes.CDLL(str(s.target.library))
    missing = [name for name in L.SIGNATURES if not hasattr(cdll, name)]
    expect(not missing, f"{len(missing)} ABI functions are not exported", call="dlsym", returned=missing[:5])
    fn = cdll.calrt_abi_version
    fn.restype, fn.argtypes = L.SIGNATURES["calrt_abi_version"]
    major, minor = ctypes.c_uint32(), ctypes.c_uint32()
    rc = int(fn(ctypes.byref(major), ctypes.byref(minor)))
    expect(rc == RuntimeStatus.OK, "calrt_abi_version answers OK", call="calrt_abi_version", returned=f"status {rc}")
    s.evidence["abi"] = f"{major.value}.{minor.value}"  # also on a FAIL: the report's abi field
    expect(
        major.value == L.ABI_MAJOR and minor.value >= L.ABI_MINOR,
        f"C ABI {major.value}.{minor.value}: calctl needs {L.ABI_MAJOR}.x with x >= {L.ABI_MINOR}",
        call="calrt_abi_version",
        returned=f"{major.value}.{minor.value}",
    )
    extensions = sorted(name for name in L.EXTENSIONS if hasattr(cdll, name))
    s.evidence["extensions"] = extensions
    ext = ", ".join(extensions) or "none"
    return f"C ABI {major.value}.{minor.value}; {len(L.SIGNATURES)} functions exported; optional extensions: {ext}"


@check(
    "status_strings",
    "calrt_status_string names every status code and never returns NULL",
    native_only=True,
    clauses=("CONV-1",),
)
def _status_strings(s: Session) -> str:
    from calctl.runtime._native import lib as L

    fn = L.load_library(s.target.library).fn.calrt_status_string
    seen: dict[str, int] = {}
    for status in RuntimeStatus:
        if status is RuntimeStatus.LIBRARY:
            continue
        raw = fn(int(status))
        expect(
            bool(raw),
            f"status {int(status)} has no string",
            call="calrt_status_string",
            arguments=str(int(status)),
            returned=raw,
        )
        text = raw.decode("utf-8", "replace")
        expect(
            status is RuntimeStatus.OK or text not in seen,
            f"status {int(status)} and {seen.get(text)} share the string {text!r}",
            call="calrt_status_string",
            arguments=str(int(status)),
            returned=text,
        )
        seen[text] = int(status)
    for undefined in (15, 98, 12345, -1):
        raw = fn(undefined)
        expect(
            bool(raw),
            f"an undefined code {undefined} must still get a string",
            call="calrt_status_string",
            arguments=str(undefined),
            returned=raw,
        )
    return f"{len(seen)} distinct strings; undefined codes answered"


@check(
    "versions_topology",
    "versions are reported; topology has 1-16 chips and DRAM per chip or unknown, never 0",
    clauses=("CONV-4",),
)
def _versions(s: Session) -> str:
    with s.open() as rt:
        v = rt.versions()
        topo = rt.topology()
        if s.native:  # which board the shim says it opened (calrt_ext_device_identity), if it says
            identity = _unwrap(rt).identity()
            kinds = {1: "hardware", 2: "software model"}
            s.evidence.update(board=identity.board, device_kind=kinds.get(identity.kind, "unknown"))
    for name in ("runtime", "driver", "firmware"):
        expect(
            bool(getattr(v, name).strip()),
            f"calrt_versions_get reports a {name} version",
            call="rt.versions",
            returned=v,
        )
    expect(
        1 <= topo.chips <= 16 and topo.calcores_per_chip >= 1, "a plausible topology", call="rt.topology", returned=topo
    )
    for c, dram in enumerate(topo.dram_bytes):
        expect(dram is None or dram > 0, f"chip {c}: DRAM 0 means unknown reported as 0 (001 §14)", returned=topo)
    s.evidence.update(
        runtime=v.runtime, driver=v.driver, firmware=v.firmware, chips=topo.chips, software_model=v.software_model
    )
    shape = f"{topo.chips} chips x {topo.calcores_per_chip} CalCores"
    return f"runtime {v.runtime}, driver {v.driver}, firmware {v.firmware}; {shape}"


@check(
    "one_device_per_process", "a second device open is DEVICE_IN_USE; open works again after close", clauses=("OWN-1",)
)
def _one_device(s: Session) -> str:
    with s.open():
        exc = expect_raises(DeviceInUse, "open_runtime (second device)", s.open_raw)
        expect_status(exc, RuntimeStatus.DEVICE_IN_USE, "calrt_device_open")
    with s.open():
        pass
    return "second open refused with DEVICE_IN_USE (11); reopened after close"


@check(
    "configuration",
    "one current calbin: the library refuses a second configure (ALREADY_CONFIGURED), and without one a submit "
    "and an unload (NOT_CONFIGURED)",
    clauses=("OWN-3", "OWN-4", "CFG-1", "CFG-2"),
)
def _configuration(s: Session) -> str:
    """Judged by what the shim answers. On a C library the calls go straight in (``calrt_configure`` with
    a second calbin, ``calrt_job_submit`` after the unload), past calctl's own bookkeeping of the current
    calbin, which refuses a graph of no configuration before the library is asked (calctl's own refusals are
    unit-tested in tests/unit/runtime/test_calctl_refusals.py)."""
    pkg = s.package
    m = pkg.models[0]
    with s.open() as rt:
        exc = expect_raises(NotConfigured, "rt.reset_configuration", rt.reset_configuration)
        expect_status(exc, RuntimeStatus.NOT_CONFIGURED, "calrt_reset_configuration")
        exc = expect_raises(NotConfigured, "rt.kv.allocate", rt.kv.allocate, m.alias)
        expect_status(exc, RuntimeStatus.NOT_CONFIGURED, "calrt_kv_allocate")
        if s.native:  # calctl answers it from its own bookkeeping: the library's answer, straight in
            yes = ctypes.c_uint32(7)
            expect_code(
                raw_call(rt, "calrt_kv_can_allocate", m.alias.encode(), 1, ctypes.byref(yes)),
                RuntimeStatus.NOT_CONFIGURED,
                "CFG-1: calrt_kv_can_allocate before any configuration",
                call="calrt_kv_can_allocate",
                arguments=f"model={m.alias!r}, n=1 (nothing configured)",
            )
        first, second = rt.create_calbin(pkg), rt.create_calbin(pkg)
        rt.configure(first)
        for which, calbin in (("the current", first), ("another", second)):
            if s.native:
                handle = _unwrap(rt)._calbins[calbin.id][1]
                expect_code(
                    raw_call(rt, "calrt_configure", handle),
                    RuntimeStatus.ALREADY_CONFIGURED,
                    f"calrt_configure of {which} calbin while one is current",
                    call="calrt_configure",
                    arguments=f"<{which} calbin>",
                )
            else:
                exc = expect_raises(AlreadyConfigured, "rt.configure (while one is current)", rt.configure, calbin)
                expect_status(exc, RuntimeStatus.ALREADY_CONFIGURED, "configure")
        inputs, outputs = rt.alloc_inputs(m.prefill.name), rt.alloc_outputs(m.prefill.name)
        write_prefill(inputs, golden_prompt(pkg, m.alias))
        old = int(rt.kv.allocate(m.alias))
        rt.reset_configuration()
        if s.native:
            _old_sequence_gone(rt, old)
        if s.native:  # the library itself must have dropped it (calctl would refuse the graph on its own)
            status, _ = raw_submit(rt, m.prefill.name, inputs, outputs)
            expect_code(
                status,
                RuntimeStatus.NOT_CONFIGURED,
                "calrt_job_submit after calrt_reset_configuration",
                call="calrt_job_submit",
                arguments=f"graph={m.prefill.name!r} (after the unload)",
            )
        _unloaded_calbin_releases(first)
        rt.configure(second)
        cap = m.kv.max_sequences
        expect(
            rt.kv.can_allocate(m.alias, cap),
            f"CFG-2: after calrt_reset_configuration dropped sequence {old}, the next configuration must grant "
            f"{m.alias}'s whole capacity ({cap} sequences): calrt_kv_can_allocate",
            call="calrt_kv_can_allocate",
            arguments=f"{m.alias!r}, {cap} (after an unload and a reload)",
            returned="no",
        )
        job, seq, _, _ = prefill_job(rt, pkg, m.alias)
        expect(rt.wait(job, 10).ok, "a job runs on the calbin configured after the unload", call="rt.wait")
        rt.kv.free(seq)
    return (
        "NOT_CONFIGURED (4) before configure and after an unload; ALREADY_CONFIGURED (3) on a second configure; "
        "a job runs after reconfiguring"
    )


def _unloaded_calbin_releases(calbin: Any) -> None:
    """OWN-3: only the current calbin is in use. Once ``calrt_reset_configuration`` unloaded it, its release
    succeeds (a shim that keeps an "in use" flag set by configure and never cleared refuses it with DEVICE_BUSY
    for ever, and every reload leaks a calbin)."""
    try:
        calbin.close()
    except DeviceBusy as exc:
        raise ExpectationFailed(
            "OWN-3: calrt_calbin_release of the calbin calrt_reset_configuration unloaded must succeed: only the "
            "current calbin is in use",
            call="calrt_calbin_release",
            arguments="<the calbin current until the unload>",
            returned=_returned(exc),
        ) from None


def _old_sequence_gone(rt: Any, seq: int) -> None:
    """CFG-2: ``calrt_reset_configuration`` frees every KV sequence: one allocated before is not found after."""
    committed, reserved = ctypes.c_uint32(), ctypes.c_uint32()
    status = raw_call(rt, "calrt_kv_length", seq, ctypes.byref(committed), ctypes.byref(reserved))
    expect_code(
        status,
        RuntimeStatus.INVALID_ARGUMENT,
        f"CFG-2: calrt_kv_length of sequence {seq}, allocated before calrt_reset_configuration,",
        call="calrt_kv_length",
        arguments=f"seq={seq} (after the unload)",
    )


@check(
    "exact_graph_names",
    "calrt_job_submit refuses an inexact graph name (prefix, case, suffix, alias) with INVALID_ARGUMENT",
    native_only=True,
    clauses=("JOB-2",),
)
def _exact_names(s: Session) -> str:
    """Straight into calrt_job_submit, past calctl's own name check (which its unit tests cover): what the
    shim answers. Each descriptor is valid but for the name (a reserved sequence, the golden prompt), and
    the exact name is accepted with it, so an INVALID_ARGUMENT is about the name. A shim that accepted an
    inexact one would run a job calctl never asked for."""
    pkg = s.package
    m = pkg.models[0]
    name = m.prefill.name
    wrong = [name[:-1], name.upper(), name + "_", m.alias]
    prompt = golden_prompt(pkg, m.alias)
    with s.configured() as rt:
        inputs, outputs = rt.alloc_inputs(name), rt.alloc_outputs(name)
        write_prefill(inputs, prompt)
        seq = rt.kv.allocate(m.alias)
        rt.kv.append(seq, len(prompt))
        # every inexact name refused, then the exact one with the same descriptor accepted (the last job runs)
        tries = [(w, RuntimeStatus.INVALID_ARGUMENT, f"the inexact graph name {w!r} (of {name!r})") for w in wrong]
        tries.append((name, RuntimeStatus.OK, f"the exact name {name!r} and the same descriptor"))
        for graph, want, what in tries:
            status, job = raw_submit(rt, graph, inputs, outputs, kv=seq)
            expect_code(
                status,
                want,
                f"calrt_job_submit with {what}",
                call="calrt_job_submit",
                arguments=f"graph={graph!r}, kv=[{seq}] reserved {len(prompt)}",
            )
        info = raw_wait(rt, job)
        expect(info == RuntimeStatus.OK, "the exact-name job succeeds", call="calrt_job_wait", returned=info)
    return f"{len(wrong)} inexact names refused by the library with INVALID_ARGUMENT (10); the exact one runs"


def raw_wait(rt: Any, job: int) -> int:
    """Wait for a job submitted with :func:`raw_submit`, release it; the status it ended with (0 = OK)."""
    from calctl.runtime._native import lib as L

    info = L.CalrtJobInfo()
    rc = raw_call(rt, "calrt_job_wait", job, 10_000, ctypes.byref(info))
    if rc != RuntimeStatus.OK:
        return rc
    raw_call(rt, "calrt_job_release", job)
    return int(info.status)
