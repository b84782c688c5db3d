"""Teaching a trained run new classes (or more photos of one it has) from a few photos, without retraining: the new
run written (teach: the teach command and the app's Teach tab), a hybrid's taught classes through a gate on its trunk
(gate), how well each taught class will be recognised (estimate), the "none of these" rule with the taught classes in
(rule), and where the new run is written, in one go (output). Reads a run's kept features and photos through
training/ (calibration, run_data)."""
