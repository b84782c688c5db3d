"""Using a trained model: batches of photos through it (batches), the rows of predicted files and their .csv / .json
(predictions), its ONNX exports made and checked against PyTorch (onnx_export) and run with or without torch
(onnx_runtime, onnx_torch), the device and precision choices, the commands' process settings (runtime), the "none of
these" rule (unknown, torch-free) and what a model gives for photos: logits, the head's input, the features the rule
reads, the CLS token (features)."""

# the choices of --precision and of the config key: here, torch-free, so that cli.py and the ONNX paths can list them
# without importing torch (precision.py, which acts on them, does)
PRECISIONS: tuple[str, ...] = ("auto", "fp32", "bf16")
# the choices of the config key precision_probe: auto's verdict read from this machine's cache (precision_cache.py), or
# timed afresh (and kept)
PROBE_MODES: tuple[str, ...] = ("cached", "fresh")
# photos a model runs on at once when it only predicts (validation, the trunk's pass, the end of the run, evaluate,
# predict, check, the app), unless told otherwise: the activations of a batch, not the photos, set these commands'
# memory (the hybrid at 224 px on evaluate: RssAnon +0.3 GB at 16, +1.3 GB at 64, +2.9 GB at 128), and on a CPU 16
# at once is as fast as more (benchmarks/README.md, "Memory flat in the number of photos"). Torch-free, for
# cli.py's defaults.
INFERENCE_BATCH: int = 16
# the most probable classes shown for a photo, unless told otherwise: predict's --top-k, the page's (app --top-k)
TOP_K: int = 3
