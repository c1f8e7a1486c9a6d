"""The eager half of the simulated device: the ``spyre`` PrivateUse1 device, its tensor, and
what happens to each ATen call on it."""
