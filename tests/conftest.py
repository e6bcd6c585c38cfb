"""Shared fixtures: every test loads the package the way users do, through `kernels.get_kernel`.

The session builds the offline variants (scripts/build_variants.py) into a temporary directory,
points LOCAL_KERNELS at it and loads `w4a16-kernels/w4a16` version 1: on this CPU-only machine
the loader picks `torch-cpu`. Never import the package from torch-ext/ directly: the relative
`._ops` import only exists in a built variant.
"""

import os

import torch

# Must happen before anything imports triton: without a GPU the Triton kernels can only run
# in the interpreter (scripts/test.sh sets it as well).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Tests never reach the Hub: if the local build does not resolve, fail instead of downloading.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import triton.language as tl  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
REPO_ID = "w4a16-kernels/w4a16"

# Triton's interpreter patches triton.language for each call of a device function from an interpreted kernel and
# does not undo it (Triton 3.9: interpreter.py, the device-function `__call__` leaves its `_patch_lang` scope open;
# the kernel-level scope is restored). Interpreted kernels do not mind, but a Gluon compile later in the same
# process then builds through the interpreter's builder and fails. What the interpreter patches, as it was before
# any kernel ran, for `pristine_triton_language`:
_LANGUAGE_OBJECTS = (tl, tl.core, tl.math, tl.core.tensor, tl.core.dtype, tl.core.tensor_descriptor_base)
_PRISTINE = {obj: dict(vars(obj)) for obj in _LANGUAGE_OBJECTS}


def pytest_configure(config):
    # Also declared in pytest.ini; repeated so the marker is known even if pytest is pointed
    # at another ini file.
    config.addinivalue_line("markers", "kernels_ci: cheap test, run by kernel-builder's CI")


def load_build_script():
    """scripts/build_variants.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("build_variants", REPO / "scripts" / "build_variants.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def built_variants(tmp_path_factory) -> dict:
    """{backend: Path of <tmp>/build/torch-<backend>} for cuda, rocm and cpu, built once."""
    return load_build_script().build_variants(tmp_path_factory.mktemp("kernel") / "build")


@pytest.fixture(scope="session")
def build_dir(built_variants) -> Path:
    """The directory holding the torch-<backend> variants (what LOCAL_KERNELS points at)."""
    return next(iter(built_variants.values())).parent


@pytest.fixture(scope="session")
def w4a16(build_dir):
    """The kernel module, loaded with `get_kernel(REPO_ID, version=1)` from the fresh build."""
    import kernels

    saved = os.environ.get("LOCAL_KERNELS")
    os.environ["LOCAL_KERNELS"] = f"{REPO_ID}={build_dir}"
    try:
        yield kernels.get_kernel(REPO_ID, version=1)
    finally:
        if saved is None:
            os.environ.pop("LOCAL_KERNELS", None)
        else:
            os.environ["LOCAL_KERNELS"] = saved


@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def pristine_triton_language():
    """triton.language as it was before any interpreted kernel ran (see `_PRISTINE`), for a compile that must not
    see the interpreter's leftover patches (the Gluon kernel's sm_90 compile on the CPU)."""
    for obj, saved in _PRISTINE.items():
        for name in set(vars(obj)) - set(saved):
            delattr(obj, name)
        for name, value in saved.items():
            if vars(obj).get(name) is not value:
                setattr(obj, name, value)

