"""Every number option of every command refuses what is not a plain finite decimal number, naming itself.

The options are found by walking the click tree of the whole CLI, so an option added tomorrow is covered
without editing this file; one declared without the shared parser fails the first test.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
import typer

from calctl.cli._options import NumberParser
from calctl.cli.app import root_command
from tests.conftest import Cli


def _number_options() -> list[tuple[tuple[str, ...], str, type, Any]]:
    found: list[tuple[tuple[str, ...], str, type, Any]] = []

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        ctx = typer.Context(cmd, info_name=path[-1] if path else "calctl")
        if hasattr(cmd, "list_commands"):
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), (*path, name))
            return
        for param in cmd.params:
            desc = getattr(param, "type_descriptor", None)
            if desc is None:
                continue
            annotation = desc.annotation
            if get_origin(annotation) in (list, tuple):
                annotation = get_args(annotation)[0]
            if annotation in (int, float):
                found.append((path, param.opts[0], annotation, desc.parameter_info.parser))

    walk(root_command(), ())
    return found


NUMBER_OPTIONS = _number_options()
FLOAT_OPTIONS = [(p, o) for p, o, kind, _ in NUMBER_OPTIONS if kind is float]
INT_OPTIONS = [(p, o) for p, o, kind, _ in NUMBER_OPTIONS if kind is int]
BAD_FLOATS = ["inf", "-inf", "nan", "NaN", "1e309", "1_0", "0x10", "\u0663", "", "1.5.2"]
BAD_INTS = ["1_000", "0x10", "\u0663", "1e3", "2.0", "inf", "", "+-1"]


def _ids(cases: list[tuple[tuple[str, ...], str]]) -> list[str]:
    return [" ".join((*p, o)) for p, o in cases]


def test_the_tree_has_the_number_options_expected() -> None:
    assert len(FLOAT_OPTIONS) > 20 and len(INT_OPTIONS) > 20
    assert (("bench",), "--time-scale") in FLOAT_OPTIONS and (("validate",), "--profile") in INT_OPTIONS


@pytest.mark.parametrize(
    ("path", "opt", "kind", "parser"), NUMBER_OPTIONS, ids=_ids([(p, o) for p, o, *_ in NUMBER_OPTIONS])
)
def test_every_number_option_reads_its_text_with_the_shared_parser(
    path: tuple[str, ...], opt: str, kind: type, parser: Any
) -> None:
    assert isinstance(parser, NumberParser), f"{' '.join(path)} {opt}: declare it with float_option / int_option"
    assert parser.kind is kind


@pytest.mark.parametrize(("path", "opt"), FLOAT_OPTIONS, ids=_ids(FLOAT_OPTIONS))
def test_every_float_option_refuses_non_finite_and_non_decimal_values(
    cli: Cli, path: tuple[str, ...], opt: str
) -> None:
    for bad in BAD_FLOATS:
        r = cli(*path, opt, bad)
        assert r.code == 2, (opt, bad, r.err)
        assert f"'{opt}'" in r.err and repr(bad) in r.err, (opt, bad, r.err)
        assert "internal error" not in r.err and "Traceback" not in r.err


@pytest.mark.parametrize(("path", "opt"), INT_OPTIONS, ids=_ids(INT_OPTIONS))
def test_every_int_option_refuses_what_is_not_decimal_digits(cli: Cli, path: tuple[str, ...], opt: str) -> None:
    for bad in BAD_INTS:
        r = cli(*path, opt, bad)
        assert r.code == 2, (opt, bad, r.err)
        assert f"'{opt}'" in r.err and repr(bad) in r.err, (opt, bad, r.err)
        assert "internal error" not in r.err and "Traceback" not in r.err


def test_float_parser_reads_plain_decimals_and_checks_the_range() -> None:
    p = NumberParser(float, 0.5, 2.0)
    assert p("1") == 1.0 and p(" 1.5 ") == 1.5 and p("2e0") == 2.0 and p(".5") == 0.5 and p("+1.") == 1.0
    assert p(1.0) == 1.0  # a declared default
    zero = NumberParser(float, 0.0)("-0")
    assert zero == 0.0 and math.copysign(1.0, zero) == 1.0  # negative zero is zero
    for bad in ("0.49", "2.01", "-1"):
        with pytest.raises(
            Exception, match=re.escape("out of range: expected a finite decimal number >= 0.5 and <= 2")
        ):
            p(bad)
    positive = NumberParser(float, 0.0, above=True)
    assert positive("1e-3") == 0.001
    with pytest.raises(Exception, match="> 0"):
        positive("0")
    with pytest.raises(Exception, match="not finite"):
        p(float("inf"))


def test_int_parser_takes_decimal_digits_and_a_sign_only() -> None:
    p = NumberParser(int, -5, 10**30)
    assert p("7") == 7 and p("+7") == 7 and p("-5") == -5 and p("-0") == 0 and p(str(10**30)) == 10**30
    for bad in ("1_000", "0b1", "0o7", "\u0663", "\uff11", "1.0", "1e2", "true"):
        with pytest.raises(Exception, match="is not a decimal integer"):
            p(bad)
    with pytest.raises(Exception, match="out of range"):
        p("-6")
    with pytest.raises(Exception, match="not a number"):
        p(True)


def test_a_good_value_reaches_the_command(cli: Cli) -> None:
    r = cli("budget", "--limit", "1.5")  # parsed, then refused by the command's own (0, 1] check
    assert r.code == 2 and "--limit 1.5 is outside (0, 1]" in r.err


def test_time_scale_help_states_each_commands_real_default(cli: Cli) -> None:
    """The --time-scale help words the default of the run it configures: the runners' own constants."""
    from calctl.cli import _options
    from calctl.runners.bench.batch import BATCH_TIME_SCALE
    from calctl.runners.bench.executor_modes.plan import EXECUTOR_TIME_SCALE
    from calctl.runners.bench.fault_isolation import FAULT_ISOLATION_TIME_SCALE
    from calctl.runners.bench.isolation import ISOLATION_TIME_SCALE
    from calctl.runners.poc import POC_MOCK_TIME_SCALE

    assert _options.POC_TIME_SCALE_HELP.startswith(f"{POC_MOCK_TIME_SCALE:g}:")
    assert _options.BRINGUP_TIME_SCALE_HELP.startswith(f"{POC_MOCK_TIME_SCALE:g} in the PoC step")
    bench = _options.BENCH_TIME_SCALE_HELP
    for name, value in (
        ("fault-isolation", FAULT_ISOLATION_TIME_SCALE),
        ("executor-modes", EXECUTOR_TIME_SCALE),
        ("batch", BATCH_TIME_SCALE),
        ("isolation", ISOLATION_TIME_SCALE),
    ):
        assert f"{name} {value:g}" in bench
    accept = _options.ACCEPT_TIME_SCALE_HELP
    for words in (
        f"{POC_MOCK_TIME_SCALE:g} for the PoC and batch",
        f"{ISOLATION_TIME_SCALE:g} for isolation",
        f"{FAULT_ISOLATION_TIME_SCALE:g} for fault isolation",
        f"{EXECUTOR_TIME_SCALE:g} for executor modes",
    ):
        assert words in accept
    assert BATCH_TIME_SCALE == POC_MOCK_TIME_SCALE
    for path, words in (
        (("poc", "combined"), "default 4"),
        (("bringup",), "default 4 in the PoC step"),
        (("warmup",), "default 1)"),
        (("soak",), "default 1)"),
    ):
        r = cli(*path, "--help")
        text = " ".join(r.out.replace("│", " ").split())
        assert words in text and "its help" not in text, (path, text)


def test_sample_package_seed_range_is_checked_when_parsed(cli: Cli, tmp_path: Path) -> None:
    r = cli("sample-package", tmp_path / "out", "--key", tmp_path / "missing.key", "--seed", str(2**31 + 1))
    assert r.code == 2 and "'--seed'" in r.err and "<= 2147483648" in r.err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("columns", "width"), [("120", 120), ("\u0663\u0660", 100), ("1_00", 100), ("inf", 100)])
def test_columns_is_read_as_ascii_digits(monkeypatch: pytest.MonkeyPatch, columns: str, width: int) -> None:
    import io

    from calctl.cli import _output

    monkeypatch.setenv("COLUMNS", columns)
    assert (_output._width(io.StringIO()) or 0) == width  # piped: COLUMNS, else LOG_WIDTH (100)


def test_comma_separated_integer_options_take_decimal_digits_only(cli: Cli, tmp_path: Path) -> None:
    from calctl.compiler.importer.build import parse_profiles
    from calctl.errors import UsageError

    assert parse_profiles("1, 4,8") == (1, 4, 8)
    for bad in ("1,0x4", "1,4_0", "1,\u0664", "1,4.0"):
        with pytest.raises(UsageError, match="--profiles"):
            parse_profiles(bad)
        r = cli("sample-package", tmp_path / "out", "--key", tmp_path / "missing.key", "--profiles", bad)
        assert r.code == 2 and "--profiles" in r.err and "internal error" not in r.err, r.err
    assert not (tmp_path / "out").exists()
