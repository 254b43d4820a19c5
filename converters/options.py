"""What the registries share, a method's (converters/registry.py) and a quantization scheme's
(converters/quantization/registry.py): their configs' options, declared once on the fields (a config field that
is an option carries it: `option_field`; the command line, the recipes and the configs read it from there), and
each entry registered under its name once (`register_once`)."""

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from compressor.errors import CompressorError

__all__ = ["Option", "option_field", "field_options", "config_from_options", "given", "register_once"]


@dataclass(frozen=True)
class Option:
    """A command-line option of a config. Configs that share a flag share one argparse option (its
    type must agree); `help` says what it means for this config and `default` is this config's (said
    after the help); with `many`, `run` takes several values and makes one variant per value;
    `aliases`: older spellings of the flag, still taken (a recipe's key too); `metavar`: the value's name
    in the help; `flagged` False: a recipe's key only, with no flag of its own; `neutral`: the value any run may
    give, which makes the option strict: another value is refused unless a config that takes the option is asked."""

    flag: str
    help: str
    type: Callable = str
    choices: tuple = ()
    many: bool = False
    aliases: tuple[str, ...] = ()
    default: Any = None
    metavar: str | None = None
    flagged: bool = True
    neutral: Any = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def said(self) -> str:
        """The help with this config's default."""
        return self.help if self.default is None else f"{self.help} (default: {self.default})"


def option_field(default: Any, option: Option) -> Any:
    """A config field whose default is `default` and whose command-line option is `option` (its help;
    the default said after it is the field's, unless the option names one in words)."""
    said = default if option.default is None else option.default
    return field(default=default, metadata={"option": replace(option, default=said)})


def field_options(config: type) -> tuple[Option, ...]:
    """The command-line options of a config's fields, in field order."""
    return tuple(f.metadata["option"] for f in fields(config) if "option" in f.metadata)


def config_from_options(config: type) -> Callable[[dict[str, Any]], Any]:
    """`from_options` for a config whose fields carry their options: each field given on the command
    line (not None) takes its value, the rest keep the field's default."""

    def build(values: dict[str, Any]) -> Any:
        named = {f.name: f.metadata["option"].dest for f in fields(config) if "option" in f.metadata}
        return config(**{name: values[dest] for name, dest in named.items() if values.get(dest) is not None})

    return build


def given(options: dict[str, Any], key: str, default: Any) -> Any:
    """An option's value, or `default` when it was not given (None)."""
    value = options.get(key)
    return default if value is None else value


def register_once(known: dict[str, Any], name: str, entry: Any, config: Callable[[Any], type], what: str) -> Any:
    """`entry` added to `known` under `name`; a second `what` of that name is refused, both configs named (an
    entry's: `config(entry)`)."""
    old = known.get(name)
    if old is not None:
        first, second = (f"{c.__module__}.{c.__name__}" for c in (config(old), config(entry)))
        raise CompressorError(
            f"the {what} {name!r} is registered twice (by {first} and {second}); give the new one another name"
        )
    known[name] = entry
    return entry
