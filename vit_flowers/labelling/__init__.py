"""Labelling an unlabelled folder with a run's help (#63)."""
