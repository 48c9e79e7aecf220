"""`python -m lsp_server`: the backward-explainer language server (diagnostics, quick fixes,
hover explanations) for any LSP client. It never imports torch or the code it checks."""
