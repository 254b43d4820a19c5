"""What the commands say: one line on stderr per step."""

import sys

from tqdm.auto import tqdm

from converters.torchrun import world

__all__ = ["say", "say_traced"]


def say(message: str) -> None:
    """A line on stderr, from the first process only under torchrun; above a progress bar that is running
    (tqdm.write), not glued to its end."""
    if world().main:
        tqdm.write(f"compressor: {message}", file=sys.stderr)


def say_traced(model) -> None:
    """Why `model`'s graph is the PyTorch exporter's rather than one its kind writes from the weights, when it is."""
    from converters.kinds import kind_of  # here: the rows' process imports this module without PyTorch

    because = kind_of(model).traced_because(model)
    if because is not None:
        say(
            f"the fused decoder does not take this model ({because}): its graph is the PyTorch exporter's, which ONNX "
            "Runtime runs more slowly and ONNX Runtime GenAI's generator does not run"
        )
