--- What the plugin lets reach Neovim 0.12's built-in completer (vim.lsp.inline_completion): answers only
--- for the text, cursor and buffer they were asked for, items only with a range the line has, and never
--- an item kept past the text it fits. The built-in completer keeps its last item across keystrokes and
--- draws it again at each cursor move from the range it was answered with: after a Backspace that range
--- starts past the end of the shorter line, and drawing it fails on that key and every later one
--- ("Invalid 'col': out of range"). Its autocommands are not buffer-local either: a key in one buffer
--- draws (and asks for) the item of another, at this window's cursor.
---
--- The guard reaches into the completer's class (`vim.lsp._capability`), which Neovim does not promise;
--- where it is not found, available() is false and buffers use the plugin's own ghost text.
local api = vim.api
local through = require('llada.through')
local insert_window = require('llada.ghost').insert_window -- the current window, if in insert mode

local M = {}

local INLINE = 'textDocument/inlineCompletion'

---@class llada.HandedItem
---@field text string
---@field row integer 0-based
---@field col integer 0-based byte column where the item's range starts (the cursor when it was asked)
---@field end_col integer byte column where the range ends (the word's end inside a word)
---@field line string the line then

--- Per buffer: the client and the items of the last answer handed to the built-in completer.
local handed = {} ---@type table<integer, {client_id: integer, items: llada.HandedItem[]}>

---@return table? Completor the built-in completer's class, when it has what the guard needs
local function completor_class()
  if not vim.lsp.inline_completion then
    return nil
  end
  local ok, capability = pcall(require, 'vim.lsp._capability')
  local class = ok and type(capability) == 'table' and type(capability.all) == 'table' and capability.all.inline_completion
  if
    type(class) == 'table'
    and type(class.show) == 'function'
    and type(class.hide) == 'function'
    and type(class.active) == 'table'
  then
    return class
  end
end

---@param value string|{value: string}
---@return string
local function text_of(value)
  return type(value) == 'table' and value.value or value
end

--- Whether the built-in completer's current item of {completor} is still one to draw: ours are, when
--- the buffer is the current one in insert mode and its line is the line the item was answered for with
--- at most the start of the item typed since at its place, the cursor after it (the completer then
--- draws the rest). An item inside a word (its range replaces the word's rest) fits only the unchanged
--- line with the cursor at its place. Other clients' items are left to Neovim.
---@param completor table
---@return boolean
local function fits(completor)
  local current = completor.current
  if not current then
    return true
  end
  local client = vim.lsp.get_client_by_id(current.client_id)
  if not client or client.name ~= 'llada' then
    return true
  end
  local bufnr = completor.bufnr
  local win = bufnr and api.nvim_buf_is_valid(bufnr) and insert_window(bufnr)
  local answer = handed[bufnr]
  if not win or not answer or answer.client_id ~= current.client_id then
    return false
  end
  local text = text_of(current.insert_text)
  local cursor = api.nvim_win_get_cursor(win)
  local line = api.nvim_get_current_line()
  for _, item in ipairs(answer.items) do
    if item.text == text then
      if item.end_col > item.col then
        return line == item.line and cursor[1] - 1 == item.row and cursor[2] == item.col
      end
      return through.rest(item, line, { cursor[1] - 1, cursor[2] }) ~= nil
    end
  end
  return false
end

---@param completor table
local function drop(completor)
  completor.current = nil
  completor:hide()
end

local installed = false

--- Whether the built-in completer can be used, guarded: Neovim 0.12's vim.lsp.inline_completion with the
--- class the guard wraps. Installs the guard the first time.
---@return boolean
function M.available()
  local class = completor_class()
  if not class then
    return false
  end
  if not installed then
    installed = true
    local show = class.show
    -- Every draw of the completer goes through show() (an answer, a key, a cursor move, select()).
    class.show = function(self, ...)
      if not fits(self) then
        drop(self)
        return
      end
      return show(self, ...)
    end
  end
  return true
end

--- Drops the built-in completer's item of {bufnr} when it no longer fits the text or the cursor (a key
--- that changed the text without moving the cursor, as Delete, draws nothing, and an accept would use
--- the item's range as it was).
---@param bufnr integer
function M.check(bufnr)
  local class = completor_class()
  local completor = class and class.active[bufnr]
  if completor and completor.current and not fits(completor) then
    drop(completor)
  end
end

---@param bufnr integer
function M.forget(bufnr)
  handed[bufnr] = nil
end

--- Where an inline request is asked from: the buffer of {uri} must be the current one, in insert mode,
--- with the cursor at {position}. The built-in completer asks for every buffer it knows at each key,
--- with the current window's cursor, and after the user left insert mode (its timer runs on).
---@param uri string
---@param position lsp.Position
---@param encoding string
---@return {bufnr: integer, tick: integer, row: integer, col: integer, line: string}?
local function asked_from(uri, position, encoding)
  local bufnr = vim.uri_to_bufnr(uri)
  local win = api.nvim_buf_is_valid(bufnr) and insert_window(bufnr)
  if not win then
    return nil
  end
  local cursor = api.nvim_win_get_cursor(win)
  local line = api.nvim_get_current_line()
  if position.line ~= cursor[1] - 1 or position.character ~= vim.str_utfindex(line, encoding, cursor[2], false) then
    return nil
  end
  return { bufnr = bufnr, tick = api.nvim_buf_get_changedtick(bufnr), row = cursor[1] - 1, col = cursor[2], line = line }
end

--- Whether the buffer, its text, the mode and the cursor are still those {asked} recorded.
---@param asked {bufnr: integer, tick: integer, row: integer, col: integer}
---@return boolean
local function unchanged(asked)
  local win = api.nvim_buf_is_valid(asked.bufnr) and insert_window(asked.bufnr)
  return win ~= nil
    and api.nvim_buf_get_changedtick(asked.bufnr) == asked.tick
    and vim.deep_equal(api.nvim_win_get_cursor(win), { asked.row + 1, asked.col })
end

--- The items of {result} that can be drawn at the place {asked} recorded: text, and a range (where
--- there is one) on that line, from the cursor to at most the line's end.
---@param result table
---@param asked {row: integer, col: integer, line: string}
---@param encoding string
---@return lsp.InlineCompletionItem[] items
---@return llada.HandedItem[] kept what each kept item is, in bytes
local function valid_items(result, asked, encoding)
  local items, kept = {}, {}
  local line = asked.line
  local at = vim.str_utfindex(line, encoding, asked.col, false)
  local width = vim.str_utfindex(line, encoding, #line, false)
  for _, item in ipairs(result.items or result) do
    local text = type(item) == 'table' and item.insertText and text_of(item.insertText)
    local r = type(item) == 'table' and item.range
    local ok = type(text) == 'string'
    local end_col = asked.col
    if ok and r then
      ok = r.start.line == asked.row
        and r.start.character == at
        and r['end'].line == asked.row
        and r['end'].character >= at
        and r['end'].character <= width
      end_col = ok and vim.str_byteindex(line, encoding, r['end'].character, false) or end_col
    end
    if ok then
      items[#items + 1] = item
      kept[#kept + 1] = { text = text, row = asked.row, col = asked.col, end_col = end_col, line = line }
    end
  end
  return items, kept
end

--- Wraps {client}'s request() so that every inline request, whoever sends it (the built-in completer or
--- the plugin's own), is sent only from where the user is, and its answer reaches its handler only while
--- the text and the cursor are still those it was asked for, with the items that fit there. A failed
--- request runs {on_failure}(bufnr) after its handler. Cancelled requests never reach a handler.
---@param client vim.lsp.Client
---@param on_failure fun(bufnr: integer)
function M.guard_requests(client, on_failure)
  local request = client.request
  function client.request(self, method, params, handler, ...)
    if method ~= INLINE or not handler or type(params) ~= 'table' or not params.textDocument then
      return request(self, method, params, handler, ...)
    end
    local asked = asked_from(params.textDocument.uri, params.position, self.offset_encoding)
    if not asked then
      return false, nil -- nobody is at that place: nothing to ask
    end
    local on_reply = handler
    handler = function(err, result, ctx)
      if err then
        on_reply(err, result, ctx)
        if api.nvim_buf_is_valid(asked.bufnr) then
          on_failure(asked.bufnr)
        end
        return
      end
      if not unchanged(asked) then
        return -- an answer for an older text or another place: the request for the new one follows
      end
      local items, kept = valid_items(result or {}, asked, self.offset_encoding)
      handed[asked.bufnr] = { client_id = self.id, items = kept }
      return on_reply(err, { items = items }, ctx)
    end
    return request(self, method, params, handler, ...)
  end
end

return M
