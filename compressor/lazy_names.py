"""A package's face whose names load on first use (PEP 562): importing the package runs none of its modules, so that
a process that needs one light module of it (no PyTorch) does not pay for the others."""

import importlib
from collections.abc import Callable

__all__ = ["lazy_names"]


def lazy_names(package: str, exports: dict[str, str]) -> tuple[Callable[[str], object], list[str]]:
    """(the module `__getattr__`, `__all__`) of `package` whose names are `exports` (name → the module holding it)."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__, list(exports)
