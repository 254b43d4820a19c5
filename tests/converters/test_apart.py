"""A run's rows and bench apart from PyTorch (converters/pipeline/apart.py, rows.py): what the fresh process imports
to round the LM goal's rows and bench them loads neither PyTorch nor transformers, the scheme registry still lists
every scheme, and the package faces load their names on first use. The run itself, from the command line:
tests/e2e/test_lm_cli.py."""

import subprocess
import sys

import pytest

import compressor

LIGHT = (
    "converters.pipeline.apart",
    "converters.quantization.schemes.int8",
    "converters.quantization.schemes.int4",
    "converters.quantization.schemes.int4_aware",
    "converters.quantization.kv_cache",
    "eval.benchmark",
)


def _imported(code: str) -> list[str]:
    """The lines `code` prints in a fresh Python."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_the_rows_and_the_bench_import_no_torch_or_transformers():
    code = f"import sys\nfor m in {LIGHT!r}: __import__(m)\n"
    code += "print(*[m for m in ('torch', 'transformers') if m in sys.modules], 'checked')"
    assert _imported(code) == ["checked"]


def test_the_registry_still_lists_every_scheme_and_one_scheme_s_module_imports_it_alone():
    code = "import pkgutil, sys\nimport converters.quantization.schemes.int4_aware\n"
    code += "from converters.quantization import registry, schemes\nalone = sorted(registry._SCHEMES)\n"
    code += "modules = list(pkgutil.iter_modules(schemes.__path__))\n"
    code += "print(*alone, 'torch' in sys.modules, len(registry.schemes()), len(modules))"
    *alone, light, every, modules = _imported(code)
    assert alone == ["int4", "int4-aware"] and light == "False"  # int4-aware and the int4 it derives from
    assert every == modules  # a scheme a module


def test_a_package_face_loads_its_names_on_first_use_and_refuses_others():
    assert compressor.tt_matrix_svd.__module__ == "compressor.tt"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        compressor.nothing  # noqa: B018


@pytest.mark.parametrize("argv", [[], ["x"], ["3"]])
def test_the_fresh_process_s_entry_point_refuses_anything_but_the_unlinked_state_file(argv, tmp_path):
    named = tmp_path / "state"
    named.write_bytes(b"not the run's state")
    with open(named, "rb") as f:  # a file with a name, open as fd 3 in the child
        code = "import os, sys; os.dup2(int(sys.argv[1]), 3); sys.argv[1:] = sys.argv[2:]; import runpy; "
        code += "runpy.run_module('converters.pipeline.apart', run_name='__main__', alter_sys=True)"
        argv_ = [sys.executable, "-c", code, str(f.fileno()), *argv]
        done = subprocess.run(argv_, capture_output=True, text=True, timeout=300, pass_fds=(f.fileno(),))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "is run by `compressor run` itself" in done.stderr
