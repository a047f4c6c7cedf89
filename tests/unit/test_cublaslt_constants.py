"""Every constant that runtime/cublaslt.py hard-codes, against the installed CUDA headers
(cublasLt.h, cublas_api.h, library_types.h: torch's and CuPy's CUDA wheels ship them under
site-packages/nvidia/cu13/include). Skips where no header is installed."""

import os
import re
import sys

import pytest

from runtime import cublaslt

NAMES = [n for n in dir(cublaslt) if re.match(r"(CUBLAS|CUBLASLT|CUDA)_[A-Z0-9_]+\Z", n)]


def _include_dirs():
    roots = sys.path + [os.environ.get("CUDA_HOME", "/usr/local/cuda")]
    for root in roots:
        for sub in ("nvidia/cu13/include", "nvidia/cublas/include", "include"):
            d = os.path.join(root, sub)
            if os.path.exists(os.path.join(d, "cublasLt.h")):
                yield d


def _enumerators(text: str) -> dict[str, int]:
    """``NAME = expression`` entries of the header's enums, evaluated in order (the
    expressions are ints, earlier names, |, << and parentheses)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    values: dict[str, int] = {}
    for name, expr in re.findall(r"\b([A-Z][A-Z0-9_]+)\s*=\s*([^,}=;]+?)\s*[,}]", text):
        expr = re.sub(r"\b(\d+)[uUlL]+\b", r"\1", expr.strip())
        if not re.fullmatch(r"[A-Z0-9_ |()<x+a-fA-F-]+", expr):
            continue
        try:
            values[name] = int(eval(expr, {"__builtins__": {}}, dict(values)))  # noqa: S307
        except Exception:  # noqa: BLE001 - an expression of names we did not collect
            continue
    return values


@pytest.fixture(scope="module")
def header_values():
    dirs = list(_include_dirs())
    if not dirs:
        pytest.skip("no cublasLt.h installed (torch/CuPy CUDA wheels or a CUDA toolkit)")
    values = {}
    for f in ("library_types.h", "cublas_api.h", "cublasLt.h"):
        path = os.path.join(dirs[0], f)
        if os.path.exists(path):
            with open(path) as fh:
                values.update(_enumerators(fh.read()))
    return values


def test_constants_are_collected():
    assert "CUBLASLT_EPILOGUE_GELU_AUX" in NAMES and "CUDA_R_16BF" in NAMES
    assert len(NAMES) >= 18


@pytest.mark.parametrize("name", NAMES)
def test_constant_matches_header(header_values, name):
    assert name in header_values, f"{name} not found in the header"
    assert getattr(cublaslt, name) == header_values[name], name


def test_epilogue_table_uses_the_constants():
    assert cublaslt.EPILOGUES == {None: 1, "gelu_aux": 160, "dgelu": 192}


def test_unsupported_says_why_on_cpu():
    import torch

    a, b = torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(8, 16, dtype=torch.bfloat16)
    out = torch.zeros(4, 16, dtype=torch.bfloat16)
    assert "CUDA" in cublaslt.unsupported(a, b, out, "gelu_aux", out.clone())
    assert "needs aux" in cublaslt.unsupported(a, b, out, "dgelu")
    assert "unknown epilogue" in cublaslt.unsupported(a, b, out, "relu", out)


def test_reference_is_the_tanh_gelu_and_its_derivative():
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 7, generator=g, dtype=torch.float64), torch.randn(7, 3, generator=g, dtype=torch.float64)
    out, aux = torch.empty(5, 3, dtype=torch.float64), torch.empty(5, 3, dtype=torch.float64)
    cublaslt.reference(a, b, out, "gelu_aux", aux)
    assert torch.allclose(aux, a @ b) and torch.allclose(out, F.gelu(a @ b, approximate="tanh"))
    pre = (a @ b).requires_grad_()
    F.gelu(pre, approximate="tanh").backward(torch.ones_like(pre))
    cublaslt.reference(a, b, out, "dgelu", aux)
    assert torch.allclose(out, (a @ b) * pre.grad)
