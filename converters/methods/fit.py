"""The fit every method shares: what its compact form is fitted to. plain: the trained weights alone;
aware: the calibration data too (a linear layer's input Gram, a table's token frequencies); fisher:
aware, and each error weighted by how much the model's output feels it (the output sensitivities).
The command line's --fit (--kind, its old spelling, still taken); a budget's losses measure, by fit,
the weight's error, the output's or the loss's (FIT_METRICS)."""

from typing import Any

from compressor.errors import PlanError
from converters.registry import Option

__all__ = [
    "FITS",
    "FIT_METRICS",
    "check_fit",
    "fit_metric",
    "fit_option",
    "legacy_fit",
    "needs_data",
    "needs_sensitivity",
]

FITS = ("plain", "aware", "fisher")
FIT_METRICS = {"plain": "weight", "aware": "output", "fisher": "loss"}


def check_fit(fit: object, method: str) -> None:
    if fit not in FITS:
        raise PlanError(f"a {method} fit is one of {', '.join(FITS)}, got {fit!r}")


def needs_data(fit: str) -> bool:
    return fit != "plain"


def needs_sensitivity(fit: str) -> bool:
    return fit == "fisher"


def fit_metric(cfg: Any) -> str:
    """What a budget's losses measure for a config (BudgetRule.metric), by its fit."""
    return FIT_METRICS[cfg.fit]


def fit_option(aware: str, plain: str) -> Option:
    """The --fit option of a method: `aware` and `plain` say what those fits are for it."""
    return Option(
        "--fit",
        f"fisher (aware, and each error weighted by how much the model's output feels it), aware ({aware}) — both "
        f"need calibration — or plain ({plain})",
        choices=FITS,
        many=True,
        aliases=("--kind",),
    )


def legacy_fit(config: dict[str, Any]) -> dict[str, Any]:
    """A plan file's config written before the fit was one field: `kind` (PHM, DeFINE) or the flags
    whiten / weighted / sensitive (low rank, TT) → `fit`; one whose flags disagree is refused."""
    config = dict(config)
    if "kind" in config:
        config["fit"] = config.pop("kind")
    flags = {k: config.pop(k) for k in ("whiten", "weighted", "sensitive") if k in config}
    if flags and "fit" not in config:
        data = {v for k, v in flags.items() if k != "sensitive"}
        if len(data) > 1 or (flags.get("sensitive") and False in data):  # fisher builds on the aware fit
            raise PlanError(f"a config with {flags} mixes fits; give one fit (plain, aware or fisher)")
        config["fit"] = "fisher" if flags.get("sensitive") else "aware" if data == {True} else "plain"
    return config
