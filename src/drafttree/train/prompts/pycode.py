"""Code prompts from Python sources: documented functions and single interesting lines of the stdlib."""

from __future__ import annotations

import ast
import random
import sysconfig
import textwrap
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from drafttree.train.prompts.core import Candidate, fill_text, load_data, rng_for

_C = load_data("code")["lists"]


@dataclass(frozen=True)
class PyFunction:
    module: str
    qualname: str
    stub: str  # decorators + signature + docstring
    full: str  # whole source
    no_doc: str  # whole source without the docstring


def extract_functions(source: str, module: str, min_body: int = 2, max_lines: int = 50,
                      max_chars: int = 1800) -> list[PyFunction]:
    """Documented functions and methods of a Python module, as stub / full / docstring-less source."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    out: list[PyFunction] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                fn = _function(child, prefix)
                if fn is not None:
                    out.append(fn)

    def _function(node: ast.FunctionDef | ast.AsyncFunctionDef, prefix: str) -> PyFunction | None:
        doc = ast.get_docstring(node)
        if not doc or len(doc) < 20 or node.name.startswith("test") or len(node.body) < 1 + min_body:
            return None
        start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
        end = node.end_lineno or node.lineno
        if end - start > max_lines:
            return None
        doc_node = node.body[0]
        full = textwrap.dedent("\n".join(lines[start:end]))
        if len(full) > max_chars or "\t" in full:
            return None
        stub = textwrap.dedent("\n".join(lines[start : doc_node.end_lineno]))
        body_lines = lines[start : doc_node.lineno - 1] + lines[doc_node.end_lineno : end]
        no_doc = textwrap.dedent("\n".join(body_lines))
        return PyFunction(module, prefix + node.name, stub, full, no_doc)

    visit(tree, "")
    return out


def code_prompt(fn: PyFunction, rng: random.Random) -> str:
    """One varied code request about ``fn``: implement it (most often), explain it, test it, port it..."""
    r = rng.random()
    where = ""
    if "." in fn.qualname:
        where = fill_text(_C["METHOD_WHERE"], qualname=fn.qualname, module=fn.module)
    if r < 0.45:
        instr, code = rng.choice(_C["IMPLEMENT"]), fn.stub
        if where:
            instr = instr.rstrip(".") + where + "."
    elif r < 0.70:
        instr, code = fill_text(rng.choice(_C["EXPLAIN"]), module=fn.module), fn.full
    else:
        kind, instr = rng.choice(_C["OTHER_CODE"])
        code = fn.no_doc if kind == "docstring" else fn.full
    block = f"```python\n{code}\n```" if rng.random() < 0.7 else code
    return f"{block}\n\n{instr}" if rng.random() < 0.2 else f"{instr}\n\n{block}"


def build_code_prompts(
    functions: Iterable[PyFunction], seed: int = 0, per_module: int = 25
) -> list[Candidate]:
    """At most ``per_module`` functions per module (seeded pick), one prompt each."""
    by_mod: dict[str, list[PyFunction]] = defaultdict(list)
    for fn in functions:
        by_mod[fn.module].append(fn)
    out = []
    for mod in sorted(by_mod):
        fns = sorted(by_mod[mod], key=lambda f: f.qualname)
        rng = rng_for(seed, "stdlib", mod)
        for fn in rng.sample(fns, min(per_module, len(fns))):
            key = f"{mod}.{fn.qualname}"
            out.append(Candidate("stdlib", "code", key, code_prompt(fn, rng_for(seed, "stdlib", key))))
    return out


def _interesting_line(node: ast.stmt) -> bool:
    kinds = (ast.ListComp, ast.DictComp, ast.SetComp, ast.GeneratorExp, ast.Lambda, ast.IfExp, ast.JoinedStr)
    for sub in ast.walk(node):
        if isinstance(sub, kinds):
            return True
        if isinstance(sub, ast.Slice) and (sub.step is not None or (sub.lower is not None and sub.upper is not None)):
            return True
    return False


def build_code_line_prompts(functions: Iterable[PyFunction], seed: int = 0, per_module: int = 3,
                            min_chars: int = 30, max_chars: int = 160) -> list[Candidate]:
    """"What does this line do?" prompts for single-line statements with comprehensions, slices, lambdas..."""
    by_mod: dict[str, list[str]] = defaultdict(list)
    for fn in functions:
        try:
            tree = ast.parse(fn.full)
        except SyntaxError:
            continue
        lines = fn.full.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Assign, ast.AugAssign, ast.Return, ast.Expr, ast.AnnAssign)):
                continue
            if node.lineno != node.end_lineno or not _interesting_line(node):
                continue
            line = lines[node.lineno - 1].strip()
            if min_chars <= len(line) <= max_chars and '"""' not in line:
                by_mod[fn.module].append(line)
    out = []
    for mod in sorted(by_mod):
        lines = sorted(set(by_mod[mod]))
        rng = rng_for(seed, "stdlib/lines", mod)
        for line in rng.sample(lines, min(per_module, len(lines))):
            ask = fill_text(rng.choice(_C["LINE_ASKS"]), module=mod)
            out.append(Candidate("stdlib/lines", "code", f"{mod}:{line}", f"{ask}\n\n```python\n{line}\n```"))
    return out


def stdlib_functions(show_progress: bool = True) -> list[PyFunction]:
    """Documented functions of the running interpreter's standard library (tests, IDLE, ... left out)."""
    root = Path(sysconfig.get_path("stdlib"))
    skip = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages", "ensurepip",
            "pydoc_data", "encodings", "__pycache__", "tkinter", "distutils", "venv", "msilib"}
    files = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if any(part in skip or part.startswith("config-") for part in rel.parts[:-1]):
            continue
        if rel.name.startswith("test_") or rel.name == "__main__.py":
            continue
        files.append((p, rel))
    out: list[PyFunction] = []
    for p, rel in tqdm(files, desc="parsing stdlib", unit="file", disable=not show_progress):
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        try:
            src = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        out.extend(extract_functions(src, module))
    return out
