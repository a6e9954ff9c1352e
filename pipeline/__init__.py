"""pipeline: out-of-core training sets."""
