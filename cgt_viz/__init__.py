"""cgt_viz: train, compile and look inside Contextually Guided Transformers (arXiv 2506.05672)."""
from .config import SITES, CGTConfig
from .model import CGT, GPT

__version__ = "0.1.0"
__all__ = ["CGTConfig", "CGT", "GPT", "SITES", "__version__"]
