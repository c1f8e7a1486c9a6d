"""The simulated device's rules as data and their judges: the versioned device profile
(``profiles/*.json``), the per-op and layout rules, the card's per-op defects, the lowering
report, and who is watching the device (tracking)."""
