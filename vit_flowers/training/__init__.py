"""Training a ViT: the run's parts in order (trainer), its configuration in sections (config), the time budget, torchrun
helpers (distributed), the hybrid's head start on cached trunk outputs (token_cache), the distillation teacher
(distill), which photos a run used (run_data, also read by evaluate, export and teach), and what the end of a run
adds to its best.pt (calibration: class means, the unknown rule, the features teach refits a head on, and that head's
fit). Used by the train command, and by teaching/."""
