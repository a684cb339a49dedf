"""The device and trust options, spelled once (``calctl.cli._device.device_options``) for every device command."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from calctl.cli._device import DEVICE_DEFAULTS, DEVICE_OPTIONS, DeviceArgs, device_options, report_dir
from calctl.cli._options import DeviceChoice
from calctl.errors import UsageError


def _app(*extra: str) -> tuple[typer.Typer, list[DeviceArgs]]:
    seen: list[DeviceArgs] = []
    app = typer.Typer()

    @app.command()
    @device_options(*extra)
    def probe(name: str = "x", dev: DeviceArgs = DEVICE_DEFAULTS, last: int = 0) -> None:
        """A probe command."""
        seen.append(dev)
        typer.echo(f"{name} {last}")

    return app, seen


def test_the_options_stand_where_dev_stands_and_arrive_as_one_value(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("schema: calctl-fault-plan/v1\n")
    app, seen = _app("fault_plan", "seed")
    r = CliRunner().invoke(
        app, ["--name", "n", "--device", "mock", "--fault-plan", str(plan), "--seed", "7", "--last", "3"]
    )
    assert r.exit_code == 0, r.output
    assert r.output.strip() == "n 3"
    assert seen == [DeviceArgs(device=DeviceChoice.mock, fault_plan=plan, seed=7)]
    help_text = CliRunner().invoke(app, ["--help"], terminal_width=200).output
    order = [help_text.index(o) for o in ("--name", "--device", "--calrt-lib", "--fault-plan", "--seed", "--last")]
    assert order == sorted(order), help_text
    for absent in ("--time-scale", "--serialize-chips"):
        assert absent not in help_text


def test_a_command_gets_only_the_options_it_asks_for() -> None:
    app, seen = _app()
    assert CliRunner().invoke(app, []).exit_code == 0
    assert seen == [DEVICE_DEFAULTS]
    r = CliRunner().invoke(app, ["--seed", "1"])
    assert r.exit_code == 2 and "--seed" in r.output


def test_an_unknown_option_name_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="bogus"):
        device_options("bogus")
    assert set(DEVICE_OPTIONS) == {f for f in DeviceArgs.__dataclass_fields__}


def test_the_value_turns_into_a_device_spec_with_the_same_checks(tmp_path: Path) -> None:
    spec = DeviceArgs(time_scale=2.0, seed=3, serialize_chips=True).spec()
    assert (spec.time_scale, spec.seed, spec.serialize_chips) == (2.0, 3, True)
    with pytest.raises(UsageError, match=r"--fault-plan .*no such file"):
        DeviceArgs(fault_plan=tmp_path / "missing.yaml").spec()
    with pytest.raises(UsageError, match="--calrt-lib applies to --device calrt only"):
        DeviceArgs(calrt_lib=tmp_path / "lib.so").spec()


def test_a_report_directory_under_a_fifo_or_a_symlink_loop_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CALCTL_REPORT_DIR=/dev/null (or a FIFO, or a symlink loop) was an internal error when the run made its
    directory; now it is refused before the run, naming the variable."""
    import os

    fifo, loop = tmp_path / "fifo", tmp_path / "loop"
    os.mkfifo(fifo)
    loop.symlink_to(loop)
    monkeypatch.setenv("CALCTL_REPORT_DIR", str(fifo))
    with pytest.raises(
        UsageError, match=f"CALCTL_REPORT_DIR={fifo}: .*{fifo}, in its path, is a FIFO, not a directory"
    ):
        report_dir(None, "bringup")
    monkeypatch.setenv("CALCTL_REPORT_DIR", str(loop))
    with pytest.raises(UsageError, match="cannot be inspected"):
        report_dir(None, "bringup")
    with pytest.raises(UsageError, match=f"--report {fifo}: is a FIFO, not a directory"):
        report_dir(fifo, "soak")
    assert report_dir(tmp_path / "new" / "dir", "soak") == tmp_path / "new" / "dir"
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("name", ["report.html", "report.json", "steps/soak-report.html"])
def test_a_fifo_or_symlink_inside_the_report_directory_is_refused_before_the_run(tmp_path: Path, name: str) -> None:
    """A FIFO at accept's report.html (or bringup's, soak's) let the whole run go by and then exit 2 with no
    document, a GO report.json left on disk; now the directory is refused before the run, naming the entry."""
    import os

    out = tmp_path / "out"
    (out / name).parent.mkdir(parents=True)
    os.mkfifo(out / name)
    with pytest.raises(UsageError, match=f"--report {out}: holds {out / name}, which is a FIFO, not a regular file"):
        report_dir(out, "accept")
    (out / name).unlink()
    (out / name).symlink_to(tmp_path)
    with pytest.raises(UsageError, match="which is a symlink, not a regular file"):
        report_dir(out, "bringup")
    (out / name).unlink()
    (out / name).write_text("an earlier run's report: replaced, as before")
    assert report_dir(out, "soak") == out  # regular files and directories are what a report directory holds
