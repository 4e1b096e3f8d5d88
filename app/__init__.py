"""specserve: an LLM serving system built as a Ray Serve deployment graph."""
