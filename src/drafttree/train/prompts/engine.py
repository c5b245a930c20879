"""The small template language of the generated prompts (the JSON files in ``data/``).

**Expressions** use Python expression syntax, limited to: constants, names, lists and tuples, arithmetic
(``+ - * / // %``), comparisons, ``and``/``or``/``not``, ``x if c else y``, indexing and slicing, list
comprehensions, f-strings, the attributes of a person (``p.name``, ``p.he``, ``p.him``, ``p.his``, ``p.He``,
``p.His``) and calls of the functions in :data:`FUNCTIONS` (keyword arguments allowed). Anything else (other
attributes, methods, lambdas, unknown functions) is rejected when the data is loaded. Names are the variables
set so far and the lists of the data file.

**Templates** are text with ``{expression}`` or ``{expression:format-spec}`` fields; ``{{`` and ``}}`` are
literal braces.

**Steps** (a word problem, a section of chat requests) run in order; each is an object with

* ``"if"``: an expression; when false the step is skipped;
* ``"let"``: ``{"target": "expression", ...}`` evaluated in order (a target may unpack: ``"a, b"``);
* ``"say"``: a template, or a list of templates: all are rendered in order, then one is drawn with
  ``choice``. Reaching a ``say`` ends the steps with its text.

Random draws (``random``, ``randint``, ``randrange``, ``uniform``, ``choice``, ``sample``, ``person``) call the
generator exactly where they stand, left to right, so a seed always gives the same text.
"""

from __future__ import annotations

import ast
import operator
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from drafttree.train.prompts.helpers import PERSON_FIELDS, Person, amount, clock, money, num


class TemplateError(ValueError):
    """A malformed expression, template or step, or one that fails when run."""


class Scope:
    """Variables (``vars``), the data file's lists (``data``) and the random generator of one run."""

    def __init__(self, data: Mapping[str, Any], rng: random.Random | None = None, vars: dict | None = None):
        self.data, self.rng, self.vars = data, rng, dict(vars or {})

    def lookup(self, name: str) -> Any:
        if name in self.vars:
            return self.vars[name]
        if name in self.data:
            return self.data[name]
        raise TemplateError(f"unknown name {name!r}")

    def child(self, **values: Any) -> Scope:
        return Scope(self.data, self.rng, {**self.vars, **values})

    def draw(self) -> random.Random:
        if self.rng is None:
            raise TemplateError("a random draw where no random generator is set")
        return self.rng


# ---------------------------------------------------------------------------------------------- functions


def person(scope: Scope, exclude: Any = ()) -> Person:
    """A random person from ``NAMES_F`` / ``NAMES_M`` (half each), never one named in ``exclude``."""
    rng, exclude = scope.draw(), set(exclude)
    while True:
        if rng.random() < 0.5:
            p = Person(rng.choice(scope.lookup("NAMES_F")), "she", "her", "her")
        else:
            p = Person(rng.choice(scope.lookup("NAMES_M")), "he", "him", "his")
        if p.name not in exclude:
            return p


def fill(scope: Scope, template: str, **values: Any) -> str:
    """Render a template held in a variable or a list, with the current variables (plus ``values``)."""
    return render(template, scope.child(**values) if values else scope)


def _pure(fn: Callable) -> Callable:
    return lambda scope, *args, **kwargs: fn(*args, **kwargs)


FUNCTIONS: dict[str, Callable] = {
    # random draws, in the order they are written
    "random": lambda s: s.draw().random(),
    "randint": lambda s, a, b: s.draw().randint(a, b),
    "randrange": lambda s, *args: s.draw().randrange(*args),
    "uniform": lambda s, a, b: s.draw().uniform(a, b),
    "choice": lambda s, seq: s.draw().choice(seq),
    "sample": lambda s, seq, k: s.draw().sample(seq, k),
    "person": person,
    # text
    "fill": fill,
    "fraction": lambda s, pair: s.lookup("FRACTION_WORDS")["/".join(map(str, pair))],
    "an": _pure(lambda noun: ("an " if noun[:1].lower() in "aeiou" else "a ") + noun),
    "cap": _pure(str.capitalize),
    "upper_first": _pure(lambda text: text[:1].upper() + text[1:]),
    "lower": _pure(str.lower),
    "replace": _pure(str.replace),
    "join": _pure(lambda items, sep=", ": sep.join(map(str, items))),
    "plural": _pure(lambda n, word: f"{n} {word}" if n == 1 else f"{n} {word}s"),
    "money": _pure(money),
    "num": _pure(num),
    "clock": _pure(clock),
    "amount": _pure(amount),
    "first": _pure(lambda items, default=None: next(iter(items), default)),
    # plain Python builtins
    **{f.__name__: _pure(f) for f in (abs, divmod, enumerate, int, len, max, min, range, round, str, sum)},
}

# ---------------------------------------------------------------------------------------------- expressions

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_UNOPS = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
_CMPOPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
           ast.NotIn: lambda a, b: a not in b}
Compiled = Callable[[Scope], Any]


def _op(table: dict, op: ast.AST) -> Callable:
    if type(op) not in table:
        raise TemplateError(f"operator {type(op).__name__} is not allowed")
    return table[type(op)]


def bind(target: ast.expr, value: Any, out: dict) -> None:
    """Assign ``value`` to a name, or unpack it into a tuple of targets."""
    if isinstance(target, ast.Name):
        out[target.id] = value
        return
    values = list(value)
    if len(values) != len(target.elts):
        raise TemplateError(f"cannot unpack {len(values)} values into {ast.unparse(target)}")
    for t, v in zip(target.elts, values):
        bind(t, v, out)


def check_target(target: ast.expr) -> ast.expr:
    if isinstance(target, (ast.Tuple, ast.List)):
        for t in target.elts:
            check_target(t)
    elif not isinstance(target, ast.Name):
        raise TemplateError(f"cannot assign to {ast.unparse(target)}")
    return target


def _compile_comprehension(node: ast.ListComp) -> Compiled:
    loops = [(check_target(g.target), _compile(g.iter), [_compile(c) for c in g.ifs]) for g in node.generators]
    elt = _compile(node.elt)

    def run(scope: Scope, depth: int, out: list) -> None:
        target, items, conds = loops[depth]
        for item in items(scope):
            bind(target, item, scope.vars)
            if not all(c(scope) for c in conds):
                continue
            if depth + 1 < len(loops):
                run(scope, depth + 1, out)
            else:
                out.append(elt(scope))

    def comprehension(scope: Scope) -> list:
        out: list = []
        run(scope.child(), 0, out)
        return out

    return comprehension


def _compile_call(node: ast.Call) -> Compiled:
    if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
        raise TemplateError(f"call of {ast.unparse(node.func)!r} is not allowed (known: {', '.join(FUNCTIONS)})")
    if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        raise TemplateError("*args and **kwargs are not allowed")
    fn, args = FUNCTIONS[node.func.id], [_compile(a) for a in node.args]
    kwargs = {k.arg: _compile(k.value) for k in node.keywords}
    return lambda s: fn(s, *[a(s) for a in args], **{k: v(s) for k, v in kwargs.items()})


def _compile(node: ast.AST) -> Compiled:  # noqa: C901 - one branch per allowed node type
    if isinstance(node, ast.Constant):
        value = node.value
        return lambda s: value
    if isinstance(node, ast.Name):
        name = node.id
        return lambda s: s.lookup(name)
    if isinstance(node, (ast.List, ast.Tuple)):
        parts, make = [_compile(e) for e in node.elts], list if isinstance(node, ast.List) else tuple
        return lambda s: make(p(s) for p in parts)
    if isinstance(node, ast.BinOp):
        op, left, right = _op(_BINOPS, node.op), _compile(node.left), _compile(node.right)
        return lambda s: op(left(s), right(s))
    if isinstance(node, ast.UnaryOp):
        op, operand = _op(_UNOPS, node.op), _compile(node.operand)
        return lambda s: op(operand(s))
    if isinstance(node, ast.BoolOp):
        values, is_and = [_compile(v) for v in node.values], isinstance(node.op, ast.And)

        def boolop(s: Scope) -> Any:
            for v in values:
                result = v(s)
                if bool(result) != is_and:
                    return result
            return result

        return boolop
    if isinstance(node, ast.Compare):
        first, ops = _compile(node.left), [(_op(_CMPOPS, o), _compile(c)) for o, c in zip(node.ops, node.comparators)]

        def compare(s: Scope) -> bool:
            left = first(s)
            for op, right in ops:
                value = right(s)
                if not op(left, value):
                    return False
                left = value
            return True

        return compare
    if isinstance(node, ast.IfExp):
        test, body, orelse = _compile(node.test), _compile(node.body), _compile(node.orelse)
        return lambda s: body(s) if test(s) else orelse(s)
    if isinstance(node, ast.Subscript):
        value, index = _compile(node.value), _compile(node.slice)
        return lambda s: value(s)[index(s)]
    if isinstance(node, ast.Slice):
        bounds = [_compile(b) if b is not None else (lambda s: None) for b in (node.lower, node.upper, node.step)]
        return lambda s: slice(*(b(s) for b in bounds))
    if isinstance(node, ast.Attribute):
        value, attr = _compile(node.value), node.attr
        if attr not in PERSON_FIELDS:
            raise TemplateError(f"attribute .{attr} is not allowed (only a person's {sorted(PERSON_FIELDS)})")
        return lambda s: getattr(_as_person(value(s)), attr)
    if isinstance(node, ast.Call):
        return _compile_call(node)
    if isinstance(node, ast.ListComp):
        return _compile_comprehension(node)
    if isinstance(node, ast.JoinedStr):
        return _compile_parts([v.value if isinstance(v, ast.Constant) else _compile_field(v) for v in node.values])
    raise TemplateError(f"{type(node).__name__} is not allowed in an expression")


def _compile_field(node: ast.FormattedValue) -> Compiled:
    if node.conversion != -1:
        raise TemplateError("!r, !s and !a conversions are not allowed")
    value = _compile(node.value)
    spec = _compile(node.format_spec) if node.format_spec else (lambda s: "")
    return lambda s: format(value(s), spec(s))


def _as_person(value: Any) -> Person:
    if not isinstance(value, Person):
        raise TemplateError(f"attributes are only allowed on a person, not on {type(value).__name__}")
    return value


@cache
def compile_expression(text: str) -> Compiled:
    """Parse and check ``text`` once; the result evaluates it in a :class:`Scope`."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise TemplateError(f"bad expression {text!r}: {e.msg}") from None
    try:
        return _compile(tree.body)
    except TemplateError as e:
        raise TemplateError(f"in expression {text!r}: {e}") from None


# ---------------------------------------------------------------------------------------------- templates


def _field_end(text: str, start: int) -> tuple[int, int]:
    """Index of the ``}`` closing the field opened before ``start``, and of its format-spec colon (or -1)."""
    depth, quote, colon, i = 0, "", -1, start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]" or (ch == "}" and depth):
            depth -= 1
        elif ch == "}":
            return i, colon
        elif ch == ":" and depth == 0 and colon < 0:
            colon = i
        i += 1
    raise TemplateError(f"unclosed '{{' at position {start - 1} in template {text!r}")


def _compile_parts(parts: list) -> Compiled:
    if all(isinstance(p, str) for p in parts):
        text = "".join(parts)
        return lambda s: text
    return lambda s: "".join(p if isinstance(p, str) else p(s) for p in parts)


@cache
def compile_template(text: str) -> Compiled:
    """Parse ``text`` (``{expression}`` fields, ``{{``/``}}`` literal braces) once."""
    parts: list = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "{}" and text[i + 1 : i + 2] == ch:
            parts.append(ch)
            i += 2
        elif ch == "}":
            raise TemplateError(f"single '}}' at position {i} in template {text!r} (write '}}}}')")
        elif ch == "{":
            end, colon = _field_end(text, i + 1)
            expr = text[i + 1 : colon if colon >= 0 else end]
            if not expr.strip():
                raise TemplateError(f"empty field at position {i} in template {text!r}")
            value, spec = compile_expression(expr), text[colon + 1 : end] if colon >= 0 else ""
            parts.append(lambda s, value=value, spec=spec: format(value(s), spec))
            i = end + 1
        else:
            j = min((k for k in (text.find("{", i), text.find("}", i)) if k >= 0), default=len(text))
            parts.append(text[i:j])
            i = j
    return _compile_parts(parts)


def render(text: str, scope: Scope) -> str:
    return compile_template(text)(scope)


# ---------------------------------------------------------------------------------------------- steps

_STEP_KEYS = frozenset({"if", "let", "say"})


@dataclass(frozen=True)
class Step:
    cond: Compiled | None
    lets: tuple[tuple[ast.expr, Compiled], ...]
    say: tuple[Compiled, ...]
    choose: bool  # "say" was a list: draw one of the rendered texts


def compile_steps(steps: Any, where: str) -> tuple[Step, ...]:
    """Check and compile a list of steps; errors name ``where`` (e.g. the data file and entry)."""
    if not isinstance(steps, (list, tuple)) or not steps:
        raise TemplateError(f"{where}: steps must be a non-empty list")
    out = []
    for n, step in enumerate(steps):
        here = f"{where}, step {n + 1}"
        try:
            if not isinstance(step, Mapping) or not step.keys() & {"let", "say"} or step.keys() - _STEP_KEYS:
                raise TemplateError(f"a step is an object with 'let' and/or 'say' (and 'if'), got {step!r}")
            lets = tuple((check_target(ast.parse(t, mode="eval").body), compile_expression(e))
                         for t, e in step.get("let", {}).items())
            say = step.get("say", ())
            texts = (say,) if isinstance(say, str) else tuple(say)
            if not all(isinstance(t, str) for t in texts) or ("say" in step and not texts):
                raise TemplateError(f"'say' takes a template or a non-empty list of them, got {say!r}")
            cond = compile_expression(step["if"]) if "if" in step else None
            out.append(Step(cond, lets, tuple(compile_template(t) for t in texts), not isinstance(say, str)))
        except (TemplateError, SyntaxError) as e:
            raise TemplateError(f"{here}: {e}") from None
    if not out[-1].say or out[-1].cond is not None:
        raise TemplateError(f"{where}: the last step must be an unconditional 'say'")
    return tuple(out)


def run_steps(steps: tuple[Step, ...], scope: Scope) -> str:
    """Run compiled steps; returns the text of the first ``say`` reached."""
    for step in steps:
        if step.cond is not None and not step.cond(scope):
            continue
        for target, value in step.lets:
            bind(target, value(scope), scope.vars)
        if step.say:
            texts = [t(scope) for t in step.say]
            return scope.draw().choice(texts) if step.choose else texts[0]
    raise TemplateError("no 'say' step was reached")
