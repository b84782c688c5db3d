"""The evaluation of a model on labelled photos (evaluation) and its report: figures, report.md and a
self-contained report.html (report)."""
