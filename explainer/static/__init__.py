"""The static checker: graph-history bugs found in source, before anything runs.

Never imports or runs the code it reads: it parses it with `ast`. Rules live one per module in
`explainer/static/rules/`, each with a stable code, a docstring in ruff's form and a docs page.
"""
