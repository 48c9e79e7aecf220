"""Run a forward that one method made again, before another method back-propagates through it."""
from __future__ import annotations

import ast

from ..model import Edit, Fix, Location
from ..reading import source as src
from ..reading.source import Source
from .edits import insert_lines_before

_RANDOM = ("rand", "randn", "randint", "randn_like", "rand_like", "normal", "normal_", "bernoulli", "multinomial",
           "dropout", "uniform_")


def rerun_forward(source: Source, maker: ast.FunctionDef, first: ast.stmt, caller_source: Source,
                  caller: ast.stmt, receiver: str, user: str, deterministic: bool) -> Fix | None:
    """TimeGAN's `gen_batch` draws a batch, then runs every network on it (`self.H =
    self.embedder(self.X)` on); `train_embedder` back-propagates through `self.H` after
    `train_generator`'s backward freed its graph. The forward (from `first`, the first statement
    that makes history, to the end of `maker`) moves into a method of its own that `maker` calls
    where it was, and the caller runs it again before `caller` (`model.train_embedder(...)`): the
    same batch, the weights the last step left, a graph of its own. None when the forward
    cannot stand alone: it reads a local of `maker`, returns, or is not at its top level."""
    body = maker.body
    if first not in body or not maker.args.args or maker.args.args[0].arg != "self":
        return None
    moved = body[body.index(first):]
    if any(isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom)) for stmt in moved for node in ast.walk(stmt)):
        return None
    before = body[:body.index(first)]
    local = {n.id for stmt in before for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    local |= {a.arg for a in (*maker.args.posonlyargs, *maker.args.args[1:], *maker.args.kwonlyargs)}
    if maker.args.vararg or maker.args.kwarg or any(src.names_read(stmt) & local for stmt in moved):
        return None
    class_node = src.parent(maker)
    name = f"{maker.name}_forward"
    if not isinstance(class_node, ast.ClassDef) or any(getattr(m, "name", None) == name for m in class_node.body):
        return None
    indent = source.indent_of(first.lineno)
    def_indent = source.indent_of(maker.lineno)
    lines = [source.line(row) for row in range(first.lineno, moved[-1].end_lineno + 1)]
    text = (f"{indent}self.{name}()\n\n{def_indent}def {name}(self):\n" + "".join(f"{line}\n" for line in lines))
    replaced = Edit(source.filename, text, Location(first.lineno, 1), Location(moved[-1].end_lineno + 1, 1))
    applicability = "safe" if deterministic and not _draws(moved) else "unsafe"
    return Fix(f"Run the forward of `{maker.name}` again before `{user}` back-propagates through it: move lines "
               f"{first.lineno}-{moved[-1].end_lineno} into a method `{name}` that `{maker.name}` calls, and call "
               f"`{receiver}.{name}()` before line {caller.lineno} (the same batch, the weights the last step left)",
               (replaced, insert_lines_before(caller_source, caller, [f"{receiver}.{name}()"])), applicability)


def call_again(source: Source, maker: ast.FunctionDef, caller: ast.stmt, user: str,
               uses: str = "back-propagates through") -> Fix:
    """DRIT's `update_D` runs `self.forward()`, which keeps every output on the model; `update_EG`
    steps the encoders, then `backward_G_alone()` back-propagates through what that forward kept.
    `self.forward()` again before `caller`, as the issue's commenter fixed it: the same inputs,
    the weights the last step left, a graph of its own. Unsafe where the forward draws random
    numbers, itself or in the object's methods it calls (DRIT's `get_z_random`): run again, it
    draws new ones, and the second update trains on other samples than the first."""
    call = f"self.{maker.name}()"
    owner = src.parent(maker)
    called = [m for m in owner.body if isinstance(m, ast.FunctionDef) and m is not maker
              and any(isinstance(n, ast.Call) and src.canonical(n.func) == f"self.{m.name}" for n in ast.walk(maker))] \
        if isinstance(owner, ast.ClassDef) else []
    draws = _draws([*maker.body, *(s for m in called for s in m.body)])
    return Fix(f"Run `{call}` again before `{user}` (line {caller.lineno}), which {uses} what it "
               f"keeps on the object: the optimizer has stepped since it ran, and a fresh forward builds the graph "
               f"with the updated weights", (insert_lines_before(source, caller, [call]),), "unsafe" if draws else "safe")


def _draws(statements: list[ast.stmt]) -> bool:
    """Whether the forward draws random numbers itself: run twice, it would not repeat itself."""
    return any(isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))
               and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) in _RANDOM
               for stmt in statements for node in ast.walk(stmt))
