"""bench/predict.py: the heuristic's predictions for every benchmarked shape, kept in sync with the model."""

from __future__ import annotations

from pathlib import Path

from bench import predict
from bench.shapes import contiguous_shapes, dense_shapes, masked_shapes


def test_every_benchmarked_shape_has_a_prediction():
    rows = predict.predictions()
    assert len(rows) == len(dense_shapes("deepseek-v3")) + len(contiguous_shapes()) + len(masked_shapes())
    for row in rows:
        micros = float(row.split("|")[4])
        floor = float(row.split("|")[7])
        assert micros >= floor * 0.999, f"the model predicts faster than the hardware floor: {row}"


def test_committed_predictions_match_the_model():
    committed = Path(predict.__file__).with_name("PREDICTIONS.md").read_text()
    assert committed == predict.render(), "run `python -m bench.predict` after changing the heuristic's model"


def test_up_projection_rows_fused_vs_unfused():
    """Issue 27's rows: for every up-projection shape the fused kernel is modelled no slower than the bf16 GEMM +
    silu_mul_quant and moves 16 KB less per routed row (the bf16 gate | up written and read back)."""
    rows = predict.up_projection_predictions()
    assert len(rows) == 2 * len(predict.up_projection_shapes()) > 0
    for unfused, fused in zip(rows[::2], rows[1::2]):
        u, f = unfused.split("|"), fused.split("|")
        assert u[1].strip() == "unfused" and f[1].strip() == "fused" and u[2] == f[2]
        assert float(f[4]) <= float(u[4]), (unfused, fused)
        assert int(u[5].replace(",", "")) - int(f[5].replace(",", "")) >= 4 * 2 * 2048, (unfused, fused)
