"""Registry from a method config type to the handler that builds the compact module.

Each handler declares the module types it accepts, so a plan is checked against the model
before any decomposition runs; anything else is an "unsupported module" PlanError.
"""

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from compressor.errors import PlanError
from compressor.tt_embedding import TTEmbedding
from converters.plan import TTConfig

__all__ = ["Handler", "HANDLERS", "handler_for", "COMPACT_MODULES"]


@dataclass(frozen=True)
class Handler:
    accepts: tuple[type[nn.Module], ...]
    build: Callable[[nn.Module, object], nn.Module]


HANDLERS: dict[type, Handler] = {}

# Compact module classes a checkpoint may rebuild, by class name (the loading allowlist).
COMPACT_MODULES: dict[str, type[nn.Module]] = {"TTEmbedding": TTEmbedding}


def registers(config_type: type, accepts: tuple[type[nn.Module], ...]):
    def wrap(build):
        HANDLERS[config_type] = Handler(accepts, build)
        return build

    return wrap


def handler_for(name: str, module: nn.Module, config) -> Handler:
    handler = HANDLERS.get(type(config))
    if handler is None:
        raise PlanError(f"no handler is registered for {type(config).__name__}")
    if not isinstance(module, handler.accepts):
        kinds = ", ".join(t.__name__ for t in handler.accepts)
        raise PlanError(
            f"unsupported module: {config.method} applies to {kinds}, "
            f"but {name!r} is a {type(module).__name__}"
        )
    return handler


@registers(TTConfig, accepts=(nn.Embedding,))
def _tt_embedding(module: nn.Embedding, cfg: TTConfig) -> TTEmbedding:
    return TTEmbedding.from_embedding(
        module, rank=cfg.rank, rel_eps=cfg.rel_eps, num_cores=cfg.num_cores, order=cfg.order
    )
