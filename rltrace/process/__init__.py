"""The traced process's surroundings: signals, children and their secrets, ranks, OTel's provider."""
