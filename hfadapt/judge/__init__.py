"""Judging one model on the simulated device: resolve and load it (real weights, or
structurally from its config), the probe inputs, the CPU reference, the metrics, where a
divergence starts, and the ``Diagnosis`` record that ``diagnose`` returns."""
