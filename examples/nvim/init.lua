-- Minimal Neovim config for llada-lsp: `nvim -u examples/nvim/init.lua some_file.py`
-- from the repository root, with `llada-lsp` on PATH (e.g. an activated virtual environment).
local repo = vim.fn.fnamemodify(debug.getinfo(1, 'S').source:sub(2), ':p:h:h:h')
vim.opt.runtimepath:append(repo .. '/editors/nvim')

require('llada').setup({
  inline_mode = 'speed',
  keymaps = { accept = '<Tab>', rewrite = '<leader>lr' },
})

vim.o.statusline = "%f %= %{v:lua.require'llada'.statusline()} "
