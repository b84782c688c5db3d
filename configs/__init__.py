"""The shipped recipes: this folder is installed inside the package as ``vit_flowers.configs`` (pyproject.toml), so
that a command reads its own defaults from these files (``training.config.shipped_recipe``) and they live once."""
