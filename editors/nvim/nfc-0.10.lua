vim.api.nvim_create_autocmd("FileType", { pattern = "nf", callback = function(ev)
  vim.lsp.start({ name = "nfc", cmd = { "nfc", "lsp" },
                  root_dir = vim.fs.root(ev.buf, { ".git" }) })
end })
