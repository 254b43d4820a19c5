"""The built-in compression methods, one module each; importing this package registers them all
(every module in this folder is imported, so a new method is one new file here)."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
