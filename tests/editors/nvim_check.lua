-- Attach backward-explainer's language server to the current buffer, record its diagnostics (and
-- their messages), the quick fixes offered at the first one, apply the first quick fix through
-- Neovim's own LSP client, and record what is left.
-- Run: nvim --headless --clean -c 'luafile tests/editors/nvim_check.lua' FILE
-- Environment: EXPLAINER_SERVER (the backward-explainer-lsp command), EXPLAINER_OUT (a file to write),
-- EXPLAINER_EXPECT (optional: wait until a diagnostic's message contains this text).
local server = os.getenv("EXPLAINER_SERVER") or "backward-explainer-lsp"
local out = assert(os.getenv("EXPLAINER_OUT"), "EXPLAINER_OUT is not set")
local expect = os.getenv("EXPLAINER_EXPECT")
local buf = vim.api.nvim_get_current_buf()
local config = {
  name = "backward-explainer",
  cmd = { server },
  root_dir = vim.fn.getcwd(),
}
-- Neovim 0.7 has start_client + buf_attach_client; 0.8+ has vim.lsp.start.
if vim.lsp.start then
  vim.lsp.start(config, { bufnr = buf })
else
  vim.lsp.buf_attach_client(buf, vim.lsp.start_client(config))
end

local function code_of(d)
  return d.code or (d.user_data and d.user_data.lsp and d.user_data.lsp.code) or ""
end

local report = {}
local function record(label)
  for _, d in ipairs(vim.diagnostic.get(buf)) do
    table.insert(report, string.format("%s %d:%d %s %s", label, d.lnum + 1, d.col + 1, code_of(d), d.source or ""))
    table.insert(report, string.format("%s-message %d %s", label, d.lnum + 1, d.message:gsub("\n", " ")))
  end
end

vim.wait(30000, function()
  for _, d in ipairs(vim.diagnostic.get(buf)) do
    if not expect or d.message:find(expect, 1, true) then return true end
  end
  return false
end, 50)
record("before")

local first = vim.diagnostic.get(buf)[1]
if first then
  local client = vim.lsp.get_active_clients()[1]
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(buf) },
    range = { start = { line = first.lnum, character = first.col },
              ["end"] = { line = first.end_lnum, character = first.end_col } },
    context = { diagnostics = {}, only = { "quickfix" } },
  }
  local responses = vim.lsp.buf_request_sync(buf, "textDocument/codeAction", params, 10000) or {}
  local offered = 0
  for _, response in pairs(responses) do
    offered = offered + #(response.result or {})
  end
  table.insert(report, "quickfixes " .. offered)
  for _, response in pairs(responses) do
    for _, action in ipairs(response.result or {}) do
      if action.edit then
        vim.lsp.util.apply_workspace_edit(action.edit, client.offset_encoding or "utf-16")
        table.insert(report, "applied " .. action.title)
        break
      end
    end
  end
  local line = first.lnum
  vim.wait(30000, function()
    for _, d in ipairs(vim.diagnostic.get(buf)) do
      if d.lnum == line and code_of(d) == code_of(first) then return false end
    end
    return true
  end, 50)
  record("after")
  table.insert(report, "text " .. vim.api.nvim_buf_get_lines(buf, line, line + 1, false)[1])
end

local handle = assert(io.open(out, "w"))
handle:write(table.concat(report, "\n") .. "\n")
handle:close()
vim.cmd("qa!")
