"""Fix builders: each turns one piece of source knowledge into a `Fix` of text edits.

One implementation serves the runtime explainer and (later) the static checker. A builder
returns None when its fix does not apply safely to the code at hand.
"""
