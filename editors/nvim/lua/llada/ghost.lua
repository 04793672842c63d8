--- Ghost text: one extmark per buffer in the `llada` namespace, and the fallback completer that feeds it
--- where Neovim has no vim.lsp.inline_completion (0.11). Knows nothing about drafts or commands.
local api = vim.api
local buffer = require('llada.buffer')
local through = require('llada.through')

local M = {}

M.ns = api.nvim_create_namespace('llada')

---@class llada.GhostItem
---@field text string
---@field row integer 0-based
---@field col integer 0-based byte column
---@field tick integer changedtick the text was drawn for
---@field line string the text of line {row} then
---@field kind "draft"|"answer"
---@field at integer the cursor's byte column when it was drawn: {col}, or before it (inside a word)

---@class llada.GhostBuffer
---@field fallback boolean this buffer asks for inline completions itself
---@field item? llada.GhostItem what the extmark shows, which accept() inserts
---@field timer? uv.uv_timer_t debounce of the fallback requests
---@field request? {client: vim.lsp.Client, id: integer} the fallback request in flight

local buffers = {} ---@type table<integer, llada.GhostBuffer>

---@param bufnr integer
function M.clear(bufnr)
  local state = buffers[bufnr]
  if state then
    state.item = nil
  end
  if api.nvim_buf_is_valid(bufnr) then
    api.nvim_buf_clear_namespace(bufnr, M.ns, 0, -1)
  end
end

--- Replaces the ghost text of {bufnr} by {text} at ({row}, {col}): the first line inline, the rest
--- as virtual lines below.
---@param bufnr integer
---@param row integer 0-based
---@param col integer 0-based byte column
---@param text string
---@param kind "draft"|"answer"
---@param at? integer the cursor's column, where it is before {col} (the rest of a word between)
function M.show(bufnr, row, col, text, kind, at)
  M.clear(bufnr)
  -- Only where the line has room: a place past its end is one from an older text.
  local line = text ~= '' and row < api.nvim_buf_line_count(bufnr) and api.nvim_buf_get_lines(bufnr, row, row + 1, true)[1]
  if not line or col > #line then
    return
  end
  local lines = vim.split(text, '\n', { plain = true })
  local virt_lines = {}
  for i = 2, #lines do
    virt_lines[#virt_lines + 1] = { { lines[i], 'LladaGhost' } }
  end
  api.nvim_buf_set_extmark(bufnr, M.ns, row, col, {
    virt_text = { { lines[1], 'LladaGhost' } },
    virt_text_pos = 'inline',
    virt_lines = #virt_lines > 0 and virt_lines or nil,
    hl_mode = 'combine',
  })
  if buffers[bufnr] then
    local tick = api.nvim_buf_get_changedtick(bufnr)
    buffers[bufnr].item = { text = text, row = row, col = col, tick = tick, line = line, kind = kind, at = at or col }
  end
end

---@param bufnr integer
---@return "draft"|"answer"|nil
function M.shown(bufnr)
  local item = buffers[bufnr] and buffers[bufnr].item
  return item and item.kind
end

---@param bufnr integer
---@return boolean
function M.is_fallback(bufnr)
  return buffers[bufnr] ~= nil and buffers[bufnr].fallback
end

--- The window showing {bufnr} if it is the current one, in insert mode, else nil.
---@param bufnr integer
---@return integer?
function M.insert_window(bufnr)
  local win = api.nvim_get_current_win()
  if api.nvim_win_get_buf(win) ~= bufnr or not api.nvim_get_mode().mode:find('^i') then
    return nil
  end
  return win
end

---@param state llada.GhostBuffer
local function cancel(state)
  local request = state.request
  state.request = nil
  -- Not once answered or cancelled already (a cancelled request's answer never reaches on_answer).
  local sent = request and request.client.requests[request.id]
  if sent and sent.type == 'pending' and not request.client:is_stopped() then
    request.client:cancel_request(request.id)
  end
end

--- Sends textDocument/inlineCompletion for the cursor of {bufnr} and shows the answer, unless the buffer
--- or the cursor moved meanwhile.
---@param bufnr integer
---@param client vim.lsp.Client
local function request(bufnr, client)
  local state = buffers[bufnr]
  local win = M.insert_window(bufnr)
  if not state or not win or client:is_stopped() then
    return
  end
  cancel(state)
  local tick = api.nvim_buf_get_changedtick(bufnr)
  local cursor = api.nvim_win_get_cursor(win)
  local params = vim.lsp.util.make_position_params(win, client.offset_encoding)
  params.context = { triggerKind = 2 } -- InlineCompletionTriggerKind.Automatic
  local id ---@type integer?
  local function on_answer(err, result)
    if state.request and state.request.id == id then
      state.request = nil
    end
    vim.schedule(function()
      if
        not api.nvim_buf_is_valid(bufnr)
        or buffers[bufnr] ~= state
        or api.nvim_buf_get_changedtick(bufnr) ~= tick
        or M.insert_window(bufnr) ~= win
        or not vim.deep_equal(api.nvim_win_get_cursor(win), cursor)
      then
        return
      end
      local items = result and (result.items or result) or {}
      local item = not err and items[1]
      if not item then
        M.clear(bufnr)
        return
      end
      -- insertText may be a StringValue (snippet); the server sends plain strings, shown verbatim.
      local text = type(item.insertText) == 'table' and item.insertText.value or item.insertText
      -- `range` starts at the cursor; inside a word it ends at the word's end and the text starts with
      -- the word's rest (`re|turn` -> `turn x`): only what follows the rest is new, shown after it.
      local row, col = cursor[1] - 1, cursor[2]
      local r = item.range
      if r and r['end'].line == r.start.line and r['end'].character > r.start.character then
        local line = api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
        local rest = line:sub(col + 1, col + (r['end'].character - r.start.character))
        if text:sub(1, #rest) ~= rest then
          M.clear(bufnr)
          return
        end
        text, col = text:sub(#rest + 1), col + #rest
      end
      M.show(bufnr, row, col, text, 'answer', cursor[2])
    end)
  end
  local ok, request_id = client:request('textDocument/inlineCompletion', params, on_answer, bufnr)
  if ok and request_id then
    id = request_id
    state.request = { client = client, id = request_id }
  end
end

--- Starts tracking {bufnr}: clears stale ghost text when the cursor moves, and with {opts.fallback}
--- requests inline completions itself, {opts.debounce_ms} after the last keystroke.
---@param bufnr integer
---@param client vim.lsp.Client
---@param opts {fallback: boolean, debounce_ms: integer, group: integer}
function M.attach(bufnr, client, opts)
  M.detach(bufnr)
  local state = { fallback = opts.fallback } ---@type llada.GhostBuffer
  buffers[bufnr] = state
  if opts.fallback then
    state.timer = assert(vim.uv.new_timer())
  end
  api.nvim_create_autocmd({ 'TextChangedI', 'CursorMovedI' }, {
    group = opts.group,
    buffer = bufnr,
    callback = function()
      M.keep_typed_through(bufnr)
      if state.timer then
        state.timer:start(opts.debounce_ms, 0, vim.schedule_wrap(function()
          if api.nvim_buf_is_valid(bufnr) and buffers[bufnr] == state then
            request(bufnr, client)
          end
        end))
      end
    end,
  })
  api.nvim_create_autocmd('InsertLeave', {
    group = opts.group,
    buffer = bufnr,
    callback = function()
      if state.timer then
        state.timer:stop()
        cancel(state)
      end
      M.clear(bufnr)
    end,
  })
end

--- After a keystroke: the fallback completer's ghost text stays on screen, trimmed, while the user types
--- the start of it (the revised answer replaces it); anything else clears it. With the built-in
--- completer, which trims its own answer, the plugin's draft is cleared, and the rest of a partly
--- accepted suggestion (an answer) is kept as on the fallback path.
---@param bufnr integer
function M.keep_typed_through(bufnr)
  local state = buffers[bufnr]
  local item = state and state.item
  local win = M.insert_window(bufnr)
  local rest
  if item and win and (state.fallback or item.kind == 'answer') then
    local cursor = api.nvim_win_get_cursor(win)
    rest = through.rest(item, api.nvim_get_current_line(), { cursor[1] - 1, cursor[2] })
    if rest == item.text then
      if api.nvim_buf_get_changedtick(bufnr) == item.tick then
        return -- the same text at the same place (the second event of one keystroke)
      end
      -- Nothing typed on its line, yet the text changed (an empty line below joined by Delete): not
      -- typing through. Kept, it would stay drawn while accept() refuses it (made for an older text).
      rest = nil
    end
  end
  if rest then
    local cursor = api.nvim_win_get_cursor(win)
    M.show(bufnr, cursor[1] - 1, cursor[2], rest, item.kind)
  else
    M.clear(bufnr)
  end
end

---@param bufnr integer
function M.detach(bufnr)
  local state = buffers[bufnr]
  if not state then
    return
  end
  buffer.close_timer(state)
  cancel(state)
  M.clear(bufnr)
  buffers[bufnr] = nil
end

--- Inserts the shown ghost text (a draft or an answer) at its place (the cursor, or past the rest of the
--- word the cursor is in) and moves the cursor past it; with
--- {take}, only its first take(text) bytes (the next word or line, llada.partial), and the rest stays
--- shown after the cursor as an answer, which typing through keeps on screen on either path.
--- Returns what it accepted from, or nil (and does nothing) when no ghost text is shown for the current
--- text and cursor, so a mapping can fall back to its key. The edit itself is scheduled: this runs
--- inside an <expr> mapping, where the text is locked.
---@param bufnr integer
---@param take? fun(text: string): integer
---@return "draft"|"answer"|nil
function M.accept(bufnr, take)
  local state = buffers[bufnr]
  local item = state and state.item
  local win = M.insert_window(bufnr)
  if
    not item
    or not win
    or api.nvim_buf_get_changedtick(bufnr) ~= item.tick
    or not vim.deep_equal(api.nvim_win_get_cursor(win), { item.row + 1, item.at })
  then
    return nil
  end
  vim.schedule(function()
    if not api.nvim_buf_is_valid(bufnr) or api.nvim_buf_get_changedtick(bufnr) ~= item.tick then
      return
    end
    M.accept_text(bufnr, win, { item.row + 1, item.col }, item.text, take)
  end)
  return item.kind
end

--- Inserts {text} (all of it, or its first take(text) bytes) at {cursor} of {win} and shows the rest
--- after it: what the accept keys do with the ghost text, whoever drew it.
---@param bufnr integer
---@param win integer
---@param cursor [integer, integer] (1-based row, byte col)
---@param text string
---@param take? fun(text: string): integer
function M.accept_text(bufnr, win, cursor, text, take)
  M.clear(bufnr)
  local n = take and take(text) or #text
  local row, col = through.insert(bufnr, win, cursor, text:sub(1, n))
  if n < #text then
    M.show(bufnr, row, col, text:sub(n + 1), 'answer')
  end
end

return M
