"""Why features that are gone are gone: the one text that a config key, a value or a ``--pretrained`` source
that once named them is refused with (config.py and pretrained.py, which config.py reads, both quote it)."""

__all__ = ["FRACTALS_REMOVED"]

FRACTALS_REMOVED = ("the fractal start was removed on 2026-12-04: it trailed training from scratch on "
                    "full-resolution photos, 79.5% against 81.8% (benchmarks/README.md)")
