"""Reset a module's state at the start of each pass, with the method its class has for it."""
from __future__ import annotations

import ast

from ..model import Fix
from ..reading import source as src
from .edits import insert_lines_before


def reset_method(class_node: ast.ClassDef, attribute: str) -> tuple[ast.FunctionDef, ast.stmt] | None:
    """(method, statement) for a method of the class, called without arguments, that gives
    `self.<attribute>` a fresh value (`def reset(self): self.v = self.v_reset`)."""
    expression = f"self.{attribute}"
    for method in class_node.body:
        if not isinstance(method, ast.FunctionDef) or method.name in ("__init__", "forward") \
                or len(method.args.args) != 1 or method.args.vararg or method.decorator_list:
            continue
        for stmt in method.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                    and src.canonical(stmt.targets[0]) == expression and not src.reads(stmt.value, expression):
                return method, stmt
    return None


def same_as_initial(class_node: ast.ClassDef, attribute: str, reset: ast.stmt) -> bool:
    """Whether the reset gives the state the value `__init__` gave it (`self.v = v_reset` with
    `self.v_reset = v_reset`, or the same expression): the first pass then runs as before."""
    init = src.method_of(class_node, "__init__")
    if init is None:
        return False
    expression = f"self.{attribute}"
    initial = [s.value for s in init.body if isinstance(s, ast.Assign) and len(s.targets) == 1
               and src.canonical(s.targets[0]) == expression]
    if len(initial) != 1:
        return False
    given, first = src.canonical(reset.value), src.canonical(initial[0])
    if given == first:
        return True
    # `self.v_reset`, set in `__init__` from the very name the state started from.
    return any(isinstance(s, ast.Assign) and len(s.targets) == 1 and src.canonical(s.targets[0]) == given
               and src.canonical(s.value) == first for s in init.body)


def reset_each_pass(source: src.Source, before: ast.stmt, root: str, class_name: str, method: str,
                    keeps_first_pass: bool) -> Fix:
    """Before the pass's forward: `for module in model.modules(): if isinstance(module, Neuron):
    module.reset()`. Each pass then starts from a fresh state, as the first one did."""
    lines = [f"for module in {root}.modules():",
             f"    if isinstance(module, {class_name}):",
             f"        module.{method}()"]
    return Fix(f"Reset every `{class_name}` of `{root}` (`{method}()`) before each forward: its state is "
               f"updated within a pass, so each pass has to start from a fresh one rather than carry the "
               f"last one's history", (insert_lines_before(source, before, lines),),
               "safe" if keeps_first_pass else "unsafe")
