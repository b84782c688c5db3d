"""Run folders and what is in them: their files and metrics.csv (folders: no run replaces another), checkpoints
written atomically and read safely (checkpoint, torch_files), and the errors that name a file (errors, torch-free)."""
