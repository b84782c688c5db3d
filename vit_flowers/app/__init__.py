"""The local web page (``python -m vit_flowers.app``, ``vit-flowers app``): :mod:`.engine` (what it computes, no
Gradio), :mod:`.page` (its HTML), :mod:`.server` (the Gradio page and serving it), :mod:`.command` (the command:
``build_parser`` and ``main``)."""
