"""The engine: requests, paged KV blocks, the scheduler, the model runner and the step loop (see docs/architecture.md)."""
