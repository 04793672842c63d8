--- Defaults of require("llada").setup() and their validation.
--- Knows nothing about LSP clients, buffers or windows.
local M = {}

---@class llada.Keymaps
---@field accept string|false Insert-mode key that accepts the ghost text.
---@field accept_word string|false Insert-mode key that accepts the next word of the ghost text.
---@field accept_line string|false Insert-mode key that accepts the next line of the ghost text.
---@field rewrite string|false Visual-mode key that rewrites the selection.

---@class llada.Config
---@field cmd string[] Command that starts the server.
---@field model? string Path or Hugging Face id; nil means the server's embedded model.
---@field engine? "auto"|"local"|string Where the model runs: also "unix:PATH" or "tcp://HOST:PORT"; nil: the server's.
---@field token_file? string Token file of an engine service on TCP.
---@field inline_mode "speed"|"quality"
---@field rewrite_mode "speed"|"quality"
---@field max_completion_tokens integer
---@field revise boolean Typing through a suggestion revises it (a warm start) instead of starting over.
---@field filetypes? string[] nil attaches to every file buffer.
---@field root_markers string[]
---@field keymaps llada.Keymaps
---@field debounce_ms integer Delay before the fallback ghost text asks the server.
---@field force_fallback boolean Use the plugin's own ghost text even where Neovim has one.
---@field review boolean Show a rewrite as a diff and ask before applying it.
---@field next_edit boolean Ask for next-edit suggestions after an edit and a pause.
---@field next_edit_delay_ms integer The pause (no typing, no cursor move) before asking.
M.defaults = {
  cmd = { 'llada-lsp' },
  model = nil,
  engine = nil,
  token_file = nil,
  inline_mode = 'speed',
  rewrite_mode = 'quality',
  max_completion_tokens = 64,
  revise = true,
  filetypes = nil,
  root_markers = { '.git' },
  -- <M-Right> and <M-C-Right>: Neovim gives them no insert-mode meaning (its word motion is <C-Right>
  -- and <S-Right>), and copilot.vim accepts a word and a line with them, so hands may know them already.
  keymaps = { accept = '<Tab>', accept_word = '<M-Right>', accept_line = '<M-C-Right>', rewrite = '<leader>lr' },
  debounce_ms = 150,
  force_fallback = false,
  review = true,
  next_edit = true,
  next_edit_delay_ms = 400,
}

local function is_mode(v)
  return v == 'speed' or v == 'quality'
end

--- The values `llada-lsp --engine` takes: `auto`, `local`, `unix:PATH` or `tcp://HOST:PORT`.
local function is_engine(v)
  return type(v) == 'string'
    and (v == 'auto' or v == 'local' or v:match('^unix:.') ~= nil or v:match('^tcp://[^/]*:%d+$') ~= nil)
end

local function is_key(v)
  return v == false or type(v) == 'string'
end

---@param opts? table
---@return llada.Config
function M.resolve(opts)
  vim.validate('opts', opts, 'table', true)
  local cfg = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts or {})
  -- Lists are replaced, not merged index by index: a shorter user `cmd` must not keep default tails.
  for _, key in ipairs({ 'cmd', 'filetypes', 'root_markers' }) do
    if opts and opts[key] ~= nil then
      cfg[key] = opts[key]
    end
  end
  vim.validate('cmd', cfg.cmd, 'table')
  vim.validate('model', cfg.model, 'string', true)
  vim.validate('engine', cfg.engine, is_engine, true, '"auto", "local", "unix:PATH" or "tcp://HOST:PORT"')
  vim.validate('token_file', cfg.token_file, 'string', true)
  vim.validate('inline_mode', cfg.inline_mode, is_mode, '"speed" or "quality"')
  vim.validate('rewrite_mode', cfg.rewrite_mode, is_mode, '"speed" or "quality"')
  vim.validate('max_completion_tokens', cfg.max_completion_tokens, function(v)
    return type(v) == 'number' and v >= 1 and v <= 512 and v == math.floor(v)
  end, 'integer in 1..512')
  vim.validate('revise', cfg.revise, 'boolean')
  vim.validate('filetypes', cfg.filetypes, 'table', true)
  vim.validate('root_markers', cfg.root_markers, 'table')
  vim.validate('keymaps', cfg.keymaps, 'table')
  for _, name in ipairs({ 'accept', 'accept_word', 'accept_line' }) do
    vim.validate('keymaps.' .. name, cfg.keymaps[name], is_key, 'key string or false')
  end
  vim.validate('keymaps.rewrite', cfg.keymaps.rewrite, is_key, 'key string or false')
  vim.validate('debounce_ms', cfg.debounce_ms, 'number')
  vim.validate('force_fallback', cfg.force_fallback, 'boolean')
  vim.validate('review', cfg.review, 'boolean')
  vim.validate('next_edit', cfg.next_edit, 'boolean')
  vim.validate('next_edit_delay_ms', cfg.next_edit_delay_ms, function(v)
    return type(v) == 'number' and v >= 0 and v == math.floor(v)
  end, 'integer >= 0')
  return cfg
end

--- The command that starts the server: `cmd`, then `--engine` and `--token-file` when they are set.
---@param cfg llada.Config
---@return string[]
function M.server_cmd(cfg)
  local cmd = vim.list_extend({}, cfg.cmd)
  if cfg.engine then
    vim.list_extend(cmd, { '--engine', cfg.engine })
  end
  if cfg.token_file then
    -- No shell runs the command: expand `~` and $VARS here, as a user typing the path would expect.
    vim.list_extend(cmd, { '--token-file', vim.fs.normalize(cfg.token_file) })
  end
  return cmd
end

--- The server's initializationOptions (docs/protocol.md): camelCase, absent keys take the server default.
---@param cfg llada.Config
---@return table
function M.init_options(cfg)
  return {
    model = cfg.model,
    inlineMode = cfg.inline_mode,
    rewriteMode = cfg.rewrite_mode,
    maxCompletionTokens = cfg.max_completion_tokens,
    nextEdit = cfg.next_edit,
    nextEditDelayMs = cfg.next_edit_delay_ms,
    revise = cfg.revise,
  }
end

return M
