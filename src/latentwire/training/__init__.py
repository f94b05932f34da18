"""Training translators between frozen models on split-evidence pairs (issue 6)."""
