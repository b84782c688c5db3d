"""The evaluation of a model on labelled photos (evaluation) and its report: figures, report.md and a
self-contained report.html (report); where the ViT looks, drawn over the photo (attention_maps)."""
