"""How many positions a model takes, as its folder's config.json says."""

import json
from pathlib import Path

__all__ = ["context_length"]


def context_length(folder: Path) -> int | None:
    """The most positions the model in `folder` takes, from its config.json (None when it does not say)."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return next((config[k] for k in ("max_position_embeddings", "n_positions", "n_ctx") if k in config), None)
