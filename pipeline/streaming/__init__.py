"""Streaming: shuffled batches from a store into Keras or PyTorch."""

from pipeline.streaming.streamer import Stream, stream

__all__ = ["Stream", "stream"]
