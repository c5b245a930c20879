"""Batched speculative decoding: several sequences' draft trees verified in one target forward."""

from drafttree.batching.decode import BatchDecoder, Sequence, decode_batch
from drafttree.batching.policy import AlwaysDraft, DraftOrPlain, DraftWhilePays
from drafttree.batching.target import BatchTarget

__all__ = ["AlwaysDraft", "BatchDecoder", "BatchTarget", "DraftOrPlain", "DraftWhilePays", "Sequence", "decode_batch"]
