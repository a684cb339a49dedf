"""Issue 19, "Lifecycle": the admin API loads a named package the server may read (start-up, or under a
``--package-root``), rolls back to the retained previous package in one call, and an unload verifies device
memory and health and reports it (000 §11, §12). Real engine on the mock board behind uvicorn."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from calctl.package.info import package_digest
from calctl.runtime import open_runtime
from calctl.serving.api.app import create_app
from calctl.serving.api.auth import ApiSettings
from calctl.serving.engine import DeviceSupervisor, ServingEngine, SupervisorOptions, UnloadResult
from calctl.serving.engine.options import LoadPolicy
from calctl.signing.policy import make_policy
from tests.conftest import TEST_PUB
from tests.integration.serve_harness import COMBINED
from tests.unit.serving_api.api_harness import ServerThread

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def _served(
    roots: tuple[Path, ...] = (), *, fail_unclean: bool = True, **mock: Any
) -> Iterator[tuple[str, DeviceSupervisor]]:
    with open_runtime("mock", time_scale=0.05, **mock) as rt:
        sup = DeviceSupervisor(
            rt,
            trust=make_policy([TEST_PUB]),
            options=SupervisorOptions(warmup_iterations=1, drain_deadline_s=5.0),
            load_policy=LoadPolicy(package_roots=roots, fail_unclean_unload=fail_unclean),
        )
        try:
            sup.start(COMBINED)
            with ServerThread(create_app(ServingEngine(sup), ApiSettings())) as server:
                yield server.base_url, sup
        finally:
            sup.shutdown(2.0)


def _admin(url: str, action: str, body: Any = None) -> httpx.Response:
    return httpx.post(f"{url}/internal/models/model-a/{action}", json=body, timeout=60)


def _complete(url: str) -> httpx.Response:
    body = {"model": "model-b", "prompt": "Hi", "max_tokens": 2, "temperature": 0}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60)


def test_load_after_unload_brings_the_package_back_and_unload_reports_the_device_check() -> None:
    """Before: load after unload resolved the working directory (``manifest.yaml: file not found``)."""
    with _served() as (url, sup):
        gen = sup._generation
        r = _admin(url, "unload")
        assert r.status_code == 200, r.text
        check = r.json()["device_check"]
        assert check["ok"] and check["problems"] == [] and len(check["chips"]) == 2
        for row in check["chips"]:
            assert row["used_bytes"] == row["idle_bytes"] and row["pending_jobs"] == 0 and row["health"] == "ok"
        assert _complete(url).status_code == 503
        r = _admin(url, "load")
        assert r.status_code == 200, r.text
        assert r.json()["generation"] > gen and r.json()["digest"] == package_digest(COMBINED)
        assert _complete(url).status_code == 200


def test_a_named_package_under_a_root_loads_and_rolls_back_in_one_call(tmp_path: Path) -> None:
    root = tmp_path / "packages"
    other = root / "combined-copy"
    shutil.copytree(COMBINED, other)
    with _served((root.resolve(),)) as (url, sup):
        r = _admin(url, "reload", {"package": str(other)})
        assert r.status_code == 200, r.text
        assert sup.loaded is not None and sup.loaded.source == other.resolve()
        assert sup.previous is not None and sup.previous.source == COMBINED
        assert _complete(url).status_code == 200
        r = _admin(url, "rollback")
        assert r.status_code == 200 and r.json()["package"] == str(COMBINED), r.text
        assert sup.loaded.source == COMBINED and sup.previous.source == other.resolve()
        assert _complete(url).status_code == 200
        # After an unload, a load names the package; its predecessor is then the rollback target.
        assert _admin(url, "unload").status_code == 200
        r = _admin(url, "load", {"package": str(other)})
        assert r.status_code == 200, r.text
        assert sup.loaded.source == other.resolve() and sup.previous.source == COMBINED
        r = _admin(url, "rollback")
        assert r.status_code == 200 and sup.loaded.source == COMBINED, r.text


def test_admin_load_refuses_paths_outside_the_allowed_roots(tmp_path: Path) -> None:
    root = tmp_path / "packages"
    root.mkdir()
    outside = tmp_path / "outside"
    shutil.copytree(COMBINED, outside)
    (root / "escape").symlink_to(outside)  # a symlink inside the root that leads out of it
    with _served((root.resolve(),)) as (url, sup):
        served = sup.loaded
        for package, fragment in (
            ("combined", "give an absolute path"),
            (str(outside), "not under an allowed package root"),
            (str(root / "escape"), "not under an allowed package root"),
            (str(root / ".." / "outside"), "not under an allowed package root"),
            ("/etc/passwd", "not under an allowed package root"),
            ("", "expected the absolute path"),
            ("/tmp/a\x00b", "expected the absolute path"),
        ):
            r = _admin(url, "reload", {"package": package})
            assert r.status_code == 400, (package, r.text)
            err = r.json()["error"]
            assert err["param"] == "package" and fragment in err["message"], (package, err)
        for body, fragment in (({"package": 7}, "must be a string"), ({"pkg": "/x"}, "body must be")):
            r = _admin(url, "reload", body)
            assert r.status_code == 400 and fragment in r.json()["error"]["message"], r.text
        r = _admin(url, "unload", {"package": str(outside)})
        assert r.status_code == 400 and "unload takes no package" in r.json()["error"]["message"]
        assert sup.loaded is served  # nothing was touched
        assert _complete(url).status_code == 200


def test_rollback_without_a_retained_package_says_so() -> None:
    with _served() as (url, _):
        r = _admin(url, "rollback")
        assert r.status_code == 409 and "no previous package is retained" in r.json()["detail"]


def test_an_unload_that_leaves_memory_in_use_is_failed_and_says_where(tmp_path: Path) -> None:
    """000 §12 "verify device memory/health": the mock keeps 1 MiB of model-a after its first unload."""
    plan = tmp_path / "leak.yaml"
    plan.write_text(
        "schema: calctl-fault-plan/v1\nfaults:\n  - {kind: memory_leak, unload: 1, model: model-a, bytes: 1048576}\n"
    )
    with _served(fault_plan=plan) as (url, sup):
        r = _admin(url, "unload")
        assert r.status_code == 409, r.text
        out = r.json()
        assert out["device_check"]["ok"] is False
        assert any("1048576 bytes still in use" in p for p in out["device_check"]["problems"]), out
        assert "unload left the device unclean" in out["detail"]
        assert sup.cores["model-a"].state.value == "Failed"
    # Report-only (the soak runner's setting: it judges the drift across cycles): the check is still there.
    with _served(fail_unclean=False, fault_plan=plan) as (url, sup):
        r = _admin(url, "unload")
        assert r.status_code == 200 and r.json()["device_check"]["ok"] is False, r.text
        assert sup.cores["model-a"].state.value == "Unloaded"


def test_a_fifo_under_a_root_is_refused_without_blocking_the_lifecycle(tmp_path: Path) -> None:
    """Hostile test of issue 19: a FIFO under ``--package-root`` blocked the reload thread for ever in
    ``tarfile.open``, and an admin load (which resolves under the lifecycle lock) hung every later load,
    unload and recovery with it."""
    import os

    root = tmp_path / "packages"
    root.mkdir()
    fifo = root / "pkg.tar"
    os.mkfifo(fifo)
    with _served((root.resolve(),)) as (url, _sup):
        for action in ("reload", "unload", "load"):
            if action == "unload":
                assert _admin(url, "unload").status_code == 200
                continue
            r = httpx.post(f"{url}/internal/models/model-a/{action}", json={"package": str(fifo)}, timeout=15)
            assert r.status_code == 409, r.text
            assert "is a FIFO, not a regular file" in r.json()["detail"], r.text
        r = httpx.post(f"{url}/internal/models/model-a/load", timeout=60)  # the lifecycle lock is free
        assert r.status_code == 200, r.text
        assert _complete(url).status_code == 200


@pytest.mark.parametrize("action", ["reload", "load"])
def test_a_configure_the_device_refuses_ends_failed_with_the_reason_not_configuring(action: str) -> None:
    """Hostile test of issue 19: after the reset budget ran out on a faulted board, an admin reload hit
    ``DeviceLost`` in configure (and again in the rollback) and left both aliases in Configuring for ever,
    with /health/ready still showing the old reason (001 §11.1: a failed load is Failed, with why)."""
    from calctl.runtime.errors import DeviceLost

    with _served() as (url, sup):
        if action == "load":
            assert _admin(url, "unload").status_code == 200

        def lost(*_a: Any, **_kw: Any) -> None:
            raise DeviceLost("cannot configure: chip 0 is faulted (injected)")

        sup.rt.configure = lost  # type: ignore[method-assign]
        r = _admin(url, action)
        assert r.status_code == 409, r.text
        assert "chip 0 is faulted" in r.json()["detail"], r.text
        states = {a: w.state.value for a, w in sup.cores.items()}
        assert states == {"model-a": "Failed", "model-b": "Failed"}, states
        ready = httpx.get(f"{url}/health/ready").json()
        assert all("chip 0 is faulted" in ready["failed"][a] for a in ("model-a", "model-b")), ready
        assert _complete(url).status_code == 503


def test_a_reload_checked_while_an_unload_ran_does_not_undo_it(tmp_path: Path) -> None:
    """Hostile test of issue 19: reload checks the new package outside the lifecycle lock; an unload that
    ran meanwhile was silently undone (both answered ok and the models were Ready again), and the reload's
    rollback target was the package the unload had already taken down."""
    root = tmp_path / "packages"
    other = root / "combined-copy"
    shutil.copytree(COMBINED, other)
    with _served((root.resolve(),)) as (url, sup):
        real = sup._check
        unloads: list[UnloadResult] = []

        def check_then_unload(lp: Any) -> Any:
            out = real(lp)
            if not unloads:  # an operator's unload lands between the reload's check and its configure
                unloads.append(sup.unload())
            return out

        sup._check = check_then_unload  # type: ignore[method-assign]
        r = _admin(url, "reload", {"package": str(other)})
        assert unloads and unloads[0].ok, unloads
        assert r.status_code == 409 and "changed while" in r.json()["detail"], r.text
        assert {w.state.value for w in sup.cores.values()} == {"Unloaded"}
        assert sup.loaded is None and _complete(url).status_code == 503


def test_refused_and_replaced_tar_packages_do_not_leave_extracted_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hostile test of issue 19: every admin load/reload of a tar extracts it into a temporary directory; one
    refused after extraction (a digest other than the pin, a failed validation) and a generation dropped from
    the retained previous slot were never removed, so repeated reloads filled the disk."""
    import tempfile

    from calctl.package import archive

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    root = tmp_path / "packages"
    root.mkdir()
    good = root / "good.tar"
    archive.write_tar(COMBINED, good)
    other = tmp_path / "other"
    shutil.copytree(COMBINED, other)
    (other / "model_memory_reserved_info.txt").write_text("changed: no longer what checksums.sha256 says\n")
    bad = root / "bad.tar"
    archive.write_tar(other, bad)

    def extracted() -> int:
        return len([p for p in scratch.iterdir() if p.name.startswith("calctl-serve-")])

    with open_runtime("mock", time_scale=0.05) as rt:
        sup = DeviceSupervisor(
            rt,
            trust=make_policy([TEST_PUB]),
            options=SupervisorOptions(warmup_iterations=1, drain_deadline_s=5.0),
            load_policy=LoadPolicy(package_roots=(root.resolve(),), pinned_digest=package_digest(COMBINED)),
        )
        try:
            sup.start(COMBINED)
            for _ in range(3):
                assert not sup.reload(bad).ok  # refused after extraction: a hash does not verify
            assert extracted() == 0
            for _ in range(4):
                assert sup.reload(good).ok
            assert extracted() <= 2  # the served generation and the retained previous one, no more
        finally:
            sup.shutdown(2.0)
    assert extracted() == 0
