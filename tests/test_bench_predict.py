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
