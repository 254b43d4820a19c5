"""A model's module tree by dotted names: `set_submodule` puts a module where a name points, as
`nn.Module.get_submodule` reads one."""

from torch import nn

__all__ = ["set_submodule"]


def set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)
