"""Features: per-step features, multi-scale windows, labels, normalization and splits."""

from pipeline.features.build import TrainingSet, build_training_set
from pipeline.features.geometry import (
    halo,
    split_gap_windows,
    split_ranges,
    window_count,
    window_ends,
)
from pipeline.features.labels import class_balance, finalize_labels, label_steps
from pipeline.features.specs import FeatureSpec, LabelSpec
from pipeline.features.steps import FeatureFrame, compute_features
from pipeline.features.windows import window_end_rows, windows

__all__ = [
    "FeatureFrame",
    "FeatureSpec",
    "LabelSpec",
    "TrainingSet",
    "build_training_set",
    "class_balance",
    "compute_features",
    "finalize_labels",
    "halo",
    "label_steps",
    "split_gap_windows",
    "split_ranges",
    "window_count",
    "window_end_rows",
    "window_ends",
    "windows",
]
