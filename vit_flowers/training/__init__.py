"""Training a ViT: the run's parts in order (trainer), its configuration (config), the time budget, torchrun
helpers (distributed), the hybrid's head start on cached trunk outputs (token_cache), the distillation teacher
(distill) and which photos a run used (run_data, also read by evaluate, export and teach). Used by the train
command."""
