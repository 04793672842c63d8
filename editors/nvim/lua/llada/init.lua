--- The llada plugin: setup(), the server registration, user commands, keymaps and the statusline.
--- Ghost text lives in llada.ghost and live drafts in llada.draft; this file draws nothing itself.
local api = vim.api
local buffer = require('llada.buffer')
local builtin = require('llada.builtin')
local config = require('llada.config')
local draft = require('llada.draft')
local ghost = require('llada.ghost')
local highlight = require('llada.highlight')
local next_edit = require('llada.next_edit')
local partial = require('llada.partial')
local review = require('llada.review')
local through = require('llada.through')

local M = {}

local INLINE = 'textDocument/inlineCompletion'
local cfg = config.resolve() ---@type llada.Config
local configured = false -- setup() was called
local server_status = {} ---@type table<integer, table> client id -> last `llada.status` result
local rewriting = {} ---@type table<integer, true> buffers with a rewrite in flight

local function redraw_status()
  vim.schedule(function()
    vim.cmd.redrawstatus()
  end)
end

local loading_said = {} ---@type table<integer, true> clients whose model load the user was told of

--- Records {status} (a `llada.status` result, asked or pushed) for {client_id} and redraws the
--- statusline. A load is said on screen when it starts and when it ends (one line each, not kept in
--- the message history): the statusline is not everyone's, and until then no ghost text comes.
---@param client_id integer
---@param status table
local function set_status(client_id, status)
  server_status[client_id] = status
  redraw_status()
  local said = loading_said[client_id]
  local message
  if status.state == 'loading' and not said then
    loading_said[client_id] = true
    message = { 'llada: loading the model…', 'MoreMsg' }
  elseif status.state ~= 'loading' and said then
    loading_said[client_id] = nil
    message = status.state == 'ready' and { 'llada: model ready', 'MoreMsg' } or nil
  end
  if message then
    vim.schedule(function()
      api.nvim_echo({ message }, false, {})
    end)
  end
end

---@param bufnr integer
---@return vim.lsp.Client?
local function client_for(bufnr)
  return vim.lsp.get_clients({ bufnr = bufnr, name = 'llada' })[1]
end

---@param client vim.lsp.Client
---@param command string
---@return boolean
local function supports_command(client, command)
  local provider = client.server_capabilities and client.server_capabilities.executeCommandProvider
  return type(provider) == 'table' and vim.list_contains(provider.commands or {}, command)
end

---@param msg string
---@param level? integer
local function notify(msg, level)
  vim.notify('llada: ' .. msg, level or vim.log.levels.INFO)
end

--- Asks the server for `llada.status`; while the model loads, asks again every second, until the
--- last status known (asked or pushed: `llada/status`) says it is no longer loading.
---@param client vim.lsp.Client
---@param on_result? fun(result: table)
local function refresh_status(client, on_result)
  if not supports_command(client, 'llada.status') then
    return
  end
  client:exec_cmd({ title = 'llada status', command = 'llada.status' }, {}, function(err, result)
    if err or type(result) ~= 'table' then
      notify('status failed: ' .. (err and err.message or 'no result'), vim.log.levels.ERROR)
      return
    end
    set_status(client.id, result)
    if on_result then
      on_result(result)
    end
    if result.state == 'loading' and not on_result then
      vim.defer_fn(function()
        local last = server_status[client.id]
        if not client:is_stopped() and (not last or last.state == 'loading') then
          refresh_status(client)
        end
      end, 1000)
    end
  end)
end

--- Whether buffers use the plugin's own ghost text instead of vim.lsp.inline_completion: forced, on
--- Neovim 0.11, or where the plugin cannot guard the built-in completer (llada.builtin).
local function use_fallback()
  return cfg.force_fallback or not builtin.available()
end

---@param bufnr integer
---@return boolean
local function inline_pending(bufnr)
  for _, client in ipairs(vim.lsp.get_clients({ bufnr = bufnr })) do
    for _, r in pairs(client.requests) do
      if r.bufnr == bufnr and r.method == INLINE and r.type == 'pending' then
        return true
      end
    end
  end
  return false
end

--- Drops the item the built-in completer holds for {bufnr} (an older answer, or one that landed just
--- after a draft was accepted), unless a newer request is on its way. get() with a no-op on_accept is
--- the public way to drop it; it also cancels pending requests, hence the check.
---@param bufnr integer
local function dismiss_builtin(bufnr)
  if not inline_pending(bufnr) then
    vim.lsp.inline_completion.get({ bufnr = bufnr, on_accept = function() end })
  end
end

--- Guards the inline requests of {client} (llada.builtin: asked only from where the user is, answers
--- only for the text they were asked for) and makes a failed one take its ghost text off the screen.
--- The built-in completer keeps the item of its last answer when a request fails, and shows it again at
--- each keystroke (what the user types eats into it): with the engine gone, stale text would stay.
---@param client vim.lsp.Client
local function guard_inline(client)
  builtin.guard_requests(client, function(bufnr)
    -- A newer request of the buffer owns what is on screen now.
    if not inline_pending(bufnr) then
      ghost.clear(bufnr)
      if not ghost.is_fallback(bufnr) and vim.lsp.inline_completion then
        dismiss_builtin(bufnr)
      end
    end
  end)
end

--- Handler of the server's `llada/status` notification, sent once per change of state with what
--- `llada.status` answers: the statusline follows it without asking.
---@param params table
---@param ctx lsp.HandlerContext
local function on_status(_, params, ctx)
  set_status(ctx.client_id, params)
end

--- Handler of the server's `window/showMessage` (the engine service lost or back, a model that cannot
--- load): one line at most. A longer one opens the hit-enter prompt, which would take the next key
--- typed in insert mode; the whole reason stays in `:LladaStatus` (and the server's log, `:LspLog`).
---@param params lsp.ShowMessageParams
local function on_show_message(_, params)
  local levels = { vim.log.levels.ERROR, vim.log.levels.WARN, vim.log.levels.INFO, vim.log.levels.DEBUG }
  local msg = params.message:gsub('%s+', ' ')
  local room = math.max(vim.v.echospace, 20)
  if vim.fn.strdisplaywidth(msg) > room then
    msg = vim.fn.strcharpart(msg, 0, room - 1) .. '…'
  end
  vim.notify(msg, levels[params.type] or vim.log.levels.INFO)
end

--- The built-in completer's item, as it shows it: typed through since its answer, it shows the rest,
--- and where the line after its place starts like the item, it shows the item past those characters;
--- what it shows is inserted where it shows it (its own accept would insert the whole answer where it
--- was made, repeating what was typed or skipped). With {take} (a partial accept) only that start of it
--- is inserted, and the rest becomes the plugin's ghost text: the built-in completer cannot show an
--- item typed through across a line break, and drops it when it is taken anyway. Nothing shown, nothing
--- accepted: an item the completer holds but does not draw (a draft drew over it) is not inserted.
---@param bufnr integer
---@param take? fun(text: string): integer
---@return boolean
local function accept_builtin(bufnr, take)
  builtin.check(bufnr) -- an item the text no longer fits (a Delete since) is dropped, not inserted
  local win = ghost.insert_window(bufnr)
  local shown = win and through.builtin_shown(bufnr, win)
  if not shown then
    return false
  end
  local tick = api.nvim_buf_get_changedtick(bufnr)
  return vim.lsp.inline_completion.get({
    bufnr = bufnr,
    on_accept = function()
      if api.nvim_buf_is_valid(bufnr) and api.nvim_buf_get_changedtick(bufnr) == tick then
        ghost.accept_text(bufnr, win, { shown.row + 1, shown.col }, shown.text, take)
      end
    end,
  })
end

--- An accept key: inserts what is on screen, or with {take} its next word or line (llada.partial) and
--- leaves the rest shown; returns false when nothing is shown.
---@param bufnr integer
---@param fallback boolean
---@param take? fun(text: string): integer
---@return boolean
local function accept(bufnr, fallback, take)
  -- The plugin's ghost text: a live draft on either path, the fallback completer's answer, or the rest
  -- of a partly accepted suggestion.
  local accepted = ghost.accept(bufnr, take)
  if accepted == 'draft' or (accepted and not fallback) then
    -- The user took what was shown; the rest of its request (a draft's, or on the built-in path the
    -- revision on its way, which the built-in completer would draw at its old place) would only
    -- replace it. The fallback completer drops an answer to an older text itself.
    if fallback then
      draft.cancel(bufnr)
    else
      local function dismiss()
        dismiss_builtin(bufnr)
      end
      draft.cancel(bufnr, dismiss)
      vim.schedule(dismiss) -- after the insertion, which ghost.accept() scheduled
    end
    return true
  end
  if accepted ~= nil or (not fallback and accept_builtin(bufnr, take)) then
    return true
  end
  return not take and next_edit.tab(bufnr) -- no inline completion shown: the next edit's jump or accept
end

---@param client vim.lsp.Client
---@param bufnr integer
---@param group integer
local function on_attach(client, bufnr, group)
  local fallback = use_fallback()
  ghost.attach(bufnr, client, { fallback = fallback, debounce_ms = cfg.debounce_ms, group = group })
  if not fallback then
    vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
    -- A key that changes the text without moving the cursor (Delete) draws nothing: the built-in
    -- completer's item, which it would draw or accept at its old range, is checked here.
    api.nvim_create_autocmd('TextChangedI', {
      group = group,
      buffer = bufnr,
      callback = function()
        builtin.check(bufnr)
      end,
    })
  end
  next_edit.attach(bufnr, client, { enabled = cfg.next_edit, delay_ms = cfg.next_edit_delay_ms, group = group,
                                    accept_key = cfg.keymaps.accept })
  local keys = cfg.keymaps
  local accept_keys = {
    { keys.accept, nil, 'llada: accept the inline completion' },
    { keys.accept_word, partial.word, 'llada: accept the next word of the inline completion' },
    { keys.accept_line, partial.line, 'llada: accept the next line of the inline completion' },
  }
  for _, k in ipairs(accept_keys) do
    local lhs, take, desc = k[1], k[2], k[3]
    if lhs then
      vim.keymap.set('i', lhs, function()
        if not accept(bufnr, fallback, take) then
          return lhs -- nothing shown: the key does what it always does
        end
      end, { buffer = bufnr, expr = true, desc = desc })
    end
  end
  if keys.rewrite then
    vim.keymap.set('x', keys.rewrite, function()
      M.rewrite_visual()
    end, { buffer = bufnr, desc = 'llada: rewrite the selection' })
  end
  if not server_status[client.id] then
    refresh_status(client)
  end
end

---@param bufnr integer
local function on_detach(bufnr)
  ghost.detach(bufnr)
  next_edit.detach(bufnr)
  draft.forget(bufnr)
  builtin.forget(bufnr)
  rewriting[bufnr] = nil
  buffer.del_keymaps(bufnr, { 'i', 'x' }, function(desc)
    return vim.startswith(desc, 'llada: ')
  end)
end

--- LSP range and text of a byte span of {bufnr}: rows 0-based, columns 0-based bytes (clamped to the
--- line), end exclusive.
---@param bufnr integer
---@param encoding string
---@return lsp.Range range
---@return string text
local function lsp_span(bufnr, encoding, srow, scol, erow, ecol)
  local first = api.nvim_buf_get_lines(bufnr, srow, srow + 1, true)[1]
  local last = api.nvim_buf_get_lines(bufnr, erow, erow + 1, true)[1]
  scol, ecol = math.min(scol, #first), math.min(ecol, #last)
  local range = {
    start = { line = srow, character = vim.str_utfindex(first, encoding, scol, false) },
    ['end'] = { line = erow, character = vim.str_utfindex(last, encoding, ecol, false) },
  }
  return range, table.concat(api.nvim_buf_get_text(bufnr, srow, scol, erow, ecol, {}), '\n')
end

--- Reports the outcome of a rewrite of {original}: an error, a refusal with its reason, or no change.
---@param err? lsp.ResponseError
---@param result? {applied: boolean, text: string, reason?: string}
---@param original string
local function report_rewrite(err, result, original)
  if err then
    notify('rewrite failed: ' .. err.message, vim.log.levels.ERROR)
  elseif type(result) ~= 'table' then
    notify('rewrite failed: the server sent no result', vim.log.levels.ERROR)
  elseif not result.applied and result.reason ~= review.UNCHANGED and result.reason ~= review.DISCARDED then
    notify('rewrite not applied: ' .. (result.reason or 'the edit was refused'), vim.log.levels.WARN)
  elseif result.text == original or result.reason == review.UNCHANGED then
    notify('the rewrite proposes no change', vim.log.levels.WARN)
  elseif result.reason == review.DISCARDED then
    notify('rewrite discarded')
  end
end

--- Sends `llada.rewriteSelection` for {range} of {bufnr}, whose text is {original}. The server sends
--- the rewrite back with workspace/applyEdit, which the client's handler reviews and applies.
---@param bufnr integer
---@param range lsp.Range
---@param original string
---@param instruction? string
local function rewrite(bufnr, range, original, instruction)
  local client = client_for(bufnr)
  if not client then
    notify('no llada server attached to this buffer', vim.log.levels.WARN)
    return
  end
  if not supports_command(client, 'llada.rewriteSelection') then
    notify('the server does not offer llada.rewriteSelection', vim.log.levels.WARN)
    return
  end
  local argument = {
    textDocument = { uri = vim.uri_from_bufnr(bufnr), version = vim.lsp.util.buf_versions[bufnr] },
    range = range,
    instruction = instruction,
  }
  rewriting[bufnr] = true
  redraw_status()
  client:exec_cmd(
    { title = 'llada rewrite', command = 'llada.rewriteSelection', arguments = { argument } },
    { bufnr = bufnr },
    function(err, result)
      rewriting[bufnr] = nil
      redraw_status()
      report_rewrite(err, result, original)
      if api.nvim_buf_is_valid(bufnr) then
        api.nvim_exec_autocmds('User', {
          pattern = 'LladaRewrite',
          modeline = false,
          data = { bufnr = bufnr, result = result, error = err and err.message },
        })
      end
    end
  )
end

--- Rewrites lines {line1}..{line2} (1-based, inclusive) of {bufnr}, or the exact characters of the
--- last visual selection when it was characterwise and covers these lines.
---@param bufnr integer
---@param line1 integer
---@param line2 integer
---@param instruction? string
function M.rewrite_lines(bufnr, line1, line2, instruction)
  local client = client_for(bufnr)
  local encoding = client and client.offset_encoding or 'utf-16'
  local vstart, vend = api.nvim_buf_get_mark(bufnr, '<'), api.nvim_buf_get_mark(bufnr, '>')
  local range, original
  if vim.fn.visualmode() == 'v' and vstart[1] == line1 and vend[1] == line2 then
    local last = api.nvim_buf_get_lines(bufnr, vend[1] - 1, vend[1], true)[1]
    -- '> marks the first byte of the last selected character; LSP ends are exclusive.
    local ecol = vend[2] < #last and vend[2] + 1 + vim.str_utf_end(last, vend[2] + 1) or #last
    range, original = lsp_span(bufnr, encoding, vstart[1] - 1, vstart[2], vend[1] - 1, ecol)
  else
    range, original = lsp_span(bufnr, encoding, line1 - 1, 0, line2 - 1, math.huge)
  end
  rewrite(bufnr, range, original, instruction)
end

--- Rewrites the visual selection of the current buffer, asking for an optional instruction.
function M.rewrite_visual()
  local bufnr = api.nvim_get_current_buf()
  -- Leaving visual mode sets the '< and '> marks that rewrite_lines reads.
  api.nvim_feedkeys(api.nvim_replace_termcodes('<Esc>', true, false, true), 'nx', false)
  local line1, line2 = api.nvim_buf_get_mark(bufnr, '<')[1], api.nvim_buf_get_mark(bufnr, '>')[1]
  vim.ui.input({ prompt = 'llada instruction (optional): ' }, function(input)
    if input ~= nil and api.nvim_buf_is_valid(bufnr) then
      M.rewrite_lines(bufnr, line1, line2, input ~= '' and input or nil)
    end
  end)
end

--- Switches the inline completion mode of every running llada server, and of those started later.
---@param mode "speed"|"quality"
function M.set_mode(mode)
  if mode ~= 'speed' and mode ~= 'quality' then
    notify('mode must be "speed" or "quality", not ' .. vim.inspect(mode), vim.log.levels.ERROR)
    return
  end
  cfg.inline_mode = mode
  vim.lsp.config('llada', { init_options = { inlineMode = mode } })
  for _, client in ipairs(vim.lsp.get_clients({ name = 'llada' })) do
    client:notify('workspace/didChangeConfiguration', { settings = { llada = { inlineMode = mode } } })
    if server_status[client.id] then
      server_status[client.id].inlineMode = mode
    end
  end
  redraw_status()
end

--- Asks the server of the current buffer for `llada.status` and echoes it.
function M.status()
  local client = client_for(api.nvim_get_current_buf())
  if not client then
    notify('no llada server attached to this buffer', vim.log.levels.WARN)
    return
  end
  refresh_status(client, function(s)
    local parts = {
      ('llada: %s'):format(s.state),
      ('model %s'):format(s.model),
    }
    if s.engine then
      parts[#parts + 1] = ('engine %s'):format(s.engine)
    end
    vim.list_extend(parts, {
      ('inline %s'):format(s.inlineMode),
      ('rewrite %s'):format(s.rewriteMode),
    })
    if s.error then
      parts[#parts + 1] = 'error: ' .. s.error
    end
    api.nvim_echo({ { table.concat(parts, ', ') } }, true, {})
  end)
end

--- What |:checkhealth| reports: the options in use, whether setup() ran, which ghost text path
--- buffers use.
---@return {config: llada.Config, configured: boolean, fallback: boolean}
function M.health_info()
  return { config = cfg, configured = configured, fallback = use_fallback() }
end

--- Short state of the llada server of the current buffer, for 'statusline'; '' when none is attached.
--- e.g. "llada: ready speed", "llada: generating", "llada: loading".
---@return string
function M.statusline()
  local bufnr = api.nvim_get_current_buf()
  local client = client_for(bufnr)
  if not client then
    return ''
  end
  local s = server_status[client.id]
  if not client.initialized or not s then
    return 'llada: starting'
  elseif s.state ~= 'ready' then
    return 'llada: ' .. s.state
  elseif rewriting[bufnr] then
    return 'llada: rewriting'
  elseif draft.is_pending(bufnr) then
    return 'llada: generating'
  end
  return 'llada: ready ' .. s.inlineMode
end

local function create_commands()
  api.nvim_create_user_command('LladaRewrite', function(o)
    M.rewrite_lines(api.nvim_get_current_buf(), o.line1, o.line2, o.args ~= '' and o.args or nil)
  end, { range = true, nargs = '*', desc = 'llada: rewrite the range, following the optional instruction' })
  api.nvim_create_user_command('LladaMode', function(o)
    M.set_mode(o.args)
  end, {
    nargs = 1,
    complete = function()
      return { 'speed', 'quality' }
    end,
    desc = 'llada: set the inline completion mode',
  })
  api.nvim_create_user_command('LladaStatus', M.status, { desc = 'llada: show the server status' })
end

--- Configures and enables the llada language server. See |llada-setup|.
---@param opts? table
function M.setup(opts)
  cfg = config.resolve(opts)
  configured = true
  local group = api.nvim_create_augroup('llada', { clear = true })
  highlight.define()
  api.nvim_create_autocmd('ColorScheme', { group = group, callback = highlight.define })
  -- LspAttach/LspDetach fire for every server; only llada's concern us.
  local function for_llada(handler)
    return function(args)
      local client = vim.lsp.get_client_by_id(args.data.client_id)
      if client and client.name == 'llada' then
        handler(client, args.buf)
      end
    end
  end
  api.nvim_create_autocmd('LspAttach', {
    group = group,
    callback = for_llada(function(client, buf)
      on_attach(client, buf, group)
    end),
  })
  api.nvim_create_autocmd('LspDetach', {
    group = group,
    callback = for_llada(function(_, buf)
      on_detach(buf)
    end),
  })
  api.nvim_create_autocmd('LspRequest', { group = group, callback = draft.on_request })
  create_commands()

  vim.lsp.config('llada', {
    cmd = config.server_cmd(cfg),
    filetypes = cfg.filetypes,
    root_markers = cfg.root_markers, -- read by the root_dir of lsp/llada.lua
    init_options = config.init_options(cfg),
    -- As lsp/llada.lua: drafts, and the versioned documentChanges Neovim applies without saying so.
    capabilities = { experimental = { lladaDrafts = true }, workspace = { workspaceEdit = { documentChanges = true } } },
    on_init = guard_inline,
    handlers = {
      ['llada/draft'] = draft.on_draft,
      ['llada/status'] = on_status,
      ['window/showMessage'] = on_show_message,
      ['workspace/applyEdit'] = function(err, params, ctx)
        if cfg.review then
          return review.apply_edit(err, params, ctx)
        end
        return vim.lsp.handlers['workspace/applyEdit'](err, params, ctx)
      end,
    },
  })
  vim.lsp.enable('llada')
end

return M
