"""latentwire: LLM agents that talk through their KV caches."""
__version__ = "0.1.0"
