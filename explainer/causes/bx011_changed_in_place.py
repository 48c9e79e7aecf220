"""BX011 changed-in-place."""
from .cause import Cause, Message

CAUSE = Cause(
    code="BX011",
    name="changed-in-place",
    title="a tensor the graph saved, changed in place by your own code before the backward (`h += 1`, "
          "`nn.ReLU(inplace=True)` after an operation that saved its input)",
    what="""\
Found when it runs: the backward fails with "one of the variables needed for gradient computation
has been modified by an inplace operation", and no optimizer step changed the tensor. Your own code
did: `h += 1`, `h.clamp_(0, 1)`, `h[mask] = 0`, state written into in a method
(`self.bank[idx] = feats`), `target.load_state_dict(...)` (a soft update of a target network,
a state "restored" after a trial step), or, inside a model's `forward`, `nn.ReLU(inplace=True)`
or `out += x` after an operation that saved that tensor for its gradient. The explanation names
the tensor and the line that changed it, read from the graph's in-place node, the recorded
`load_state_dict` calls and the model's classes. The checker flags the plainest form before it
runs: the output of an operation that saves its output for the gradient (`F.relu`,
`torch.sigmoid`, an `nn.ReLU()` of the module, an `nn.Sequential` ending in one) changed in place
further down the same function (`out += residual`).""",
    why="""\
An operation that needs its input (or output) to compute its gradient saves it, with the
tensor's version. Changing the tensor in place bumps that version, and the backward refuses to
use the changed value. `retain_graph=True` has nothing to do with it: the graph still exists.""",
    example="""\
import torch

w = torch.ones(3, requires_grad=True)
h = torch.sigmoid(w * 2)
y = (h * 3).sum()
h += 1
y.backward()""",
    use_instead="""\
import torch

w = torch.ones(3, requires_grad=True)
h = torch.sigmoid(w * 2)
y = (h * 3).sum()
h = h + 1
y.backward()""",
    messages={
        "saved-result": Message(
            "`{carrier}` is what {saved} returns, and {saved} saves it to compute its gradient; `{change}` (line "
            "{made_at.row}) then changes it in place, so the backward through {saved} will fail ('modified by an "
            "inplace operation')"),
        "run-user": Message(
            "`{carrier}` was changed in place by `{change}` (line {made_at.row}) after the graph saved it for this "
            "backward (line {backward.row}). {versions}",
            "`{carrier}` was changed in place after the graph saved it.",
            ("changed in place after the graph saved it",)),
        "run-user-read": Message(
            "The graph read `{carrier}` at line {read} and saved it for this backward (line {backward.row}); "
            "then `{change}` (line {made_at.row}) changed it in place. {versions}",
            "`{carrier}` was changed in place after the graph saved it.",
            ("saved by the graph here", "changed in place after the graph saved it")),
        "run-load": Message(
            "`{change}` (line {made_at.row}) copied new values into `{carrier}` in place after the graph saved it "
            "for this backward (line {backward.row}). {versions}",
            "`{carrier}` was overwritten in place by `load_state_dict` after the graph saved it.",
            ("overwritten in place by load_state_dict after the graph saved it",)),
        "run-load-read": Message(
            "The graph read `{carrier}` at line {read} and saved it for this backward (line {backward.row}); "
            "then `{change}` (line {made_at.row}) copied new values into it in place. {versions}",
            "`{carrier}` was overwritten in place by `load_state_dict` after the graph saved it.",
            ("saved by the graph here", "overwritten in place by load_state_dict after the graph saved it")),
        "run-in-forward-flag": Message(
            "`{change}` ({where}) makes an operation that overwrites its input, but {saved} saved that tensor for "
            "the backward (line {backward.row}). {versions}",
            "`{carrier}` changed a tensor in place that {saved} saved for the backward.",
            ("changed in place after {saved} saved it",)),
        "run-in-forward-flag-read": Message(
            "`{change}` ({where}) makes an operation that overwrites its input: the output of `{carrier}` at line "
            "{read}, which {saved} saved for the backward (line {backward.row}). {versions}",
            "The output of `{carrier}` was changed in place after {saved} saved it for the backward.",
            ("its output saved by {saved} here", "changed it in place after {saved} saved it")),
        "run-in-forward-flag-made": Message(
            "When line {read} made `{made}`, {saved} saved it for the backward (line {backward.row}); then "
            "`{change}` ({where}) made an operation that overwrites its input, and it changed that tensor in "
            "place. {versions}",
            "`{carrier}` changed a tensor in place that {saved} saved for the backward.",
            ("saved by {saved} here", "changed in place after {saved} saved it")),
        "run-in-forward-write": Message(
            "`{change}` ({where}) changes `{carrier}` in place, but {saved} saved that tensor for the backward "
            "(line {backward.row}). {versions}",
            "`{carrier}` changed a tensor in place that {saved} saved for the backward.",
            ("changed in place after {saved} saved it",)),
        "run-in-forward-write-read": Message(
            "When line {read} made `{carrier}`, {saved} saved it for the backward (line {backward.row}); then "
            "`{change}` ({where}) changed it in place. {versions}",
            "`{carrier}` changed a tensor in place that {saved} saved for the backward.",
            ("saved by {saved} here", "changed in place after {saved} saved it")),
        "run-in-forward-write-caller": Message(
            "When line {read} made `{made}`, {saved} saved it for the backward (line {backward.row}); then it was "
            "passed down to `{change}` ({where}), which changed it in place. {versions}",
            "`{carrier}` changed a tensor in place that {saved} saved for the backward.",
            ("saved by {saved} here", "changed in place after {saved} saved it")),
        "run-in-forward-write-passed": Message(
            "Line {read} passed `{carrier}` to {saved}, which saved it for the backward (line {backward.row}); "
            "then `{change}` ({where}) changed it in place. {versions}",
            "`{carrier}` changed a tensor in place that {saved} saved for the backward.",
            ("passed to {saved} here, which saved it", "changed in place after {saved} saved it")),
        "run-in-forward-write-alias": Message(
            "Line {read} handed `{carrier}` on as `{alias}`, and {saved} saved it there for the backward "
            "(line {backward.row}); then `{change}` ({where}) changed it in place. {versions}",
            "`{carrier}` changed a tensor in place that {saved} saved for the backward.",
            ("saved by {saved} here, as `{alias}`", "changed in place after {saved} saved it")),
        "run-unknown": Message(
            "`{carrier}` was changed in place after the graph that this backward uses saved it.",
            "`{carrier}` was updated by an in-place operation after this graph was built.",
            ("modified in place by an in-place operation after this graph was built",
             "built before the change, back-propagated after it")),
    },
)
