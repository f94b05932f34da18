"""Integration tier: the real bundled SmolLM2, loaded once per session (its cache is built on first use)."""
import pytest
from transformers.utils import logging as hf_logging

from latentwire.agent import Agent


@pytest.fixture(scope="session")
def smollm2() -> Agent:
    hf_logging.disable_progress_bar()
    return Agent.from_pretrained("smollm2-135m")
