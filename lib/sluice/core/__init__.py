"""Sluice's vocabulary: records, outcomes, errors, ports, names, validation, the clock, the status event."""
