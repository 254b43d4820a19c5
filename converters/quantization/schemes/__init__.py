"""The built-in quantization schemes, one module each: int8, int8-aware, int8-aware-table, int4, int4-aware,
int4-corrected, int4-trained, w4a8, mixed; importing this package registers them all (every module in this folder is
imported, so a new scheme is one new file here)."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
