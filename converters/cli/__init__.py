"""The command line, one module per command: compress, tie, finetune, export, bench, generate, run, sweep, recipes
(catalog.py). The only
place that wires compressor, converters and eval together; it names no method and no model kind
(it reads the method registry and the kind adapters).

The names below load on first use (PEP 562), so that the `compressor` command's own process (shell.py) imports the
parser, and PyTorch with it, only where it runs a command itself."""

from compressor.lazy_names import lazy_names

__getattr__, __all__ = lazy_names(
    __name__,
    {
        "main": "converters.cli.command_line",
        "build_parser": "converters.cli.command_line",
        "COMMANDS": "converters.cli.command_line",
    },
)
