"""BX000 syntax-error."""
from .cause import Cause, Message

CAUSE = Cause(
    code="BX000",
    name="syntax-error",
    title="a file or notebook cell that does not parse, so nothing in it was checked",
    what="""\
Reported by `check` where a `.py` file does not parse as Python 3 (a Python 2 `print x`, an
IPython `%magic` outside a notebook, a line left half-edited), or where a notebook's code cell
does not (the notebook's other cells are checked without it). The run goes on with everything
else, and, as for any diagnostic, exits 1.""",
    why="""\
No rule can read code that does not parse: a graph-history bug in it would go unreported, and a
run that said "All checks passed." would be wrong about it.""",
    example="""\
for x, y in loader:
    loss = loss_fn(model(x), y)
    print "loss", loss""",
    use_instead="""\
for x, y in loader:
    loss = loss_fn(model(x), y)
    print("loss", loss)""",
    messages={
        "syntax": Message("This code does not parse, so nothing in it was checked ({error})"),
    },
    parse_error=True,
)
