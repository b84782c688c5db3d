"""Training a ViT: the run's parts in order (trainer), its configuration in sections (config), the time budget, torchrun
helpers (distributed), the hybrid's head start on cached trunk outputs (token_cache), the distillation teacher
(distill), which photos a run used (run_data, also read by evaluate, export and teach), what the end of a run adds
to its best.pt (calibration: class means, the unknown rule, the features teach refits a head on, and that head's fit)
and teaching a run a new class from a few photos (teaching: the teach command and the app's Teach tab). Used by the
train command."""
