"""Training translators between frozen models on split-evidence pairs (docs/methods.md#translator-training)."""
