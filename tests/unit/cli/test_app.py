"""The CLI's shape: lazy command modules, help text, one --format vocabulary, one JUnit renderer."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from calctl.cli import _output, root_help
from calctl.cli.app import _COMMANDS, _LazyGroup, root_command
from tests.conftest import Cli

HEAVY = ("numpy", "matplotlib", "fastapi", "tokenizers", "uvicorn", "calctl.compiler.sample")


def _imported_after(code: str) -> set[str]:
    probe = f"import sys\n{code}\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    return set(out.stdout.split())


def test_importing_the_app_loads_no_heavy_module() -> None:
    loaded = _imported_after("import calctl.cli.app")
    assert not {m for m in HEAVY if m in loaded}


def test_top_level_help_and_version_load_no_command_module() -> None:
    loaded = _imported_after(
        "import contextlib, io\n"
        "from calctl.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['--help']) == 0\n"
        "    assert main(['--version']) == 0"
    )
    assert not {m for m in HEAVY if m in loaded}
    assert not {m for m in loaded if m.startswith("calctl.cli.") and m.endswith("_cmds")}


def test_version_does_not_even_import_typer() -> None:
    loaded = _imported_after(
        "import contextlib, io\nfrom calctl.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n    assert main(['--version']) == 0"
    )
    assert "typer" not in loaded


@pytest.mark.parametrize("name", list(_COMMANDS))
def test_listed_line_is_the_commands_own_first_paragraph(name: str) -> None:
    module, line = _COMMANDS[name]
    cmd = _LazyGroup._module_group(module).commands[name]
    assert (cmd.help or "").split("\n\n")[0] == line


def test_every_registered_command_is_in_the_fast_listing() -> None:
    """A new command module in app._COMMAND_MODULES must add its commands to calctl/cli/_commands.py."""
    from calctl.cli import app as app_module

    for module in app_module._COMMAND_MODULES:
        for name in _LazyGroup._module_group(module).commands:
            assert name in _COMMANDS, f"{module} registers {name!r}: add it to calctl/cli/_commands.py COMMANDS"
            assert _COMMANDS[name][0] == module, name
    assert {m for m, _ in _COMMANDS.values()} <= set(app_module._COMMAND_MODULES)


def test_top_level_help_lists_every_command_within_80_columns() -> None:
    text = root_help(width=80)
    assert all(len(line) <= 80 for line in text.splitlines())
    for name in _COMMANDS:
        assert f"  {name} " in text
    assert "soak" in text and "executor-modes" in text


def _walk(cmd, path=()):
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _walk(sub, (*path, name))


def _all_commands():
    root = root_command()
    for name in _COMMANDS:
        yield from _walk(root.get_command(None, name), (name,))


def test_help_text_has_no_mid_sentence_line_breaks_and_no_bool_placeholder() -> None:
    from typer import Context

    for path, cmd in _all_commands():
        for para in (cmd.help or "").split("\n\n"):
            assert "\n" not in para, (path, para)
        for p in cmd.get_params(Context(cmd)):
            if getattr(p, "is_flag", False):
                assert p.metavar == "", (path, p.name)
            if p.param_type_name == "option":
                assert p.help, f"calctl {' '.join(path)} {p.opts[0]} has no description"


def _format_choices(cmd) -> set[str] | None:
    for p in cmd.params:
        if p.name == "format":
            return {c.value if hasattr(c, "value") else str(c) for c in p.type_descriptor.choices}
    return None


JUNIT_COMMANDS = {
    ("validate",),
    ("run-golden",),
    ("warmup",),
    ("poc", "combined"),
    ("device", "conformance"),
    ("device", "check"),
    ("device", "reset"),
    ("accept",),
    ("bringup",),  # a lab CI reads one testcase per step (docs/lab.md)
}


#: Commands whose output is a stream of samples, not one document: JSON Lines instead of JSON.
STREAM_COMMANDS = {("device", "watch"): {"table", "jsonl"}}


def test_junit_is_offered_exactly_where_it_works() -> None:
    seen = set()
    for path, cmd in _all_commands():
        choices = _format_choices(cmd)
        if choices is None:
            continue
        seen.add(path)
        expected = (
            {"table", "json", "junit"} if path in JUNIT_COMMANDS else STREAM_COMMANDS.get(path, {"table", "json"})
        )
        assert choices == expected, path
    assert seen >= JUNIT_COMMANDS
    assert {("budget",), ("soak",), ("bench",), ("keygen",), ("inspect",), ("device", "info"), ("rules",)} <= seen


def test_junit_rejected_with_a_usage_error_where_not_offered(cli: Cli) -> None:
    for args in (("rules",), ("keygen", "x"), ("device", "info"), ("budget",), ("soak", "--cycles", "1")):
        r = cli(*args, "--format", "junit")
        assert r.code == 2, args
        assert "'junit' is not one of 'table', 'json'" in r.err


def test_explain_offers_close_rule_ids(cli: Cli) -> None:
    r = cli("explain", "CHIP03")
    assert r.code == 2
    assert "did you mean CHIP003" in r.err


def test_junit_renderer_escapes_what_xml_cannot_carry() -> None:
    nasty = 'bad\x00byte \x1b[31mred\x1b[0m ]]> <tag> & "quoted" \ud800'
    xml = _output.junit_xml(
        "calctl test",
        [
            _output.JunitSuite(
                "suite\x07",
                [
                    _output.JunitCase(name=nasty, classname="c", outcome="failure", message=nasty, text=nasty),
                    _output.JunitCase(name="ok", classname="c", output=nasty),
                    _output.JunitCase(name="skip", classname="c", outcome="skipped", message=nasty),
                ],
                [("p", nasty)],
            )
        ],
    )
    root = ET.fromstring(xml.encode("utf-8"))  # well-formed: the parser accepts it
    suite = root.find("testsuite")
    assert suite is not None and suite.get("failures") == "1" and suite.get("skipped") == "1"
    failure = root.find("testsuite/testcase/failure")
    assert failure is not None
    text = failure.text or ""
    assert "]]>" in text and "<tag>" in text and "\x00" not in text and "\x1b" not in text
    assert "\ufffd" in text
    assert root.get("tests") == "3"


@pytest.mark.parametrize("args", [(), ("poc",), ("device",)])
def test_a_group_without_a_command_prints_its_help_once_and_exits_2(cli: Cli, args) -> None:
    r = cli(*args)
    assert r.code == 2
    assert (r.out + r.err).count("Usage: calctl") == 1


@pytest.mark.parametrize("module", ["calctl.cli.package_cmds", "calctl.cli.soak_cmds", "calctl.cli.bench_cmds"])
def test_light_command_modules_import_no_heavy_library(module: str) -> None:
    loaded = _imported_after(f"import {module}")
    assert not {m for m in (*HEAVY, "jsonschema", "cryptography") if m in loaded}


def test_sample_kinds_in_the_help_are_the_compilers() -> None:
    from calctl.cli.package_cmds import SAMPLE_KINDS
    from calctl.compiler.sample import KINDS

    assert SAMPLE_KINDS == KINDS


def test_a_mistyped_command_gets_the_closest_names(cli: Cli) -> None:
    r = cli("valdate")
    assert r.code == 2
    assert "did you mean 'validate'?" in r.err
    r = cli("device", "confromance")
    assert r.code == 2
    assert "conformance" in r.err
    r = cli("zzzz")
    assert r.code == 2
    assert "did you mean" not in r.err.lower() and "`calctl --help` lists every command" in r.err


def _leaf_commands(group, path=()):
    import typer

    ctx = typer.Context(group, info_name="calctl")
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if hasattr(cmd, "list_commands"):
            yield from _leaf_commands(cmd, (*path, name))
        else:
            yield (*path, name)


def test_every_help_page_fits_80_columns_without_cutting_a_word(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich cuts a word longer than its help column with an ellipsis: no help text may hold one (issue 31)."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("TERMINAL_WIDTH", "80")
    cut = {}
    commands = list(_leaf_commands(root_command()))
    assert len(commands) > 20
    for path in commands:
        r = cli(*path, "--help")
        assert r.code == 0, path
        assert max(len(line) for line in r.out.splitlines()) <= 80, path
        lines = [line for line in r.out.splitlines() if "…" in line]
        if lines:
            cut[" ".join(path)] = lines
    assert not cut


def test_piped_tables_honour_columns() -> None:
    import os

    env = {**os.environ, "COLUMNS": "60"}
    out = subprocess.run(
        [sys.executable, "-m", "calctl", "rules"], capture_output=True, text=True, env=env, check=True, timeout=120
    ).stdout
    assert "LAY001" in out
    assert max(len(line) for line in out.splitlines()) <= 60


def _render(table, width: int) -> str:
    import io

    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=width, highlight=False).print(table)
    return buf.getvalue()


def test_tables_never_break_a_word_across_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 80 columns a cell wraps between words; a word too long for any layout is shortened with an
    ellipsis, never folded onto the next line (issue 31: budget ``code_and_comman|ds``)."""
    from rich.console import Console

    monkeypatch.setattr(_output, "stdout", Console(width=80))
    ids = ["code_and_commands", "allocator_fragmentation", "kv.block_tokens", "model_a_prefill", "unstable"]
    rows = [
        [name, "2,097,152", "0.002", "manifest", f"memory plan {name} from manifest {name} and more prose words"]
        for name in ids
    ]
    text = _render(_output.make_table("t", ["component", "bytes", "GiB", "source", "detail"], rows), 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    cells = [part.strip() for line in text.splitlines() for part in line.split("│")]
    for word in (w for row in rows for cell in row for w in cell.split()):
        pieces = [c for c in cells if c and word.startswith(c.split()[-1]) and c.split()[-1] != word]
        assert not [p for p in pieces if len(p.split()[-1]) > 1], (word, pieces)
    for name in ids:
        assert name in text  # the identifier column keeps its identifiers whole


def test_a_subcommand_help_loads_no_rule_schema_or_pydantic() -> None:
    """`calctl validate --help` renders from the command's signature alone (issue 31: 2.5 s before)."""
    loaded = _imported_after(
        "import contextlib, io\n"
        "from calctl.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['validate', '--help']) == 0\n"
        "    assert main(['rules', '--help']) == 0"
    )
    assert not {m for m in (*HEAVY, "pydantic", "jsonschema", "calctl.package.rules") if m in loaded}


def test_root_options_before_the_command(cli: Cli) -> None:
    assert cli("--version").out.strip().startswith("calctl ")
    assert cli("--debug", "--version").code == 0
    r = cli()
    assert r.code == 2 and "Commands:" in r.out and "--debug" in r.out
    r = cli("--debug", "--help")
    assert r.code == 0 and "Commands:" in r.out


def test_row_blocks_wrap_evidence_never_crop_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table too wide for 80 columns prints one block per row; its ``evidence:`` lines wrap between words
    (issue 31: bench's evidence lines were cut at column 80 with no ellipsis), piped or on a terminal."""
    import io

    for soft_wrap in (True, False):  # piped (lines whole elsewhere) and a terminal
        buf = io.StringIO()
        monkeypatch.setattr(_output, "stdout", _output.SafeConsole(file=buf, width=80, soft_wrap=soft_wrap))
        evidence = (
            "P99 TTFT isolated 12.3 ms [95 % CI 11.9, 12.8] (n=412) against joint 14.1 ms [95 % CI 13.5, 14.9] "
            "(n=398): records/ab-isolated.ndjson, records/ab-joint.ndjson, trace/ab.perfetto.json"
        )
        rows = [["ttft_p99_degradation", "joint <= isolated x 1.25", "1.146", "PASS", "412/398", evidence]]
        _output.print_rows("gates", ["gate", "rule", "value", "verdict", "samples", "evidence"], rows)
        lines = buf.getvalue().splitlines()
        assert max(len(line) for line in lines) <= 80, lines
        shown = " ".join(" ".join(line.split()) for line in lines)
        assert f"evidence: {evidence}" in shown
