--- Next-edit suggestions (`llada/nextEdit`): asked after the user has changed the buffer and then been
--- idle for `next_edit_delay_ms`; shown as a diff at its place (removed text struck through, added text
--- as ghost text and virtual lines) with a hint on the cursor's line when it is elsewhere; <Tab> jumps
--- to it, <Tab> again accepts it; <Esc>, or typing on, dismisses it. Knows nothing about inline
--- completions: init.lua's accept key asks tab() only when no inline completion is shown.
local api = vim.api
local buffer = require('llada.buffer')

local M = {}

M.ns = api.nvim_create_namespace('llada.next_edit')
local METHOD = 'llada/nextEdit'

---@class llada.NextEditShown
---@field edits {range: lsp.Range, newText: string}[]
---@field tick integer changedtick it was shown for
---@field jumped boolean the cursor was moved to it by tab()

---@class llada.NextEditBuffer
---@field client vim.lsp.Client
---@field delay_ms integer
---@field timer? uv.uv_timer_t
---@field asked_tick? integer changedtick of the last request: no second request without an edit
---@field dismissed_tick? integer changedtick at the last dismissal
---@field request_id? integer
---@field shown? llada.NextEditShown
---@field off? boolean the server said it cannot suggest (e.g. the SGLang backend)

local buffers = {} ---@type table<integer, llada.NextEditBuffer>

function M.define_highlights()
  api.nvim_set_hl(0, 'LladaNextEditDelete', { default = true, strikethrough = true, link = 'DiffDelete' })
  api.nvim_set_hl(0, 'LladaNextEditAdd', { default = true, link = 'DiffAdd' })
  api.nvim_set_hl(0, 'LladaNextEditHint', { default = true, link = 'LladaGhost' })
end

---@param bufnr integer
---@param pos lsp.Position
---@param encoding string
---@return integer row, integer col 0-based, bytes
local function byte_pos(bufnr, pos, encoding)
  local line = api.nvim_buf_get_lines(bufnr, pos.line, pos.line + 1, false)[1] or ''
  return pos.line, vim.str_byteindex(line, encoding, pos.character, false)
end

--- Takes the suggestion off the screen (and out of the state).
---@param bufnr integer
function M.clear(bufnr)
  local state = buffers[bufnr]
  if state then
    state.shown = nil
  end
  if api.nvim_buf_is_valid(bufnr) then
    api.nvim_buf_clear_namespace(bufnr, M.ns, 0, -1)
  end
end

--- Whether a suggestion is on screen in {bufnr} (0: the current buffer).
---@param bufnr integer
---@return boolean
function M.is_shown(bufnr)
  bufnr = bufnr == 0 and api.nvim_get_current_buf() or bufnr
  return buffers[bufnr] ~= nil and buffers[bufnr].shown ~= nil
end

---@param bufnr integer
---@param state llada.NextEditBuffer
---@param edits {range: lsp.Range, newText: string}[]
local function show(bufnr, state, edits)
  M.clear(bufnr)
  local encoding = state.client.offset_encoding
  local first_row
  for _, edit in ipairs(edits) do
    local sr, sc = byte_pos(bufnr, edit.range.start, encoding)
    local er, ec = byte_pos(bufnr, edit.range['end'], encoding)
    first_row = first_row or sr
    if sr ~= er or sc ~= ec then
      api.nvim_buf_set_extmark(bufnr, M.ns, sr, sc, { end_row = er, end_col = ec, hl_group = 'LladaNextEditDelete' })
    end
    if edit.newText ~= '' then
      local lines = vim.split(edit.newText, '\n', { plain = true })
      local virt_lines = {}
      for i = 2, #lines do
        virt_lines[#virt_lines + 1] = { { lines[i], 'LladaNextEditAdd' } }
      end
      api.nvim_buf_set_extmark(bufnr, M.ns, er, ec, {
        virt_text = { { lines[1], 'LladaNextEditAdd' } },
        virt_text_pos = 'inline',
        virt_lines = #virt_lines > 0 and virt_lines or nil,
      })
    end
  end
  local row = api.nvim_win_get_cursor(0)[1] - 1
  local last_row = byte_pos(bufnr, edits[#edits].range['end'], encoding)
  if row < first_row or row > last_row then
    api.nvim_buf_set_extmark(bufnr, M.ns, row, 0, {
      virt_text = { { ('  ⇥ next edit at line %d (Tab)'):format(first_row + 1), 'LladaNextEditHint' } },
      virt_text_pos = 'eol',
    })
  end
  state.shown = { edits = edits, tick = api.nvim_buf_get_changedtick(bufnr), jumped = false }
  api.nvim_exec_autocmds('User', { pattern = 'LladaNextEdit', modeline = false, data = { bufnr = bufnr, edits = edits } })
end

--- Asks the server for a next edit at the cursor, unless one is shown, nothing changed since the last
--- request or dismissal, or the buffer is not the current one.
---@param bufnr integer
local function ask(bufnr)
  local state = buffers[bufnr]
  if not state or state.off or state.shown or bufnr ~= api.nvim_get_current_buf() then
    return
  end
  local tick = api.nvim_buf_get_changedtick(bufnr)
  if tick == state.asked_tick or tick == state.dismissed_tick or state.client:is_stopped() then
    return
  end
  if state.request_id then
    state.client:cancel_request(state.request_id)
  end
  state.asked_tick = tick
  local version = vim.lsp.util.buf_versions[bufnr]
  local params = vim.lsp.util.make_position_params(0, state.client.offset_encoding)
  params.textDocument.version = version
  local ok, id = state.client:request(METHOD, params, function(err, result)
    vim.schedule(function()
      state.request_id = nil
      if err then
        if err.message and err.message:find('not supported') then
          state.off = true -- the backend cannot: asking again on every pause would only fail again
        end
        return
      end
      if not api.nvim_buf_is_valid(bufnr) or api.nvim_buf_get_changedtick(bufnr) ~= tick then
        return -- typed on meanwhile: the edit is against text that changed
      end
      if type(result) ~= 'table' or type(result.edits) ~= 'table' or #result.edits == 0 then
        return
      end
      if result.version ~= vim.lsp.util.buf_versions[bufnr] then
        return
      end
      show(bufnr, state, result.edits)
    end)
  end, bufnr)
  state.request_id = ok and id or nil
end

---@param bufnr integer
local function restart_timer(bufnr)
  local state = buffers[bufnr]
  if not state then
    return
  end
  state.timer = state.timer or vim.uv.new_timer()
  state.timer:stop()
  state.timer:start(state.delay_ms, 0, function()
    vim.schedule(function()
      ask(bufnr)
    end)
  end)
end

--- Dismisses the suggestion, which is not asked for again until the buffer changes.
---@param bufnr integer
function M.dismiss(bufnr)
  local state = buffers[bufnr]
  if state and state.shown then
    state.dismissed_tick = api.nvim_buf_get_changedtick(bufnr)
    M.clear(bufnr)
  end
end

--- Applies the suggestion; the cursor goes to the end of its last edit.
---@param bufnr integer
local function accept(bufnr)
  local state = buffers[bufnr]
  local edits, encoding = state.shown.edits, state.client.offset_encoding
  M.clear(bufnr)
  local er, ec = byte_pos(bufnr, edits[#edits].range['end'], encoding)
  local mark = api.nvim_buf_set_extmark(bufnr, M.ns, er, ec, { right_gravity = true })
  vim.lsp.util.apply_text_edits(edits, bufnr, encoding)
  local pos = api.nvim_buf_get_extmark_by_id(bufnr, M.ns, mark, {})
  api.nvim_buf_clear_namespace(bufnr, M.ns, 0, -1)
  if pos[1] then
    local col = pos[2]
    if api.nvim_get_mode().mode ~= 'i' and col > 0 then
      col = col - 1 -- normal mode: on the last character of the edit, not past it
    end
    api.nvim_win_set_cursor(0, { pos[1] + 1, col })
  end
end

--- The accept key with no inline completion shown: jumps to the suggestion when the cursor is away
--- from it, accepts it when the cursor is there. False (the key does what it always does) when none is
--- shown, or before the jump when the cursor is in the line's leading whitespace (Tab indents there).
---@param bufnr integer
---@return boolean
function M.tab(bufnr)
  local state = buffers[bufnr]
  if not state or not state.shown or state.shown.tick ~= api.nvim_buf_get_changedtick(bufnr) then
    return false
  end
  local row, col = unpack(api.nvim_win_get_cursor(0))
  local line = api.nvim_get_current_line()
  local insert = api.nvim_get_mode().mode == 'i'
  local before = insert and line:sub(1, col) or line:sub(1, col + 1)
  if not state.shown.jumped and before:match('^%s*$') and (insert or line:sub(col + 1, col + 1):match('%s')) then
    return false
  end
  local sr, sc = byte_pos(bufnr, state.shown.edits[1].range.start, state.client.offset_encoding)
  local er = byte_pos(bufnr, state.shown.edits[#state.shown.edits].range['end'], state.client.offset_encoding)
  -- Scheduled: tab() runs inside <expr> mappings, where the cursor moved is put back and text is locked.
  local shown = state.shown
  if not shown.jumped and (row - 1 < sr or row - 1 > er) then
    shown.jumped = true
    vim.schedule(function()
      if api.nvim_buf_is_valid(bufnr) and state.shown == shown then
        api.nvim_buf_clear_namespace(bufnr, M.ns, row - 1, row) -- the jump hint
        api.nvim_win_set_cursor(0, { sr + 1, sc })
      end
    end)
    return true
  end
  vim.schedule(function()
    if api.nvim_buf_is_valid(bufnr) and state.shown == shown then
      accept(bufnr)
    end
  end)
  return true
end

---@param bufnr integer
---@param client vim.lsp.Client
---@param opts {delay_ms: integer, group: integer, enabled: boolean, accept_key: string|false}
function M.attach(bufnr, client, opts)
  if not opts.enabled then
    return
  end
  M.define_highlights()
  buffers[bufnr] = { client = client, delay_ms = opts.delay_ms }
  api.nvim_create_autocmd({ 'TextChanged', 'TextChangedI', 'TextChangedP' }, {
    group = opts.group,
    buffer = bufnr,
    callback = function()
      M.clear(bufnr) -- typing on dismisses
      restart_timer(bufnr)
    end,
  })
  api.nvim_create_autocmd({ 'CursorMoved', 'CursorMovedI', 'InsertLeave' }, {
    group = opts.group,
    buffer = bufnr,
    callback = function()
      restart_timer(bufnr)
    end,
  })
  api.nvim_create_autocmd('ColorScheme', { group = opts.group, callback = M.define_highlights })
  for _, mode in ipairs({ 'n', 'i' }) do
    vim.keymap.set(mode, '<Esc>', function()
      M.dismiss(bufnr)
      return '<Esc>'
    end, { buffer = bufnr, expr = true, desc = 'llada: dismiss the next edit' })
  end
  if opts.accept_key then
    vim.keymap.set('n', opts.accept_key, function()
      return M.tab(bufnr) and '' or opts.accept_key
    end, { buffer = bufnr, expr = true, desc = 'llada: jump to or accept the next edit' })
  end
end

---@param bufnr integer
function M.detach(bufnr)
  local state = buffers[bufnr]
  if not state then
    return
  end
  buffer.close_timer(state)
  M.clear(bufnr)
  buffers[bufnr] = nil
  buffer.del_keymaps(bufnr, { 'n', 'i' }, function(desc)
    return desc:find('next edit', 1, true) ~= nil
  end)
end

return M
