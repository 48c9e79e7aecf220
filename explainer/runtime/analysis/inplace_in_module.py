"""inplace-modified inside a model's forward: `nn.ReLU(inplace=True)` or `out += x` overwrote a
tensor that an earlier operation saved for the backward. The frames of `forward` are gone by
the time the backward fails, so the graph says which operation wrote in place (the node that
consumes the one whose saved tensor changed) and the model's classes say where."""
from __future__ import annotations

import ast
import math
import re

import torch

from ...fixes import out_of_place
from ...fixes.edits import node_start, replace
from ...model import CallSite, Evidence, Finding, Fix
from ...reading import source as src
from ...reading.training import defines_forward
from .. import graph, naming
from ..errors import InplaceDetail, version_facts
from .context import Context
from .evidence import culprit_at, finding
from .locate import class_source

_AUGMENTED = {"add": ast.Add, "sub": ast.Sub, "mul": ast.Mult, "div": ast.Div, "pow": ast.Pow}
_MAX_CLASSES = 32


def explain_inplace_in_module(ctx, walk, failing_key: int | None, detail: InplaceDetail | None) -> Finding | None:
    if failing_key is None:
        return None
    saver = _operation(walk.nodes[failing_key])
    writes, result_saved = _writes_after(ctx, walk, failing_key, detail)
    if not writes:
        return _written_after_it_was_passed(ctx, walk, failing_key, saver, detail)
    # The write into what the saving operation made comes first (QMCTorch's `x = x.prod(-1)`,
    # then `x *= w`, not the `hess_jast *= 0.5` written earlier in the class), then a write into
    # what the saving operation read under another name (RefineNet's `path = x` ... `x += path`,
    # not MultiResolutionFusion's `output += ...` in the same file), then a write into what a call
    # made, where the saver saved its result (CDC's `h = self.block1(x)`, then `h += ...`).
    # Before all that, where the write changed the saver's own result: the write in the class
    # whose module holds the weights the saver's input was made with (fepegar/unet's `x +=
    # connection`, in EncodingBlock and in DecodingBlock alike: the decoder's conv2 fed the ReLU
    # whose output changed). Where the saver saved its input, the weights below it say nothing
    # of where its input was written later.
    owners = _owners(ctx, _nearest_parameters(walk.nodes[failing_key])) if result_saved else {}
    read_ops = {_operation(walk.nodes[key]) for key in _read_by(walk.nodes[failing_key])} if not result_saved else set()
    writes.sort(key=lambda write: (owners.get(id(write[3]), math.inf),
                                   _made_by_saver(write[1], saver, False) is None,
                                   _made_by_one_of(write[1], read_ops) is None,
                                   _writes_what_another_call_made(write, read_ops),
                                   _made_by_saver(write[1], saver, result_saved) is None,
                                   _read_under_alias(write[1]) is None))
    source, stmt, node, _ = writes[0]
    # `c2_ffm += c2` ... `c5_ffm += c5` side by side (mmocr's FPEM_FFM): the graph says only which
    # operation wrote, and the next backward would fail on the next of them, so the fix writes
    # every one of them out of place.
    siblings = [other for other_source, other, _, _ in writes[1:]
                if other_source is source and isinstance(other, ast.AugAssign) and isinstance(stmt, ast.AugAssign)
                and type(other.op) is type(stmt.op) and src.enclosing_block(other) is src.enclosing_block(stmt)]
    if siblings:
        group = [stmt, *siblings]
        index = _which_write(walk, failing_key, len(group))
        if index is None and not result_saved:
            index = _which_saver(walk, failing_key, len(group))
        if index is None and not result_saved:
            index = _which_by_rank(walk, failing_key, group)
        if index is not None:
            stmt = node = group[index]
            siblings = group[:index] + group[index + 1:]
    # The same write in another class of the model (the encoder's and the decoder's residual
    # sum): the next backward would fail on it, so the fix writes it out of place too.
    copies = [(other_source, other) for other_source, other, _, _ in writes
              if other is not stmt and isinstance(other, ast.AugAssign) and isinstance(stmt, ast.AugAssign)
              and other_source.segment(other) == source.segment(stmt) and src.parent(other) is not src.parent(stmt)]
    # The copies are blocks of one function run one after the other (neural_clbf's linearized
    # and simulated descent loops, each `violation *= condition_active` after its `F.relu`): the
    # backward fails on the write that ran last, the first it reaches.
    scope = src.enclosing_function(stmt)
    if copies and scope is not None and all(other_source is source and src.enclosing_function(other) is scope
                                            for other_source, other in copies):
        group = sorted([stmt, *(other for _, other in copies)], key=lambda s: s.lineno)
        index = _which_copy(walk, failing_key, len(group))
        if index is not None:
            stmt = node = group[index]
            copies = [(source, other) for other in group if other is not stmt]
    # Elsewhere, writes of the same kind that pass their own target to a call (smee's angle, beside
    # its torsion): each fails the next backward once this one is fixed.
    covered = {id(stmt), *(id(other) for other in siblings), *(id(other) for _, other in copies)}
    alike = [(other_source, other) for other_source, other, _, _ in writes
             if id(other) not in covered and _reads_itself(stmt) and _reads_itself(other)
             and type(other.op) is type(stmt.op)] if not result_saved else []
    # What the saver read, its weights left out (a linear layer's `weight.t()`).
    made_by = {_operation(walk.nodes[key]) for key in _read_by(walk.nodes[failing_key])
               if not _of_parameters(walk.nodes[key])} if not result_saved else set()
    return _finding(ctx, source, stmt, node, saver, detail, siblings, result_saved, copies, alike, made_by)


def _of_parameters(node) -> bool:
    """A parameter's node, or a view of parameters only (`weight.t()`)."""
    if getattr(node, "variable", None) is not None:
        return True
    inputs = _inputs(node)
    return graph.is_view(node) and bool(inputs) and all(getattr(child, "variable", None) is not None
                                                        for child in inputs)


def _nearest_parameters(node, limit: int = 64) -> set[int]:
    """The parameters (by id) nearest below `node`: those of the first level of the graph under
    it that reaches any, breadth-first, `limit` nodes at most."""
    level, seen, found = [node], set(), set()
    while level and not found and len(seen) < limit:
        below = []
        for current in level:
            for child in _inputs(current):
                if id(child) in seen:
                    continue
                seen.add(id(child))
                variable = getattr(child, "variable", None)
                if variable is not None:
                    found.add(id(variable))
                below.append(child)
        level = below
    return found


def _owners(ctx, parameters: set[int]) -> dict[int, int]:
    """For each of the user's module classes (by id of its definition) whose modules hold one
    of `parameters`: how many parameters the smallest such module holds (the innermost first)."""
    owners: dict[int, int] = {}
    if not parameters:
        return owners
    for _, module, _ in naming.module_bindings(ctx.frames):
        for sub in module.modules():
            if type(sub).__module__.startswith("torch"):
                continue
            held = [id(p) for p in sub.parameters()]
            if parameters.isdisjoint(held):
                continue
            _, class_node = class_source(sub)
            if class_node is not None:
                owners[id(class_node)] = min(owners.get(id(class_node), math.inf), len(held))
    return owners


def _writes_after(ctx, walk, failing_key: int, detail: InplaceDetail | None) -> tuple[list, bool]:
    """The in-place writes in the model's classes that could have changed what the failing node
    saved, and whether it saved its own result: one of the operations that consume it (it did),
    else one that consumes what it read (it saved its input: `x += path` after a max-pool read
    `x`). Its input first where the error names a shape other than its result's (torchaudio's
    norm, whose input `angles.div_` and whose result `.add_(1e-16)` both changed)."""
    tiers = [([failing_key], True), (_read_by(walk.nodes[failing_key]), False)]
    if detail is not None and _output_shape(walk.nodes[failing_key]) not in (None, tuple(detail.shape)):
        tiers.reverse()
    # Written in place through a view (x-transformers' `x += self.pos_emb(x)` on the LSTM's
    # batch-first output), the write is recorded as CopySlices, which keeps no name of the
    # operation: any augmented write could be it, where no named operation's write is found
    # (Glow's `z2 += ...` into a slice is found by the addition beside it).
    for anonymous in (False, True):
        for around, result_saved in tiers:
            consumers = [walk.nodes[key] for near in around for key in walk.consumers.get(near, ())
                         if key != failing_key and key not in around]
            writers = {_operation(node) for node in consumers}
            if anonymous:
                writers = set(_AUGMENTED) if any(type(node).__name__ == "CopySlices" for node in consumers) else set()
            writers.discard(None)
            writes = list(_writes_in_model_classes(ctx, writers)) if writers else []
            if not writes and writers:
                # No model class writes so: the user's own functions (smee's valence energies, called
                # through a registry, `x /= torch.norm(x, dim=1).unsqueeze(1)`).
                writes = list(_writes_in(_functions_of_frames(ctx), writers))
            if writes:
                return writes, result_saved
    return [], False


# What the error calls a tensor that cannot have a gradient, so has no node in the graph: an
# integer or boolean target, saved by the loss it was passed to.
_INTEGRAL = ("Long", "Int", "Short", "Char", "Byte", "Bool")


def _written_after_it_was_passed(ctx, walk, failing_key: int, saver: str | None,
                                 detail: InplaceDetail | None) -> Finding | None:
    """SWEP's question-answering head, run twice on the same positions: it clamps them in place
    (`end_positions.clamp_(0, ignored_index)`), then passes them to the loss, which saves them;
    the second run's clamp changes what the first run's loss saved. An integer tensor has no
    node in the graph to say what wrote it: the writes are the in-place calls of the model's
    classes on a name that the same function then passes to a call. Side by side (the start's
    and the end's clamp), the failing node's place among the nodes of its type whose saved
    tensors changed is the write's place among them, and every one of them goes out of place."""
    if detail is None or not any(f".{kind}Tensor" in detail.tensor_type for kind in _INTEGRAL):
        return None
    groups: dict[int, list] = {}
    for source, scope in [*_model_classes(ctx), *_functions_of_frames(ctx)]:
        for function in (n for n in src.all_nodes(scope) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for stmt in src.own_nodes(function):
                passed = _passed_after(function, stmt)
                if passed is not None:
                    groups.setdefault(id(src.enclosing_block(stmt)), []).append((source, stmt, passed))
    failing = walk.nodes[failing_key]
    changed = sorted(seq for key, seq in walk.seq.items()
                     if type(walk.nodes[key]) is type(failing) and graph.changed_saved(walk.nodes[key]) is not None)
    index = changed.index(walk.seq[failing_key]) if walk.seq[failing_key] in changed else None
    found = [group for group in groups.values() if len(group) == len(changed)]
    if index is None or len(found) != 1:
        return None
    group = sorted(found[0], key=lambda write: write[1].lineno)
    source, stmt, passed = group[index]
    return _finding(ctx, source, stmt, stmt.value, saver, detail, [other for _, other, _ in group if other is not stmt],
                    passed_after=passed)


def _passed_after(function: ast.AST, stmt: ast.stmt) -> ast.stmt | None:
    """Where `stmt`, an in-place call on a name (`end_positions.clamp_(0, n)`) with an
    out-of-place twin, is followed in `function` by a call given that name (`loss_fct(logits,
    end_positions)`): the first such statement."""
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name)
            and call.func.attr.endswith("_") and not call.func.attr.endswith("__")
            and out_of_place.has_twin(call.func.attr)):
        return None
    name = call.func.value.id
    return _first_passing(function, stmt.end_lineno, math.inf, lambda arg: isinstance(arg, ast.Name) and arg.id == name)


def _output_shape(node) -> tuple[int, ...] | None:
    """The shape of what `node`'s operation made, where the node tells."""
    try:
        return tuple(node._input_metadata[0].shape)
    except (AttributeError, IndexError, RuntimeError, TypeError):
        return None


def _read_by(node) -> list[int]:
    """The nodes whose results `node` read (by key), and, through a view it read
    (`self.pos_conv(x.transpose(1, 2))`), the node whose result the view is of; through views of
    views too (fast-transformers' `torch.einsum(..., Q, Si, Z)`, whose bmm read `Si` permuted,
    then reshaped)."""
    read = []
    for child in _inputs(node):
        read.append(id(child))
        views = [child] if graph.is_view(child) else []
        while views:
            below = _inputs(views.pop())
            read.extend(id(grandchild) for grandchild in below if id(grandchild) not in read)
            views.extend(grandchild for grandchild in below if graph.is_view(grandchild))
    return read


def _inputs(node) -> list:
    return [child for child, _ in getattr(node, "next_functions", ()) if child is not None]


def _writer(walk, failing_key: int):
    """The node that consumes the failing one: the in-place write recorded over what it saved."""
    return next((walk.nodes[key] for key in walk.consumers.get(failing_key, ())), None)


def _which_write(walk, failing_key: int, count: int) -> int | None:
    """Which of `count` in-place writes, side by side in the source, changed the saved tensor.
    Run one after another, they record their nodes with consecutive sequence numbers: the
    position of the one that consumes the failing node in that run of nodes of its type is its
    position in the source. None unless the run is exactly `count` long."""
    by_seq = {seq: walk.nodes[key] for key, seq in walk.seq.items()}
    writer = _writer(walk, failing_key)
    if writer is None:
        return None
    seq, kind = walk.seq[id(writer)], type(writer)
    first = last = seq
    while type(by_seq.get(first - 1)) is kind:
        first -= 1
    while type(by_seq.get(last + 1)) is kind:
        last += 1
    return seq - first if last - first + 1 == count else None


def _which_saver(walk, failing_key: int, count: int) -> int | None:
    """Which of `count` in-place writes, side by side in the source, each into what an operation
    of the failing node's type had read (smee's two `/= torch.norm(...)` of the torsion's cross
    products): the nodes of that type reading what a node of the same type made, their saved
    tensors changed, in the order they ran. None unless there are exactly `count` of them."""
    failing = walk.nodes[failing_key]
    read = {type(child) for child in _inputs(failing)}
    ran = sorted((walk.seq[key], key) for key, node in walk.nodes.items() if type(node) is type(failing)
                 and {type(child) for child in _inputs(node)} == read and graph.changed_saved(node) is not None)
    keys = [key for _, key in ran]
    return keys.index(failing_key) if len(keys) == count and failing_key in keys else None


# Calls that make a tensor of the shape they are given: `x.new_zeros((N, H, D))`, `torch.zeros(n, d)`.
_FACTORIES = {"zeros", "ones", "empty", "full", "rand", "randn", "new_zeros", "new_ones", "new_empty", "new_full"}


def _which_by_rank(walk, failing_key: int, group: list[ast.AugAssign]) -> int | None:
    """Which of the writes side by side changed the tensor the saver read, told by its number of
    dimensions: fast-transformers' `Zi += K` and `Si += torch.einsum(...)`, `Si` made by
    `query.new_zeros((N, H, D, M))` and `Zi` by `query.new_zeros((N, H, D))`. The graph gives
    the rank of what the saver read through its views, there where the write's operation
    consumed it; the source, the rank each target was made with. None unless exactly one matches."""
    ranks = set()
    for key in _read_by(walk.nodes[failing_key]):
        node = walk.nodes.get(key)
        if node is None or graph.is_view(node):
            continue
        consumers = {_operation(walk.nodes[c]) for c in walk.consumers.get(key, ())}
        shape = _output_shape(node)
        if shape is not None and consumers & {op for op, kind in _AUGMENTED.items()
                                              if all(isinstance(w.op, kind) for w in group)}:
            ranks.add(len(shape))
    made = [_rank_made(write) for write in group]
    matching = [i for i, rank in enumerate(made) if rank is not None and rank in ranks]
    return matching[0] if len(ranks) == 1 and len(matching) == 1 else None


def _rank_made(write: ast.AugAssign) -> int | None:
    """The number of dimensions the target of `write` was made with, where every assignment of it
    in its function is a factory given its shape (`x.new_zeros((N, H, D))`) or reads another
    tensor (`Si, Zi = memory`, which keeps what a factory made before)."""
    if not isinstance(write.target, ast.Name):
        return None
    scope = src.enclosing_function(write)
    ranks = set()
    for assignment in src.assignments(scope, write.target.id) if scope is not None else []:
        value = assignment.value
        if assignment.stmt is write or not isinstance(value, ast.Call):
            continue
        func = value.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name not in _FACTORIES or not value.args:
            return None
        shape = value.args[0]
        ranks.add(len(shape.elts) if isinstance(shape, (ast.Tuple, ast.List))
                  else len(value.args) if all(isinstance(a, (ast.Name, ast.Constant)) for a in value.args) else None)
    return ranks.pop() if len(ranks) == 1 and None not in ranks else None


def _which_copy(walk, failing_key: int, count: int) -> int | None:
    """Which of `count` copies of one in-place write, run one after another, changed the saved
    tensor: each wrote into what a node of the failing node's type saved, so the nodes of the
    writer's type that consume such a node, their saved tensor changed, are the copies' nodes
    in the order they ran. None unless there are exactly `count` of them."""
    writer = _writer(walk, failing_key)
    if writer is None:
        return None
    saver = type(walk.nodes[failing_key])
    ran = sorted((walk.seq[key], key) for key, node in walk.nodes.items() if type(node) is type(writer)
                 and any(type(child) is saver and graph.changed_saved(child) is not None for child in _inputs(node)))
    keys = [key for _, key in ran]
    return keys.index(id(writer)) if len(keys) == count and id(writer) in keys else None


def _in_other_branches(write: ast.stmt, name: str) -> list[ast.stmt]:
    """The statements that write into `name` in place (`name += ...`, `name *= ...`) in the other
    branches of the innermost `if` whose branch holds `write`, in source order."""
    child, parent = write, src.parent(write)
    while parent is not None and not isinstance(parent, ast.If):
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return []
        child, parent = parent, src.parent(parent)
    if parent is None:
        return []
    # An `elif` is an `if` alone in its parent's `orelse`: its branches are the chain's too.
    chain = parent
    while isinstance(src.parent(chain), ast.If) and src.parent(chain).orelse == [chain]:
        chain = src.parent(chain)
    own = next(branch for branch in (parent.body, parent.orelse) if child in branch)
    in_own = {id(n) for statement in own for n in ast.walk(statement)}
    target = src.canonical(name)
    found = [node for node in ast.walk(chain) if isinstance(node, ast.AugAssign) and id(node) not in in_own
             and src.canonical(node.target) == target]
    return sorted(found, key=lambda n: n.lineno)


def _made_by(scope: ast.AST, write: ast.AugAssign) -> ast.stmt | None:
    """The statement that made the tensor `write` changes, where the name written reached it only
    through a plain alias (`c5_ffm = c5` after `c2, c3, c4, c5 = fpem(c2, c3, c4, c5)`): where the
    operation that saved it ran, under another name. None where the name written made it (`out =
    torch.tanh(...)`, then `out += x`): no alias to follow there."""
    name, before, aliased = src.canonical(write.target), write.lineno, False
    for _ in range(4):
        made = src.last_assignment(scope, name, before)
        if made is None or isinstance(made.stmt, ast.AugAssign):
            return None
        value = src.value_of(made.stmt)
        if not isinstance(value, ast.Name):
            return made.stmt if aliased else None
        name, before, aliased = value.id, made.stmt.lineno, True
    return None


def _passed_to_a_call(write: ast.stmt) -> ast.stmt | None:
    """Where what `x += x_conv` writes was passed, under its own name, to a call after it was
    last assigned and before the write (VG-HuBERT's `x_conv = self.pos_conv(x.transpose(1, 2))`):
    where an operation that saved its input read it. The first such statement."""
    if not isinstance(write, ast.AugAssign) or not isinstance(write.target, ast.Name):
        return None
    scope = src.enclosing_function(write) or src.module_of(write)
    made = src.last_assignment(scope, write.target.id, write.lineno)
    return _first_passing(scope, made.stmt.end_lineno if made is not None else 0, write.lineno,
                          lambda arg: _rooted_at(arg, write.target.id))


# Builtins that look at a tensor without an operation that could save it (fast-transformers'
# `if len(Si) != N:` between the state's assignment and its `Si += ...`).
_ONLY_LOOK = {"len", "isinstance", "print", "type", "id", "repr", "str", "hasattr", "getattr", "callable"}


def _first_passing(scope: ast.AST, after: int, before: int, passes) -> ast.stmt | None:
    """The first statement of `scope` between the two rows with a call one of whose positional
    arguments `passes`, the call not one of the builtins that only look at it."""
    reads = [src.statement_of(call) for call in src.all_nodes(scope)
             if isinstance(call, ast.Call) and after < call.lineno < before and any(passes(arg) for arg in call.args)
             and not (isinstance(call.func, ast.Name) and call.func.id in _ONLY_LOOK)]
    return min(reads, key=lambda stmt: stmt.lineno) if reads else None


def _rooted_at(expression: ast.expr, name: str) -> bool:
    """Whether `expression` is `name`, or a chain of attributes, calls and subscripts on it
    (`x.transpose(1, 2)`, `x[:, 0]`)."""
    while isinstance(expression, (ast.Attribute, ast.Call, ast.Subscript)):
        expression = expression.func if isinstance(expression, ast.Call) else expression.value
    return isinstance(expression, ast.Name) and expression.id == name


def _read_under_alias(write: ast.stmt) -> tuple[ast.stmt, str] | None:
    """Where what `x += path` writes was read under another name, and that name: `path = x`, then
    `path = self.block(path)` (RefineNet's ChainedResidualPool), where the operation that saved it
    ran. The first statement after the alias that passes it to a call, before the write."""
    if not isinstance(write, ast.AugAssign) or not isinstance(write.target, ast.Name):
        return None
    scope = src.enclosing_function(write) or src.module_of(write)
    name = write.target.id
    for node in src.all_nodes(scope):
        if isinstance(node, ast.Assign) and node.lineno < write.lineno and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Name) \
                and node.value.id == name:
            alias = node.targets[0].id
            read = _first_passing(scope, node.lineno, write.lineno,
                                  lambda arg: isinstance(arg, ast.Name) and arg.id == alias)
            if read is not None:
                return read, alias
    return None


def _made_by_an_operator(ctx, operations: set[str | None]):
    """(source, statement, name) where the model's forwards make a tensor with the one arithmetic
    operation that made what the saver read (`x = x + identity` for AddBackward0), where exactly
    one statement of theirs does. None where none or several do."""
    named = {op for op in operations if op}
    if len(named) != 1 or not named <= _AUGMENTED.keys():
        return None
    kinds = {_AUGMENTED[op] for op in named}
    found = [(source, node) for source, class_node in _model_classes(ctx) for node in src.all_nodes(class_node)
             if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
             and isinstance(node.value, ast.BinOp) and type(node.value.op) in kinds
             and getattr(src.enclosing_function(node), "name", None) == "forward"]
    if len(found) != 1:
        return None
    source, made = found[0]
    return source, made, made.targets[0].id


def _called_once(made: ast.stmt, module: str) -> ast.Call | None:
    """The call of `module` (`self.dropout`, built by `made`) in its class, on one argument,
    where the class calls it exactly once on anything but a copy: written into, a
    `.clone()` changes nothing the graph saved (MVANet's second feed-forward)."""
    owner = next((node for node in src.ancestors(made) if isinstance(node, ast.ClassDef)), None)
    calls = [node for node in src.all_nodes(owner) if isinstance(node, ast.Call)
             and src.canonical(node.func) == module and not _a_copy(node)] if owner is not None else []
    return calls[0] if len(calls) == 1 and len(calls[0].args) == 1 else None


def _a_copy(call: ast.Call) -> bool:
    argument = call.args[0] if len(call.args) == 1 else None
    return isinstance(argument, ast.Call) and isinstance(argument.func, ast.Attribute) \
        and argument.func.attr == "clone" and not argument.args


def _fed_by_a_call(source, made: ast.stmt, module: str, saver: str | None) -> tuple[ast.stmt, str] | None:
    """Where `module` (`self.dropout`, made in place by `made`) is called in its class with the
    result of another call as its input (`self.dropout(self.mlp(x))`): that statement, and the
    callee (`self.mlp`), whose result it writes, where the operation that saved it ran inside
    that callee (the MLP's last ReLU). None where the callee is the saving operation itself
    (`self.act(torch.sigmoid(h))`: the flag is where to look), or unless the class calls the
    module exactly once."""
    call = _called_once(made, module)
    if call is None or not isinstance(call.args[0], ast.Call):
        return None
    written = call.args[0]
    if not isinstance(written.func, (ast.Name, ast.Attribute)) or src.canonical(written.func).split(".")[-1] == saver:
        return None
    return src.statement_of(written), source.segment(written.func)


def _made_by_call(write: ast.stmt) -> tuple[ast.stmt, str] | None:
    """The statement that made what `x *= w` writes into, where it is a call, and the last name
    part of what it calls (`x = x.prod(-1)`: `prod`)."""
    if not isinstance(write, ast.AugAssign):
        return None
    scope = src.enclosing_function(write) or src.module_of(write)
    # Another in-place write (mmdet's FPN: `laterals[i - 1] += ...` in both branches of an `if`)
    # made nothing.
    made = next((a for a in reversed(src.assignments(scope, src.canonical(write.target)))
                 if a.stmt.lineno < write.lineno and not isinstance(a.stmt, ast.AugAssign)), None)
    value = made.value if made is not None else None
    if made is None and isinstance(write.target, ast.Subscript):
        # `laterals = [lateral_conv(x) for ...]`, then `laterals[i - 1] += ...`: each item made by
        # the same call.
        made = src.last_assignment(scope, src.canonical(write.target.value), write.lineno)
        value = made.value if made is not None else None
        value = value.elt if isinstance(value, ast.ListComp) else None
    if not isinstance(value, ast.Call) or not isinstance(value.func, (ast.Name, ast.Attribute)):
        return None
    return made.stmt, src.canonical(value.func).split(".")[-1]


def _made_by_saver(write: ast.stmt, saver: str | None, result_saved: bool) -> ast.stmt | None:
    """The statement that made what `x *= w` writes into, where it is a call of the saving
    operation (`x = x.prod(-1)`): the operation saved its result there. Where the graph shows
    that the write consumed the saver's own result, a call of anything else counts too: CDC's
    `h = self.block1(x)`, whose block ends in the `nn.ReLU` that saved `h`."""
    found = _made_by_call(write) if saver is not None else None
    return found[0] if found is not None and (result_saved or found[1] == saver) else None


def _made_by_one_of(write: ast.stmt, operations: set[str | None]) -> ast.stmt | None:
    """The statement that made what `x /= ...` writes into, where it is a call of one of the
    operations whose results the saver read (`torch.cross` for LinalgCrossBackward0)."""
    found = _made_by_call(write) if operations else None
    return found[0] if found is not None and any(op == found[1] or op.endswith(f"_{found[1]}")
                                                 for op in operations if op) else None


def _writes_what_another_call_made(write, operations: set[str | None]) -> bool:
    """Whether a module made to write in place (`self.activ = nn.ReLU(inplace=True)`) is called in
    its class on what a call of none of `operations` made just before (`x = self.bn(x)`, then
    `x = self.activ(x)`), where the saver read what one of them made: imgclsmob's Xception,
    whose ReLU written at the start of DwsConvBlock.forward overwrote the sum a unit returned,
    not the one after ConvBlock's batch norm."""
    _, stmt, node, class_node = write
    built = _built_in_place(stmt, node)
    if built is None or not operations:
        return False
    targets = src.targets_of(stmt)
    if src.value_of(stmt) is not built or len(targets) != 1:
        return False
    module = src.canonical(targets[0])
    for call in src.all_nodes(class_node):
        if not (isinstance(call, ast.Call) and src.canonical(call.func) == module and call.args
                and isinstance(call.args[0], ast.Name)):
            continue
        function = src.enclosing_function(call)
        made = src.last_assignment(function, call.args[0].id, call.lineno) if function is not None else None
        value = made.value if made is not None else None
        if isinstance(value, ast.Call) and isinstance(value.func, (ast.Name, ast.Attribute)) \
                and src.canonical(value.func).split(".")[-1] not in operations:
            return True
    return False


def _reads_itself(write: ast.stmt, name: str | None = None) -> bool:
    """`x /= torch.norm(x, dim=1).unsqueeze(1)`, `x = x.div_(norm(x))`: the statement that writes
    into `x` (the target of an augmented assignment, else `name`) passes `x` itself to a call,
    which may save it for the backward before the write changes it."""
    name = write.target.id if isinstance(write, ast.AugAssign) and isinstance(write.target, ast.Name) else name
    value = write.value if isinstance(write, (ast.AugAssign, ast.Assign, ast.Expr)) else None
    return name is not None and value is not None and any(
        isinstance(node, ast.Call) and any(_rooted_at(arg, name) for arg in node.args) for node in ast.walk(value))


def _made_by_a_caller(ctx, write: ast.stmt, saver: str | None, result_saved: bool, passed: set[int] = frozenset()):
    """(source, statement, name) where a module of the model's made what `x += ...` writes, when
    `x` is a parameter of the `forward` the write is in, as its caller passed it down: each
    module holding one of this class's modules is read for a call of it (`self.position_embedding(
    data)`, or `stsgcl_layer(data, self.adj)` in a loop over the list that holds it), and the
    argument followed, through the callers' own parameters, to the call of the saving operation
    that made it (`data = torch.relu(...)`). None where no single caller tells."""
    if saver is None or not isinstance(write, ast.AugAssign) or not isinstance(write.target, ast.Name):
        return None
    function, owner, name = src.enclosing_function(write), src.enclosing_class(write), write.target.id
    if function is None or any(a.stmt.lineno < write.lineno and id(a.stmt) not in passed
                               for a in src.assignments(function, name)):
        return None
    for _ in range(_MAX_PASSED_DOWN):
        if owner is None or function.name != "forward" or name not in src.parameter_names(function):
            return None
        calls = list({id(call): (source, method, call) for source, method, call in _calls_of(ctx, owner)}.values())
        if len(calls) != 1:
            return None
        source, method, call = calls[0]
        argument = src.argument_for(function, call, name)
        if not isinstance(argument, ast.Name):
            return None
        made = src.last_assignment(method, argument.id, call.lineno)
        if made is not None:
            value = made.value
            called = value.func if isinstance(value, ast.Call) and isinstance(value.func, (ast.Name, ast.Attribute)) \
                else None
            if called is None or not (result_saved or src.canonical(called).split(".")[-1] == saver):
                return None
            return source, made.stmt, argument.id
        function, owner, name = method, src.enclosing_class(method), argument.id
    return None


def _passed_through(ctx, write: ast.stmt) -> set[int]:
    """The statements (by id) before `write` in its `forward` that hand the name it writes on
    unchanged: `x = self.project_in(x)` where the attribute is an `nn.Identity` in every module of
    the class (x-transformers' wrapper without `dim_in`). Made nothing, they are passed over."""
    function, owner = src.enclosing_function(write), src.enclosing_class(write)
    if function is None or owner is None or not isinstance(write, ast.AugAssign) \
            or not isinstance(write.target, ast.Name):
        return set()
    name = write.target.id
    instances = [module for _, top, _ in naming.module_bindings(ctx.frames) for module in top.modules()
                 if not type(module).__module__.startswith("torch") and class_source(module)[1] is owner]
    passed = set()
    for made in src.assignments(function, name):
        value = made.value
        if made.stmt.lineno >= write.lineno or not isinstance(value, ast.Call) or len(value.args) != 1 \
                or value.keywords or not isinstance(value.args[0], ast.Name) or value.args[0].id != name:
            continue
        attribute = src.canonical(value.func)
        if instances and attribute.startswith("self.") and attribute.count(".") == 1 and all(
                isinstance(getattr(module, attribute[5:], None), torch.nn.Identity) for module in instances):
            passed.add(id(made.stmt))
    return passed


# Modules a tensor is followed up through, from the forward that wrote it to the one that made it.
_MAX_PASSED_DOWN = 4


def _calls_of(ctx, class_node: ast.ClassDef):
    """(source, method, call) for each call of a module of `class_node` in the `forward` of a
    module of the model that holds it: `self.layer(...)`, or `layer(...)` in a `for layer in
    self.layers:` over the list or sequence that holds it."""
    seen = set()
    for _, top, _ in naming.module_bindings(ctx.frames):
        for parent in top.modules():
            if type(parent).__module__.startswith("torch") or id(parent) in seen:
                continue
            seen.add(id(parent))
            held = [attribute for attribute, child in parent.named_children()
                    if any(class_source(m)[1] is class_node for m in (
                        child, *(child.children() if isinstance(child, _CONTAINERS) else ())))]
            if not held:
                continue
            source, parent_class = class_source(parent)
            forward = next((m for m in parent_class.body if isinstance(m, ast.FunctionDef) and m.name == "forward"),
                           None) if parent_class is not None else None
            for call in (n for n in src.own_nodes(forward) if isinstance(n, ast.Call)) if forward is not None else ():
                func = src.canonical(call.func) if isinstance(call.func, (ast.Name, ast.Attribute)) else None
                if func in {f"self.{a}" for a in held} or isinstance(call.func, ast.Name) \
                        and _iterates(forward, call.func.id, {f"self.{a}" for a in held}):
                    yield source, forward, call


_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)


def _iterates(function: ast.AST, name: str, containers: set[str]) -> bool:
    """Whether `name` is the variable of a `for` loop of `function` over one of `containers`."""
    return any(isinstance(loop, ast.For) and isinstance(loop.target, ast.Name) and loop.target.id == name
               and src.canonical(loop.iter) in containers for loop in src.own_nodes(function))


def _operation(node) -> str | None:
    """`relu` for ReluBackward0, `leaky_relu` for LeakyReluBackward1, `max_pool2d_with_indices` for
    MaxPool2DWithIndicesBackward0."""
    match = re.fullmatch(r"(\w+?)Backward\d*", type(node).__name__)
    if match is None:
        return None
    return re.sub(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", match.group(1)).lower()


def _model_classes(ctx):
    """The user's nn.Module classes: those of the models in the frames (and their submodules),
    then the classes with a `forward` in the frames' own files (a model used without a name)."""
    seen: set[int] = set()
    for _, module, _ in naming.module_bindings(ctx.frames):
        for sub in module.modules():
            if type(sub).__module__.startswith("torch"):
                continue
            source, class_node = class_source(sub)
            if class_node is not None and id(class_node) not in seen:
                seen.add(id(class_node))
                yield source, class_node
            if len(seen) >= _MAX_CLASSES:
                return
    for filename in dict.fromkeys(frame.f_code.co_filename for frame in ctx.frames):
        source = src.load(filename)
        for node in src.all_nodes(source.tree) if source is not None else ():
            if isinstance(node, ast.ClassDef) and id(node) not in seen and defines_forward(node) is not None:
                seen.add(id(node))
                yield source, node


def _functions_of_frames(ctx):
    """(source, function) for each function defined at the top of the frames' own files."""
    for filename in dict.fromkeys(frame.f_code.co_filename for frame in ctx.frames):
        source = src.load(filename)
        for node in source.tree.body if source is not None else ():
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield source, node


def _writes_in_model_classes(ctx, writers: set[str]):
    """(source, statement, node, class) for each in-place write in those classes that one of `writers`
    could be: `out += x` (add), `h.relu_()`, `nn.ReLU(inplace=True)` / `F.relu(x, inplace=True)`,
    and a module made to write in place after it was built."""
    yield from _writes_in(_model_classes(ctx), writers)
    yield from _made_in_place_after(ctx, writers)


def _made_in_place_after(ctx, writers: set[str]):
    """(source, statement, construction call, class) for each module of the models in the frames
    that writes in place though its class built it without `inplace=True`: MVANet's
    `for m in self.modules(): ... m.inplace = True` over every `self.dropout = nn.Dropout(0.1)`
    of its blocks. The live module says so; the statement that built it is where it is known."""
    seen: set[int] = set()
    for _, module, _ in naming.module_bindings(ctx.frames):
        for sub in module.modules():
            if type(sub).__module__.startswith("torch"):
                continue
            flagged = {f"self.{name}" for name, child in sub._modules.items()
                       if getattr(child, "inplace", None) is True and _same_operation(type(child).__name__, writers)}
            source, class_node = class_source(sub) if flagged else (None, None)
            if class_node is None or id(class_node) in seen:
                continue
            seen.add(id(class_node))
            for node in src.all_nodes(class_node):
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call) \
                        and src.canonical(node.targets[0]) in flagged \
                        and not any(k.arg == "inplace" for k in node.value.keywords):
                    yield source, node, node.value, class_node
            if len(seen) >= _MAX_CLASSES:
                return


def _written(source, stmt: ast.stmt) -> str:
    """What an in-place statement writes into: `h` of `h += 1` and of `h.clamp_(0, 1)`."""
    if isinstance(stmt, ast.AugAssign):
        return source.segment(stmt.target)
    return source.segment(stmt.value.func.value)


def _built_in_place(stmt: ast.stmt, node: ast.AST) -> ast.Call | None:
    """The call that built a module that writes in place, where `node` is how the write is known:
    the `inplace=True` of `nn.ReLU(inplace=True)`, or the construction itself where the flag was
    set on the module after (`_made_in_place_after`)."""
    if isinstance(node, ast.keyword):
        return src.parent(node)
    if isinstance(node, ast.Call) and src.value_of(stmt) is node and isinstance(node.func, (ast.Name, ast.Attribute)) \
            and not src.canonical(node.func).endswith("_"):
        return node
    return None


def _writes_in(scopes, writers: set[str]):
    """(source, statement, node, scope) for each in-place write in `scopes` that one of `writers` could be."""
    for source, class_node in scopes:
        for node in src.all_nodes(class_node):
            if isinstance(node, ast.AugAssign) and any(isinstance(node.op, _AUGMENTED.get(w, ())) for w in writers):
                yield source, node, node, class_node
            elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
                name = src.canonical(node.func).split(".")[-1]
                flag = next((k for k in node.keywords if k.arg == "inplace"
                             and isinstance(k.value, ast.Constant) and k.value.value is True), None)
                if flag is not None and _same_operation(name, writers):
                    yield source, src.statement_of(node), flag, class_node
                elif name.endswith("_") and not name.endswith("__") and name[:-1] in writers \
                        and isinstance(node.func, ast.Attribute):
                    yield source, src.statement_of(node), node, class_node


# What an in-place call records in the graph under another operation's name: a dropout in
# place multiplies its input by the scaled mask (`mul_`), so its node is MulBackward0.
_RECORDED_AS = {"mul": ("dropout", "dropout1d", "dropout2d", "dropout3d", "featuredropout")}


def _same_operation(name: str, writers: set[str]) -> bool:
    """`ReLU` / `relu` for relu, `LeakyReLU` for leaky_relu, `Dropout` for dropout or mul."""
    flat = name.lower().replace("_", "")
    return any(flat == w.replace("_", "") or flat in _RECORDED_AS.get(w, ()) for w in writers)


def _finding(ctx: Context, source, stmt: ast.stmt, node: ast.AST, saver: str | None, detail,
             siblings: list[ast.stmt] = (), result_saved: bool = False, copies=(), alike=(),
             made_by: set[str | None] = frozenset(), passed_after: ast.stmt | None = None) -> Finding:
    """`made_by`: the operations that made what the saver read, where it saved its input.
    `passed_after`: where what the write made was passed to the call that saved it."""
    code = source.segment(stmt)
    named_at = node
    built = _built_in_place(stmt, node)
    if built is not None:
        # `self.act = nn.ReLU(inplace=True)`: the module is known by the attribute it is kept in.
        targets = src.targets_of(stmt) if src.value_of(stmt) is built else []
        name = source.segment(targets[0]) if len(targets) == 1 else source.segment(built.func)
        saved = f"`{saver}`" if saver else "an earlier operation"
        if isinstance(node, ast.keyword):
            fix = Fix(f"Pass `inplace=False` to `{source.segment(built.func)}`: it overwrites its input, "
                      f"which {saved} saved for the backward", (replace(source, node.value, "False"),))
        else:
            called = _called_once(stmt, name)
            fix = out_of_place.copy_module_input(source, called, name, saved) if called is not None else None
        variant = "run-in-forward-flag"
    else:
        target = node.target if isinstance(node, ast.AugAssign) else node.func.value
        name = source.segment(target)
        bound = src.targets_of(stmt) if isinstance(node, ast.Call) and src.value_of(stmt) is node else []
        if isinstance(target, ast.Call) and len(bound) == 1 and isinstance(bound[0], ast.Name):
            # zero-restore's SKConv, `fea = conv(x).unsqueeze_(dim=1)`: the tensor written in place
            # has no name but the one its statement binds.
            name, named_at = bound[0].id, bound[0]
        fix = out_of_place.out_of_place(source, stmt, name) if not isinstance(node, ast.Call) \
            or isinstance(stmt, ast.Expr) else out_of_place.calls_out_of_place(source, stmt)
        others = [out_of_place.out_of_place(source, other, _written(source, other)) for other in siblings]
        if fix is not None and others and all(others):
            names = ", ".join(f"`{_written(source, s)}`" for s in sorted([stmt, *siblings], key=lambda s: s.lineno))
            fix = Fix(f"Write {names} out of place: each of them is a tensor an earlier operation may have "
                      f"saved for the backward, and the error names only the operation",
                      tuple(edit for f in [fix, *others] for edit in f.edits))
        same = [out_of_place.out_of_place(other_source, other, other_source.segment(other.target))
                for other_source, other in copies]
        if fix is not None and same and all(same):
            rows = " and ".join(str(other.lineno) for _, other in copies)
            fix = Fix(f"{fix.message} (and the same at line {rows}: the same write in another block of the model, "
                      f"which the next backward would fail on)", fix.edits + tuple(e for f in same for e in f.edits),
                      fix.applicability)
        more = [out_of_place.out_of_place(other_source, other, other_source.segment(other.target))
                for other_source, other in alike]
        if fix is not None and more and all(more):
            rows = ", ".join(str(other.lineno) for _, other in alike)
            fix = Fix(f"{fix.message} (and the same at line{'s' if len(alike) > 1 else ''} {rows}: "
                      f"{'each passes' if len(alike) > 1 else 'it passes'} the tensor it writes to a call that may "
                      f"save it, and the next backward would fail there)",
                      fix.edits + tuple(e for f in more for e in f.edits), fix.applicability)
        covered = {id(other) for other in siblings} | {id(other) for _, other in copies}
        branches = [other for other in _in_other_branches(stmt, name) if id(other) not in covered]
        elsewhere = [out_of_place.out_of_place(source, other, name) for other in branches]
        if fix is not None and elsewhere and all(elsewhere):
            # Glow's coupling (chaiyujin/glow-pytorch#6): `z2 += self.f(z1)` when additive,
            # `z2 += shift` and `z2 *= scale` when affine. The graph says only which operation
            # wrote, not which branch ran: each branch's write goes out of place.
            rows = ", ".join(str(other.lineno) for other in branches)
            fix = Fix(f"{fix.message} (and the same at line{'s' if len(branches) > 1 else ''} {rows}: the other "
                      f"branches of the `if` write `{name}` in place too, and which of them ran the graph does not "
                      f"say)", fix.edits + tuple(e for f in elsewhere for e in f.edits), fix.applicability)
        variant = "run-in-forward-write"
    culprits = [culprit_at(name, source, node_start(source, named_at))]
    # An operation that saved its input read it where it was passed to a call: that statement
    # comes before where the tensor was made.
    passed = _passed_to_a_call(stmt) if not result_saved else None
    read = _made_by(src.enclosing_function(stmt) or source.tree, stmt) if isinstance(stmt, ast.AugAssign) else None
    read = read or _made_by_saver(stmt, saver, result_saved)
    through = _passed_through(ctx, stmt) if read is not None else set()
    if read is not None and id(read) in through:
        read = None
    if read is None and not result_saved and _reads_itself(stmt, name):
        # `x /= torch.norm(x)`: the norm saved `x` as the statement before made it.
        made = src.last_assignment(src.enclosing_function(stmt) or source.tree, name, stmt.lineno)
        read = made.stmt if made is not None and not isinstance(made.stmt, ast.AugAssign) else None
    alias = _read_under_alias(stmt) if read is None else None
    caller = _made_by_a_caller(ctx, stmt, saver, result_saved, through) \
        if read is None and alias is None and passed is None else None
    facts = (("change", code), *((("saver", saver),) if saver else ()), *version_facts(detail))
    fed = _fed_by_a_call(source, stmt, name, saver) if built is not None and result_saved else None
    summed = _made_by_an_operator(ctx, made_by) if built is not None and not result_saved else None
    if summed is not None:
        # imgclsmob's Xception: the convolution of the identity path saved the sum the unit
        # before returned, `x = x + identity`; the ReLU at the start of the body overwrote it.
        made_source, made, made_name = summed
        culprits.insert(0, culprit_at(made_name, made_source, node_start(made_source, made)))
        facts += (("read", made.lineno), ("made", made_name))
        variant = "run-in-forward-flag-made"
    elif fed is not None:
        # torchgeo's L-TAE: `self.dropout(self.mlp(x))`, and the MLP's last ReLU saved its
        # output: the forward the samples mark is where the module that made it ran.
        made, name = fed
        culprits.insert(0, culprit_at(name, source, node_start(source, made)))
        facts += (("read", made.lineno),)
        variant = "run-in-forward-flag-read"
    elif passed is not None or passed_after is not None:
        passed = passed or passed_after
        culprits.insert(0, culprit_at(name, source, node_start(source, passed)))
        facts += (("read", passed.lineno),)
        variant = "run-in-forward-write-passed"
    elif read is not None:
        # The graph saved it where it was made: the forward the samples mark first, the write
        # (the line the fix changes) second. Made as an item of a list, it is known there by
        # the list's name.
        target = node.target if isinstance(node, ast.AugAssign) else None
        made_name = source.segment(target.value) if isinstance(target, ast.Subscript) and src.canonical(
            target.value) in {src.canonical(t) for t in src.targets_of(read)} else name
        culprits.insert(0, culprit_at(made_name, source, node_start(source, read)))
        facts += (("read", read.lineno),)
        variant = "run-in-forward-write-read"
    elif alias is not None:
        culprits.insert(0, culprit_at(name, source, node_start(source, alias[0])))
        facts += (("read", alias[0].lineno), ("alias", alias[1]))
        variant = "run-in-forward-write-alias"
    elif caller is not None:
        # LibCity's STSGCN: `data = torch.relu(...)` in the model's forward, passed down two
        # modules to `PositionEmbedding.forward`'s `data += self.temporal_emb`.
        made_source, made, made_name = caller
        culprits.insert(0, culprit_at(made_name, made_source, node_start(made_source, made)))
        facts += (("read", made.lineno), ("made", made_name))
        variant = "run-in-forward-write-caller"
    evidence = Evidence(name, CallSite(source.filename, stmt.lineno, code), ctx.backward_site(),
                        advice="not-the-cause", facts=facts)
    return finding("BX011", variant, "inplace-modified", evidence, culprits, [fix], "likely")
