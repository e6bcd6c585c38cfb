"""Packaging checks: build.toml, the built variants, loading, and the source rules the builder enforces."""

import ast
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from kernels import get_local_kernel
from kernels._rust import Backend, Build, Metadata

REPO = Path(__file__).resolve().parent.parent
PKG = REPO / "torch-ext" / "w4a16"
BACKENDS = ["cuda", "rocm", "cpu"]
SOURCES = sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


@pytest.mark.kernels_ci
def test_build_toml_parses():
    build = Build.open(REPO)  # the builder's own rules: unknown keys, old forms are rejected
    assert set(build.general.backends) == {Backend.CUDA, Backend.ROCm, Backend.CPU}
    general = tomllib.loads((REPO / "build.toml").read_text())["general"]
    assert (general["name"], general["version"]) == ("w4a16", 1)
    assert general["hub"]["repo-id"] == "w4a16-kernels/w4a16"


@pytest.mark.kernels_ci
@pytest.mark.parametrize("backend", BACKENDS)
def test_variant_layout(built_variants, backend):
    variant = built_variants[backend]
    assert variant.name == f"torch-{backend}"
    meta = Metadata.read_from_file(variant / "metadata.json")
    assert str(meta.name) == "w4a16" and meta.version == 1 and meta.python_depends == []
    assert meta.backend.backend_type == Backend.from_str(backend)
    assert meta.id.startswith(f"_w4a16_{backend}_")
    # _ops.py names the same namespace the loader imports the module under.
    assert f'_OPS_NAME = "{meta.id}"' in (variant / "_ops.py").read_text()
    for src in PKG.rglob("*"):
        if src.suffix in (".py", ".json") and "__pycache__" not in src.parts:
            assert (variant / src.relative_to(PKG)).read_bytes() == src.read_bytes()


@pytest.mark.kernels_ci
def test_get_kernel_picks_cpu_variant(w4a16, built_variants):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: get_kernel picks torch-cuda")
    assert Path(w4a16.__file__).parent == built_variants["cpu"]
    assert w4a16.__name__ == Metadata.read_from_file(built_variants["cpu"] / "metadata.json").id


@pytest.mark.kernels_ci
@pytest.mark.parametrize("backend", BACKENDS)
def test_variant_loads(built_variants, backend):
    variant = built_variants[backend]
    meta = Metadata.read_from_file(variant / "metadata.json")
    if backend == "cpu":
        # The build directory itself, as a user would pass it: the loader must pick torch-cpu.
        module = get_local_kernel(variant.parent, backend="cpu")
    else:
        # get_local_kernel(<build dir>, backend="cuda"/"rocm") is refused by kernels on a CPU-only
        # torch ("Invalid backend"). A path that holds metadata.json is taken as the variant itself
        # without a backend check, so this imports the GPU variant exactly as the loader would
        # (under its metadata id). Its namespace differs from the cpu one, so both coexist.
        module = get_local_kernel(variant)
    assert module.__name__ == meta.id
    assert Path(module.__file__).parent == variant
    assert module._ops.add_op_namespace_prefix("gemm") == f"{meta.id}::gemm"
    assert module._ops.ops is getattr(torch.ops, meta.id)


@pytest.mark.kernels_ci
def test_no_module_named_like_the_package():
    # torch-ext/w4a16/w4a16.py would shadow the package in the built variant (circular import).
    assert not [p for p in PKG.rglob("w4a16.py")]
    assert (PKG / "__init__.py").is_file()


# torch.library entry points that take an op name (or, for Library, a namespace) first.
_REGISTRATIONS = {
    "custom_op", "triton_op", "define", "impl", "register_fake", "register_kernel",
    "register_autograd", "register_torch_dispatch", "register_vmap", "impl_abstract", "Library",
}
# These may also take an op object (e.g. torch.library.register_fake(gemm)) instead of a name.
_TAKES_OP_OBJECT = _REGISTRATIONS - {"custom_op", "triton_op", "define", "Library"}


def _registration_name(call: ast.Call) -> str | None:
    """`custom_op` for torch.library.custom_op(...), library.custom_op(...) or a bare custom_op(...).

    Methods called on other objects (`gemm.register_fake`, `lib.impl` on a Library instance) are
    not registrations by name: the op object or the Library already carries the namespace.
    """
    func = call.func
    if isinstance(func, ast.Name) and func.id in _REGISTRATIONS:
        return func.id
    if isinstance(func, ast.Attribute) and func.attr in _REGISTRATIONS:
        if func.attr == "Library" or _name(func.value) == "library":
            return func.attr
    return None


def _name(node) -> str | None:
    """`f` for f(...) and `a.b.f(...)` alike."""
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _first_arg(call: ast.Call):
    if call.args:
        return call.args[0]
    for kw in call.keywords:
        if kw.arg in ("name", "qualname", "op", "ns", "op_name"):
            return kw.value
    return None


def _calls_prefix(node) -> bool:
    return any(isinstance(n, ast.Call) and _name(n.func) == "add_op_namespace_prefix" for n in ast.walk(node))


@pytest.mark.kernels_ci
def test_registrations_use_namespace_prefix():
    bad, found = [], 0
    for path in SOURCES:
        tree = _parse(path)
        uses_prefix = False
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or (kind := _registration_name(node)) is None:
                continue
            found += 1
            arg = _first_arg(node)
            ok = arg is not None and (
                _calls_prefix(arg)
                or (kind in _TAKES_OP_OBJECT and isinstance(arg, (ast.Name, ast.Attribute)))
            )
            uses_prefix |= arg is not None and _calls_prefix(arg)
            if not ok:
                bad.append(f"{path.relative_to(REPO)}:{node.lineno} {kind}(...)")
        imported = any(
            isinstance(n, ast.ImportFrom) and n.level >= 1 and n.module == "_ops"
            and any(a.name == "add_op_namespace_prefix" for a in n.names)
            for n in ast.walk(tree)
        )
        if uses_prefix and not imported:
            bad.append(f"{path.relative_to(REPO)}: add_op_namespace_prefix not imported from ._ops")
    assert not bad, "registrations must take their name from add_op_namespace_prefix(...):\n" + "\n".join(bad)
    assert found, "no torch.library registration found (the contract requires the gemm op)"


_ALLOWED_TOP_LEVEL = {"torch", "triton"} | set(sys.stdlib_module_names)


@pytest.mark.kernels_ci
def test_imports_are_relative_or_allowed():
    # The loader imports the variant under its metadata id, so absolute imports of the package
    # break, and third-party modules other than torch/triton are not installed with the kernel.
    bad = []
    for path in SOURCES:
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            bad += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names
                    if n.split(".")[0] not in _ALLOWED_TOP_LEVEL]
    assert not bad, "imports must be relative or of torch / triton / the standard library:\n" + "\n".join(bad)


@pytest.mark.kernels_ci
def test_ops_import_not_guarded():
    # The builder rejects try/except around the ._ops import (it would hide a broken build).
    bad = []
    for path in SOURCES:
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Try):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.ImportFrom) and inner.level >= 1 and (
                        inner.module == "_ops" or (inner.module is None and any(a.name == "_ops" for a in inner.names))
                    ):
                        bad.append(f"{path.relative_to(REPO)}:{inner.lineno}")
    assert not bad, "._ops import inside try/except:\n" + "\n".join(bad)


def _gemm_op(module):
    """The registered gemm op, or a skip while the package does not register it yet."""
    namespace = getattr(getattr(module, "_ops", None), "ops", None) or getattr(torch.ops, module.__name__)
    try:
        return namespace.gemm
    except AttributeError:
        pytest.skip(f"op {module.__name__}::gemm is not registered (yet)")


@pytest.mark.kernels_ci
@pytest.mark.parametrize("case", ["asym", "sym", "act_order"])
def test_opcheck_gemm(w4a16, case):
    op = _gemm_op(w4a16)
    torch.manual_seed(0)
    k, n, g = 256, 48, 128
    packed, scales, zeros = w4a16.quantize_weight_int4_grouped(torch.randn(k, n), g, symmetric=case == "sym")
    # act-order: a shuffled g_idx gives a non-trivial row permutation (the op's `perm` argument).
    g_idx = torch.randperm(k) // g if case == "act_order" else None
    wt = w4a16.prepare_weight(packed, scales, zeros, g, g_idx=g_idx)
    assert (wt.zeros is None) == (case == "sym") and (wt.perm is not None) == (case == "act_order")
    x = torch.randn(3, k, dtype=torch.float16)
    torch.library.opcheck(op, (x, wt.qweight, wt.scales, wt.zeros, wt.perm, wt.in_features, wt.group_size, "auto"))
