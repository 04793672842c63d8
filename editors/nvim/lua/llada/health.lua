--- :checkhealth llada
local health = vim.health

local M = {}

---@param client vim.lsp.Client
local function check_client(client)
  local buffers = vim.tbl_count(client.attached_buffers)
  local what = ('client %d, attached to %d buffer%s'):format(client.id, buffers, buffers == 1 and '' or 's')
  if not client.initialized then
    health.warn(what .. ' is still starting')
    return
  end
  local reply, err = client:request_sync('workspace/executeCommand', { command = 'llada.status' }, 2000)
  if not reply or reply.err or type(reply.result) ~= 'table' then
    local why = err or (reply and reply.err and reply.err.message) or 'no result'
    health.error(what .. ': llada.status failed: ' .. why)
    return
  end
  local s = reply.result
  -- `engine` is "local" (the model runs in the server) or the address of an engine service.
  local engine = s.engine and (', engine %s'):format(s.engine) or ''
  local line = ('%s: model %s%s, state %s, inline %s, rewrite %s'):format(
    what,
    s.model,
    engine,
    s.state,
    s.inlineMode,
    s.rewriteMode
  )
  if s.state == 'ready' then
    health.ok(line)
  elseif s.state == 'loading' then
    health.info(line)
  elseif s.state == 'unavailable' then
    health.error(
      line .. ': ' .. (s.error or 'the engine service does not answer'),
      'Start the service (`llada-lsp engine`), or set `engine` in setup() (e.g. "local").'
    )
  else
    health.error(line .. ': ' .. (s.error or 'no reason given'), 'Set `model` to one that loads.')
  end
end

function M.check()
  local info = require('llada').health_info()
  local cfg = info.config

  health.start('llada: Neovim')
  local version = tostring(vim.version())
  if vim.fn.has('nvim-0.11') == 1 then
    health.ok('Neovim ' .. version)
  else
    health.error('Neovim ' .. version .. ': llada needs 0.11 or later')
  end
  if info.fallback then
    local why = cfg.force_fallback and '`force_fallback` is set'
      or 'this Neovim has no vim.lsp.inline_completion'
    health.info(('Ghost text: the plugin draws it (%s).'):format(why))
  else
    health.info('Ghost text: vim.lsp.inline_completion draws completions, the plugin the live drafts.')
  end
  local groups = info.fallback and 'LladaGhost' or 'LladaGhost (drafts) and ComplHint (completions)'
  if vim.o.termguicolors then
    health.ok(("'termguicolors' is on: ghost text uses the GUI colours of %s."):format(groups))
  else
    health.info(
      ("'termguicolors' is off: ghost text uses the terminal colours of %s, "):format(groups)
        .. 'by default grey and italic where the colour scheme gives Comment no terminal colour.'
    )
  end

  health.start('llada: server')
  if not info.configured then
    health.warn('setup() was not called.', 'Call require("llada").setup() in your config.')
  end
  local cmd = cfg.cmd[1]
  if cmd and vim.fn.executable(cmd) == 1 then
    local full = table.concat(require('llada.config').server_cmd(cfg), ' ')
    health.ok(('Server command: %s (%s)'):format(full, vim.fn.exepath(cmd)))
  else
    health.error(
      ('Server command not executable: %s'):format(tostring(cmd)),
      { 'Install the llada-lsp Python package, or set `cmd` in setup().' }
    )
  end
  local clients = vim.lsp.get_clients({ name = 'llada' })
  if #clients == 0 then
    health.info('No llada client is running: it starts with the first file buffer of a served filetype.')
  end
  for _, client in ipairs(clients) do
    check_client(client)
  end
end

return M
