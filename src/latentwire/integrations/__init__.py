"""Adapters into agent frameworks (the top layer, beside the CLI): `langgraph` (a fan-in node)."""
