--- Highlight groups of the ghost text, readable with and without 'termguicolors'.
local api = vim.api

local M = {}

--- Terminal attributes for colour schemes that give Comment none (Neovim's default one among them):
--- without them ghost text would look like typed text in a 16/256-colour terminal.
local CTERM_FALLBACK = { ctermfg = 8, cterm = { italic = true } }

--- Defines LladaGhost (as `default`, so a user's or colour scheme's definition wins): Comment's
--- attributes, plus CTERM_FALLBACK where Comment has no terminal colour. On Neovim 0.12 the final
--- completion is drawn by Neovim with ComplHint; while that is still Neovim's stock link to NonText
--- and has no terminal colour either, it is linked to LladaGhost, so drafts and answers look alike.
function M.define()
  local ghost = api.nvim_get_hl(0, { name = 'Comment', link = false })
  if not ghost.ctermfg then
    ghost = vim.tbl_extend('force', ghost, CTERM_FALLBACK)
  end
  ghost.default = true
  api.nvim_set_hl(0, 'LladaGhost', ghost)

  local hint = api.nvim_get_hl(0, { name = 'ComplHint', link = false })
  local stock = vim.deep_equal(api.nvim_get_hl(0, { name = 'ComplHint' }), { link = 'NonText' })
  if stock and not hint.ctermfg then
    api.nvim_set_hl(0, 'ComplHint', { link = 'LladaGhost' })
  end
end

return M
