"""The simulated device's numerics, as functions of plain parameters (a DL16 format, a chunk
size, an exp floor: never the device profile, which builds them): DL16 rounding, the C kernels
and their build, AMX's tiles, the kernels of ops whose intermediates the device keeps in DL16,
the device numbers an op takes as values, the ops that make no new value, and the host's
float32 state that judging pins."""
