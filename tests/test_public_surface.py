"""The public surface: every library module names it in ``__all__``, and no module uses another's
private names.

Read from the source (no imports), so it costs nothing: a module that imports a name its owner
does not list in ``__all__``, or reaches for an underscore name of another module, fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("compressors", "allreducers", "syncbench", "trainreport")
#: Code that imports the library: the trainer, its data and models, the scripts and examples.
USERS = ("trainer", "datasets", "models", "scripts", "examples")
#: Underscore names of the standard library that are its documented API.
STANDARD = {("os", "_exit")}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def library_modules() -> dict[str, Path]:
    return {module_name(p): p for top in LIBRARY for p in sorted((ROOT / top).rglob("*.py"))}


def top_level(body: list) -> list:
    """The module's statements, with those inside a top-level ``try`` or ``if``."""
    nodes = []
    for node in body:
        nodes.append(node)
        if isinstance(node, ast.Try):
            nodes += top_level(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                nodes += top_level(handler.body)
        elif isinstance(node, ast.If):
            nodes += top_level(node.body + node.orelse)
    return nodes


def defined_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in top_level(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def declared_all(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value:
            return [ast.literal_eval(e) for e in node.value.elts]
    return None


def absolute(module: str, node: ast.ImportFrom, path: Path) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def test_every_library_module_declares_its_surface():
    missing, unknown = [], []
    for name, path in library_modules().items():
        tree = ast.parse(path.read_text())
        names = declared_all(tree)
        if names is None:
            missing.append(name)
            continue
        undefined = sorted(set(names) - defined_names(tree))
        if undefined:
            unknown.append(f"{name}: {undefined}")
    assert not missing, f"modules without __all__: {missing}"
    assert not unknown, f"__all__ names a module does not define: {unknown}"


def test_no_module_uses_another_modules_private_or_unlisted_names():
    modules = library_modules()
    surface = {name: declared_all(ast.parse(p.read_text())) or [] for name, p in modules.items()}
    files = [p for top in LIBRARY + USERS for p in sorted((ROOT / top).rglob("*.py"))]
    files.append(ROOT / "main_trainer.py")
    problems = []
    for path in files:
        module = module_name(path)
        tree = ast.parse(path.read_text())
        imported = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    imported[(alias.asname or alias.name).split(".")[0]] = alias.name
            elif isinstance(node, ast.ImportFrom):
                source = absolute(module, node, path)
                for alias in node.names:
                    imported[alias.asname or alias.name] = f"{source}.{alias.name}"
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        problems.append(f"{where} imports {source}.{alias.name}")
                    elif (
                        source in surface
                        and source != module
                        and f"{source}.{alias.name}" not in modules
                        and alias.name not in surface[source]
                    ):
                        problems.append(f"{where} imports {source}.{alias.name}, not in __all__")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and node.value.id in imported
                and (imported[node.value.id], node.attr) not in STANDARD
            ):
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                problems.append(f"{where} uses {node.value.id}.{node.attr}")
    assert not problems, "\n".join(problems)
