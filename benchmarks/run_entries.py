"""How often one `compressor run` enters each module of converters/ from another: a call of a function defined in the
module (not a comprehension, lambda or generator expression; a generator's resumption is the same entry, counted
once, at its start) whose caller's code stands in another file, counted with sys.setprofile over `compressor run` on
a tiny random BERT (tests/conftest.py's), the default goal, called in-process as `main([...])`. The larger a
module's count, the more often a run's way comes back to it.

    python benchmarks/run_entries.py [--json OUT]
"""

import argparse
import dis
import functools
import inspect
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = str(ROOT / "converters")


@functools.cache
def _start(code) -> int:
    """The offset at which a generator's code first runs (its first RESUME): a call event there is its start, any
    later one a resumption after a yield."""
    return min(i.offset for i in dis.get_instructions(code) if i.opname == "RESUME")


def entries(argv: list[str]) -> tuple[Counter, int]:
    """(calls into each module of converters/ from another file, by the module's path under the repository; the
    command's exit status)."""
    from converters.cli import main

    counts = Counter()

    def profile(frame, event, arg):
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(PACKAGE) or code.co_name.startswith("<"):
            return
        if code.co_flags & inspect.CO_GENERATOR and frame.f_lasti != _start(code):
            return
        caller = frame.f_back
        if caller is not None and caller.f_code.co_filename != code.co_filename:
            counts[str(Path(code.co_filename).relative_to(ROOT))] += 1

    sys.setprofile(profile)
    try:
        status = main(argv)
    finally:
        sys.setprofile(None)
    return counts, status


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.conftest import write_tiny_bert

    with tempfile.TemporaryDirectory() as work:
        model = write_tiny_bert(Path(work) / "bert")
        counts, status = entries(["run", str(model), "--out", str(Path(work) / "run"), "--runs", "2"])
    if status != 0:
        raise SystemExit(f"compressor run ended with exit status {status}")
    for module, count in counts.most_common(15):
        print(f"{count:6d}  {module}")
    pipeline = sum(c for m, c in counts.items() if m.startswith("converters/pipeline/"))
    print(f"{sum(counts.values()):6d}  in all; {pipeline} into converters/pipeline/")
    if args.json:
        args.json.write_text(json.dumps(dict(counts.most_common()), indent=1))


if __name__ == "__main__":
    main()
