"""drafttree: lossless speculative decoding with draft trees on stock transformers models."""

from drafttree.accept import Sampling
from drafttree.api import GenerationResult, GenerationStream, SpeculativeModel, StreamChunk
from drafttree.drafters import METHODS
from drafttree.errors import DraftTreeError
from drafttree.models import DEFAULT_MODEL, LoadedModel, load_model

__version__ = "0.1.0"


def load(model: str = DEFAULT_MODEL, method: str = "auto", **kwargs) -> SpeculativeModel:
    """Shorthand for :meth:`SpeculativeModel.from_pretrained`."""
    return SpeculativeModel.from_pretrained(model, method=method, **kwargs)


__all__ = [
    "DEFAULT_MODEL", "METHODS", "DraftTreeError", "GenerationResult", "GenerationStream", "LoadedModel",
    "Sampling", "SpeculativeModel", "StreamChunk", "load", "load_model",
]
