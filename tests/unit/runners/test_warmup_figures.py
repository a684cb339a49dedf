"""Warm-up's table and picture give one set of figures (#53 item 10): the picture said n=20 beside the table's 19
(it kept the cold first iteration), and both printed a "P99" of 19 samples."""

from __future__ import annotations

from calctl.checks.stats import MIN_P99_SAMPLES, percentiles
from calctl.runners.trace import TraceSlice, _latency_panel


def _jobs(graph: str, iterations: int, per_iteration: int) -> list[TraceSlice]:
    out: list[TraceSlice] = []
    t = 0.0
    for i in range(iterations):
        for _ in range(per_iteration):
            ms = 9.0 if i == 0 else 5.0  # the cold iteration is slow
            out.append(TraceSlice(0, t, t + ms / 1e3, "model-a", graph, "ping", len(out), 1))
            t += 0.01
    return out


def test_a_tail_of_fewer_than_100_samples_is_called_the_max() -> None:
    few = percentiles([1.0] * 18 + [2.0])
    assert few.tail() == ("max", 2.0)
    many = percentiles([1.0] * MIN_P99_SAMPLES)
    assert many.tail() == ("P99", many.p99)


def test_the_pictures_figures_leave_out_the_cold_iteration_as_the_table_does() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs = _jobs("model_a_prefill", 20, 1) + _jobs("model_a_decode", 20, 8)
    fig, ax = plt.subplots()
    try:
        _latency_panel(ax, jobs, ["model_a_decode", "model_a_prefill"], {"model-a": "C0"}, iterations=20)
        texts = [t.get_text() for t in ax.texts]
    finally:
        plt.close(fig)
    assert texts[0] == "P50 5.00 ms  P99 5.00 ms  CV 0.000  n=152", texts
    assert texts[1] == "P50 5.00 ms  max 5.00 ms  CV 0.000  n=19", texts  # not n=20, not a P99 of 19 jobs
