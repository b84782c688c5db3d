"""Training a ViT: the run in order (trainer: setup, then the plan's head start, epochs and end: plan, head_start,
steps, epoch_end, saving, run_end; what it holds: state), its configuration in sections (config), the time budget
(budget), torchrun helpers (distributed), the optimizer's groups and schedule (optim), the hybrid's head start on
cached trunk outputs (token_cache, recipe, feature_start), the distillation teacher (distill), which photos a run used
(run_data, also read by evaluate, export and teach), and what the end of a run adds to its best.pt (calibration).
Used by the train command, and by teaching/."""
