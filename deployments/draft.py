"""DraftModel: the small model that proposes speculative tokens for the target's batch.

Present in the graph from the start; the speculative-decoding issue fills `propose` in. For
now it loads the draft checkpoint (so a bad path fails at deploy time, not mid-request) and
proposes nothing, which the target treats as "no speculation this step".
"""

from __future__ import annotations

from ray import serve

from app.config import EngineConfig
from app.models.loader import load_model


@serve.deployment(ray_actor_options={"num_cpus": 0.5})
class DraftModel:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.model = load_model(config.model, config.torch_dtype, config.torch_device)

    async def propose(self, batch: list[dict]) -> list[list[int]]:
        """For each sequence of the batch ({"token_ids", "k"}), up to k proposed tokens.

        Stub: proposes none.
        """
        return [[] for _ in batch]
