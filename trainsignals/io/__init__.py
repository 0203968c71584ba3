"""The edge where runs come in and go out: Arrow traces, other tools' logs, replay and reports, plots.

``trainsignals.io.traces`` (pyarrow), ``trainsignals.io.importers`` (Hugging Face, Lightning,
TensorBoard, CSV, JSONL), ``trainsignals.io.report`` (replay a run, status timeline, summaries),
``trainsignals.io.plot`` (matplotlib). Each imports its library itself, on first use.
"""
