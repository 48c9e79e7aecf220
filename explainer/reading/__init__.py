"""The reading layer below both engines: source files and their AST (`source`), which loops
train and which values carry autograd history (`training`), where a value comes from
(`dataflow`), what jedi can tell about imported names (`jedi_types`), and notebooks read as one
module (`notebook`). The static checker, the runtime explainer and the fix builders read code
only through it; it imports neither engine."""
