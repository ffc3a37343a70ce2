vim.filetype.add({ extension = { nf = "nf" } })
vim.lsp.config("nfc", {
  cmd = { "nfc", "lsp" },            -- or { "/path/to/repo/.venv/bin/nfc", "lsp" }
  filetypes = { "nf" },
  root_markers = { ".git" },
})
vim.lsp.enable("nfc")
