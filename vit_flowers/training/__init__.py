"""Training a ViT: the run in order (trainer: setup, then the plan's head start, epochs and end: plan, head_start,
steps, epoch_end, saving, run_end; what it holds: state), its configuration in sections (config), the time budget
(budget), torchrun helpers (distributed), the optimizer's groups and schedule (optim), the hybrid's head start on
cached trunk outputs (token_cache, recipe, feature_start), and the distillation teacher (distill). What the end of a
run adds to its best.pt and which photos a run used live in inference/ (calibration, run_data): evaluate, export,
teach and the app read them too. Used by the train command."""
