"""001 §14 per-request and per-job NDJSON records: the sink (calctl.serving.record_sink)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from calctl.errors import UsageError
from calctl.serving.record_sink import JOB_FIELDS, RECORDS_FILE, REQUEST_FIELDS, RecordSink


def test_a_request_record_has_every_field_and_null_for_unknown() -> None:
    out = io.StringIO()
    sink = RecordSink.to_stream(out)
    sink.request(request_id="cmpl-1", model_alias="model-a", model_generation=2, chips=[0], output_tokens=3)
    (line,) = out.getvalue().splitlines()
    doc = json.loads(line)
    assert doc["record"] == "request" and isinstance(doc["ts"], float)
    assert list(doc)[2:] == list(REQUEST_FIELDS)  # never omitted
    assert doc["ttft_ms"] is None and doc["error_class"] is None  # unknown is null, never 0
    assert doc["chips"] == [0] and doc["model_generation"] == 2


def test_a_job_record_has_every_field() -> None:
    out = io.StringIO()
    RecordSink.to_stream(out).job(job_id=7, graph="model_a_decode", h2d_ms=None, kv_before=[4], kv_after=[5])
    doc = json.loads(out.getvalue())
    assert doc["record"] == "job" and list(doc)[2:] == list(JOB_FIELDS)
    assert doc["kv_before"] == [4] and doc["kv_after"] == [5] and doc["h2d_ms"] is None


def test_an_undocumented_field_is_a_bug_not_a_silent_extra() -> None:
    with pytest.raises(ValueError, match="unknown field"):
        RecordSink.to_stream(io.StringIO()).request(chip_id=0)


def test_disabled_sink_writes_nothing() -> None:
    sink = RecordSink()
    assert not sink.enabled
    sink.request(request_id="x")  # no error, no output


def test_directory_rotates_and_keeps_five(tmp_path: Path) -> None:
    sink = RecordSink.to_directory(tmp_path / "rec", max_bytes=2000)
    for i in range(200):
        sink.request(request_id=f"cmpl-{i}", model_alias="model-a")
    sink.close()
    files = sorted(p.name for p in (tmp_path / "rec").iterdir())
    assert files == [RECORDS_FILE] + [f"{RECORDS_FILE}.{k}" for k in range(1, 6)]
    for f in (tmp_path / "rec").iterdir():
        assert f.stat().st_size <= 2000
        for line in f.read_text().splitlines():
            assert json.loads(line)["record"] == "request"
    last = json.loads((tmp_path / "rec" / RECORDS_FILE).read_text().splitlines()[-1])
    assert last["request_id"] == "cmpl-199"


def test_records_into_a_file_or_with_no_size_is_a_usage_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "plain"
    not_a_dir.write_text("x")
    with pytest.raises(UsageError, match=r"--records .*plain: cannot write records there"):
        RecordSink.to_directory(not_a_dir)
    with pytest.raises(UsageError, match="--records-max-mb: must be > 0"):
        RecordSink.to_directory(tmp_path / "ok", max_bytes=0)


def test_a_full_disk_drops_records_with_one_logged_error_not_a_traceback_per_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Hostile test of issue 19: on a full disk every record printed logging's "--- Logging error ---" and a
    whole traceback to stderr, and nothing said how many records were lost."""
    import logging
    import os

    if not os.path.exists("/dev/full"):
        pytest.fail("this test needs /dev/full (Linux)")
    (tmp_path / RECORDS_FILE).symlink_to("/dev/full")
    sink = RecordSink.to_directory(tmp_path)
    with caplog.at_level(logging.ERROR, logger="calctl.serve"):
        for i in range(5):
            sink.request(request_id=f"cmpl-{i}", model_alias="model-a")
            sink.flush()  # a write each: one error logged for the streak, not one per write
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Logging error" not in err, err
    assert sink.dropped == 5
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    msg = errors[0].getMessage()
    assert RECORDS_FILE in msg and "No space left on device" in msg and errors[0].exc_info is None
    assert len(sink.recent("request")) == 5  # the flight recorder still has them for the recovery evidence
    sink.close()


def test_a_directory_sink_writes_buffered_records_without_waiting_for_close(tmp_path: Path) -> None:
    """Records into a directory are written in batches by the sink's writer thread, at most FLUSH_S after they
    were made: a reader of records.ndjson sees them while the server runs, whole lines, in order."""
    from tests.waiting import wait_until

    sink = RecordSink.to_directory(tmp_path)
    for i in range(50):
        sink.job(job_id=i, graph="model_a_decode")
    path = tmp_path / RECORDS_FILE

    def lines() -> list[str]:
        return path.read_text().splitlines()

    wait_until(lambda: len(lines()) == 50, what="50 job records in records.ndjson", timeout=30)
    assert [json.loads(line)["job_id"] for line in lines()] == list(range(50))
    sink.job(job_id=50, graph="model_a_decode")
    sink.close()  # what is still buffered is written on close
    assert json.loads(lines()[-1])["job_id"] == 50


def test_a_figure_that_is_not_finite_is_null_in_the_record_never_bare_nan() -> None:
    out = io.StringIO()
    RecordSink.to_stream(out).job(job_id=1, device_ms=float("nan"), infer_ms=float("inf"))
    doc = json.loads(out.getvalue(), parse_constant=lambda c: pytest.fail(f"{c} in a record"))
    assert doc["device_ms"] is None and doc["infer_ms"] is None
