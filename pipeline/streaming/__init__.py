"""Streaming: shuffled batches from a store into Keras or PyTorch."""

from pipeline.streaming.api import stream
from pipeline.streaming.streamer import Stream

__all__ = ["Stream", "stream"]
