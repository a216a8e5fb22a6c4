"""The package's imports go one way: the public API (qvattn/__init__.py) >
the op (ops.py) > configs (_config.py) > the binding (_ffi.py).  A module
imports only modules below it, at module level or inside a function, so a
call that enters a lower layer never comes back up into a higher one.  The
integrations (diffusers, comfyui, capture) sit on top of the op layer; the
public API reaches one of them, lazily, for its documented convenience
qvattn.capture(pipe, ...).  Read with ast: needs neither torch nor the
library.
"""
import ast
import os

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.normpath(os.path.join(HERE, "..", "qvattn"))

CORE = ["_ffi", "_config", "ops", "__init__"]  # lowest first
TOP = {"diffusers", "comfyui", "capture"}
# (importer, imported): the lazy exceptions, each inside a function
LAZY_UP = {("__init__", "capture")}


def _modules():
    return sorted(f[:-3] for f in os.listdir(PKG) if f.endswith(".py"))


def _target(node, name, modules):
    """The package module an import names: a submodule, or __init__ for a
    name taken from the package itself (`from . import default_context`)."""
    if isinstance(node, ast.ImportFrom):
        if node.level == 0 and not (node.module or "").startswith("qvattn"):
            return None
        if node.level > 1:
            return "__init__"  # nothing above the package is ours
        parts = (node.module or "").split(".")
        if node.level == 0:
            parts = parts[1:]  # drop "qvattn"
        if parts and parts[0]:
            return parts[0] if parts[0] in modules else "__init__"
        return name if name in modules else "__init__"
    parts = name.split(".")
    if parts[0] != "qvattn":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in modules else "__init__"


def imports_of(mod, modules=None):
    """{(imported module, lazy)}: the package modules `mod` imports; lazy =
    inside a function body."""
    modules = set(modules or _modules())
    with open(os.path.join(PKG, mod + ".py")) as f:
        tree = ast.parse(f.read(), mod + ".py")
    found = set()

    def visit(node, lazy):
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                               ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for alias in child.names:
                    t = _target(child, alias.name, modules)
                    if t is not None and t != mod:
                        found.add((t, inner))
            visit(child, inner)

    visit(tree, False)
    return found


def test_core_imports_go_down():
    rank = {m: i for i, m in enumerate(CORE)}
    bad = []
    for mod in CORE:
        for target, lazy in sorted(imports_of(mod)):
            if target in rank and rank[target] < rank[mod]:
                continue
            if lazy and (mod, target) in LAZY_UP:
                continue
            bad.append(f"{mod} imports {target}" + (" (lazily)" if lazy else ""))
    assert not bad, "imports going back up: " + "; ".join(bad)


def test_binding_imports_nothing_of_ours():
    assert imports_of("_ffi") == set()
    assert {t for t, _ in imports_of("_config")} == {"_ffi"}


def test_integrations_sit_on_top():
    """Nothing below imports an integration, but for the lazy
    qvattn.capture; the integrations may use anything below them."""
    for mod in CORE:
        for target, lazy in imports_of(mod):
            if target in TOP:
                assert lazy and (mod, target) in LAZY_UP, (mod, target)


def test_the_reader_sees_imports():
    """The checks above are not vacuous: known edges are found."""
    assert ("_ffi", False) in imports_of("_config")
    assert {("_config", False), ("_ffi", False)} <= imports_of("ops")
    assert ("ops", True) in imports_of("__init__")
    assert ("capture", True) in imports_of("__init__")
    assert ("ops", False) in imports_of("diffusers")
    # a name taken from the package is an import of __init__
    tree = ast.parse("from . import default_context\nfrom .ops import x\n"
                     "import qvattn.ops\nfrom qvattn import _ffi\n")
    mods = set(_modules())
    got = [_target(n, a.name, mods) for n in tree.body for a in n.names]
    assert got == ["__init__", "ops", "ops", "_ffi"]
